"""A result folder knows the experiment it holds (harness.identity): a command with another model, GPU, engine
setting, baseline or data refuses to write into it (or takes a new folder when asked), a second writer is
turned away, bad out= folders are named, and the committed folders still resume."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from harness.store import Store
from tests.test_sweep import ROOT, cli

QUICK = ["sweep", "sweep=quick", "gpu=h200", "engine=sim", "workload=spec_bench", "concurrency=[2]",
         "report=false"]


def _state(out: Path) -> tuple[str, dict[str, bytes]]:
    """sweep.json and every point's summary.json, byte for byte."""
    return ((out / "sweep.json").read_text(),
            {p.name: (p / "summary.json").read_bytes() for p in sorted((out / "points").iterdir())})


def test_another_model_and_gpu_into_a_folder_are_refused_and_nothing_is_relabelled(tmp_path, capsys):
    out = tmp_path / "s"
    assert cli(capsys, *QUICK, f"out={out}").returncode == 0
    before = _state(out)
    r = cli(capsys, *QUICK, "model=qwen35_9b", "gpu=h100", f"out={out}")
    assert r.returncode == 2
    assert "holds another experiment" in r.stderr and 'model.name: "qwen35_35b" -> "qwen35_9b"' in r.stderr
    assert 'gpu.name: "h200" -> "h100"' in r.stderr and "identity_mismatch=new_folder" in r.stderr
    assert _state(out) == before
    assert json.loads((out / "sweep.json").read_text())["model"] == "qwen35_35b"
    # asked for, the new experiment takes the next free folder
    r = cli(capsys, *QUICK, "model=qwen35_9b", "gpu=h100", f"out={out}", "identity_mismatch=new_folder")
    assert r.returncode == 0 and f"writing into {out}-2" in r.stdout
    assert _state(out) == before
    assert json.loads((tmp_path / "s-2" / "sweep.json").read_text())["identity"]["model"]["name"] == "qwen35_9b"
    summary = json.loads(next((tmp_path / "s-2" / "points").glob("*/summary.json")).read_text())
    assert summary["identity"]["model"]["name"] == "qwen35_9b" and summary["identity"]["hash"]


def test_compare_reads_read_only_folders_writes_nowhere_and_names_what_the_two_setups_differ_in(tmp_path, capsys):
    """compare once wrote analysis.json into both folders (a read-only one failed) and compared a 35B run with a
    9B run without a word: now it writes nothing, and names the model, the GPU and every other identity setting
    the two experiments differ in. (Root ignores the read-only bits: the folders are compared file by file and
    byte by byte, so a file compare added or changed fails the test either way.)"""
    import os
    import stat

    a, b = tmp_path / "a", tmp_path / "b"
    assert cli(capsys, *QUICK, f"out={a}").returncode == 0
    assert cli(capsys, *QUICK, "model=qwen35_9b", "max_num_seqs=64", f"out={b}").returncode == 0
    files = [p for d in (a, b) for p in d.rglob("*")]
    for p in sorted(files, key=lambda p: -len(p.parts)) + [a, b]:       # read-only, folders last
        p.chmod(p.stat().st_mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))
    before = {p: p.read_bytes() for p in files if p.is_file()}
    try:
        r = cli(capsys, "compare", str(a), str(b))
        assert r.returncode == 0, r.stderr
        assert {p: p.read_bytes() for d in (a, b) for p in d.rglob("*") if p.is_file()} == before
        assert 'different setups (model qwen35_35b vs qwen35_9b)' in " ".join(r.stdout.split()), r.stdout
        assert "run.max_num_seqs" in r.stdout, r.stdout
        same = cli(capsys, "compare", str(a), str(a))
        assert same.returncode == 0 and "different setups" not in same.stdout and "differ in" not in same.stdout
    finally:
        for p in [a, b, *files]:
            if p.exists() and not p.is_symlink():
                p.chmod(p.stat().st_mode | stat.S_IWUSR)
    assert os.access(a, os.W_OK)


@pytest.mark.parametrize("override, field", [
    ("engine.efficiency.bandwidth=0.5", "engine.settings.efficiency.bandwidth"),
    ("seed=1", "run.seed"),
    ("max_num_seqs=64", "run.max_num_seqs"),
    ("baseline=treewy", "analysis.baseline"),
    ("workload.filters.max_prompt_len=512", "workloads.spec_bench.settings.filters"),
    ("strategies.store_all.fork=depth", "strategies.store_all.fork"),   # a run option: not in the point id
])
def test_a_setting_that_changes_results_is_part_of_the_identity(tmp_path, capsys, override, field):
    out = tmp_path / "s"
    assert cli(capsys, *QUICK, f"out={out}").returncode == 0
    r = cli(capsys, *QUICK, override, f"out={out}")
    assert r.returncode == 2 and f"{field}:" in r.stderr


def test_operational_settings_and_the_command_s_own_are_not(tmp_path, capsys):
    out = tmp_path / "s"
    assert cli(capsys, *QUICK, f"out={out}").returncode == 0
    r = cli(capsys, *QUICK, "engine.kv_usage_samples=50", "retry_failed=false", "time_budget_s=null",
            f"out={out}")
    assert r.returncode == 0 and "0 to run" in r.stdout


def test_the_data_behind_a_workload_is_hashed(tmp_path, capsys):
    data = tmp_path / "question.jsonl"
    shutil.copy(ROOT / "workloads" / "data" / "spec_bench" / "question.jsonl", data)
    out = tmp_path / "s"
    assert cli(capsys, *QUICK, f"workload.path={data}", f"out={out}").returncode == 0
    lines = data.read_text().splitlines()
    data.write_text("\n".join(lines[:-40]) + "\n")            # the same path, other questions
    r = cli(capsys, *QUICK, f"workload.path={data}", f"out={out}")
    assert r.returncode == 2 and "workloads.spec_bench.source_sha256" in r.stderr


def test_a_grid_that_grows_with_the_same_identity_resumes_and_sweep_json_lists_every_point(tmp_path, capsys):
    out = tmp_path / "s"
    assert cli(capsys, *QUICK, "strategy=[store_all,treewy]", f"out={out}").returncode == 0
    r = cli(capsys, *QUICK, "strategy=[store_all,replay]", "concurrency=[2,4]", f"out={out}")
    assert r.returncode == 0 and "4 points, 1 already in" in r.stdout     # store_all at c2
    sweep = json.loads((out / "sweep.json").read_text())
    assert sweep["strategy"] == ["store_all", "treewy", "replay"] and sweep["concurrency"] == [2, 4]
    points = {s["point_id"] for s in Store(out).summaries()}
    assert len(points) == 5          # c2: store_all, treewy, replay; c4: store_all, replay


def test_a_second_writer_is_turned_away_naming_the_first(tmp_path, capsys):
    out = tmp_path / "s"
    with Store(out).lock("test holder"):
        r = cli(capsys, *QUICK, f"out={out}")
    assert r.returncode == 2 and "test holder" in r.stderr and "is writing into this folder" in r.stderr
    assert not (out / "points").exists()
    assert cli(capsys, *QUICK, f"out={out}").returncode == 0     # released: the next command runs


def test_an_out_that_is_a_file_or_cannot_be_written_is_named(tmp_path, capsys):
    f = tmp_path / "file"
    f.write_text("keep me")
    r = cli(capsys, *QUICK, f"out={f}")
    assert r.returncode == 2 and f"out={f}: a file, not a folder" in r.stderr and f.read_text() == "keep me"
    r = cli(capsys, *QUICK, "out=/proc/self/commitbench")      # unwritable even for root
    assert r.returncode == 2 and "out=/proc/self/commitbench: cannot write there" in r.stderr


def test_committed_folders_without_an_identity_resume_through_their_points(tmp_path, capsys):
    from omegaconf import OmegaConf

    from harness.grid import compose_sweep, point_configs
    from harness.identity import differences, sweep_identity

    folder = ROOT / "results" / "h200-kernel-speed" / "e2e" / "capture2048"
    assert "identity" not in json.loads((folder / "sweep.json").read_text())
    c = OmegaConf.to_container(compose_sweep(["sweep=h200_kernel_speed", "engine=vllm"]), resolve=True)
    held = Store(folder).identity()
    assert held["engine"]["name"] == "vllm" and held["model"]["name"] == "qwen35_35b"
    assert "source_sha256" not in held["workloads"]["sharegpt"]     # never recorded: not compared
    # the campaign's own settings (its requests come from an export the GPU host carries, not in a clone)
    now = sweep_identity(point_configs(c), c["baseline"], c["thresholds"], c["requests"])
    assert differences({k: v for k, v in held.items() if k != "workloads"}, now) == []
    # the campaign's own command: no difference but the export (resumes); a simulator run into a copy: refused
    copy = tmp_path / "capture2048"
    shutil.copytree(folder, copy)
    r = cli(capsys, "sweep", "sweep=h200_kernel_speed", "engine=sim", "report=false", f"out={copy}")
    assert r.returncode == 2 and 'engine.name: "vllm" -> "sim"' in r.stderr


# -- provenance where the code travelled without its .git -----------------------------------------------------

def test_a_staged_checkout_records_the_commit_it_is_and_says_when_it_is_not(tmp_path, monkeypatch):
    """The GPU host gets the working tree without .git: stage_harness.sh records HEAD and its file list in
    .devrun/, and provenance reports that commit there, with -dirty once a file differs (the kernel results
    once recorded 598b26b-dirty while their README named 957d1db: nothing had set COMMITBENCH_GIT_COMMIT)."""
    import subprocess

    from harness.provenance import _staged, git_commit

    monkeypatch.delenv("COMMITBENCH_GIT_COMMIT", raising=False)
    repo = tmp_path / "repo"
    (repo / "pkg").mkdir(parents=True)
    (repo / "pkg" / "a.py").write_text("x = 1\n")
    (repo / "b.txt").write_text("b\n")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(repo)]
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "one"], check=True)
    head = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    stage = ROOT / "harness" / "engines" / "vllm" / "stage_harness.sh"
    out = subprocess.run(["bash", str(stage), "commit"], cwd=repo, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert (repo / ".devrun" / "commit").read_text().strip() == head
    assert "/.devrun/" in (repo / ".git" / "info" / "exclude").read_text()      # never committed by accident
    host = tmp_path / "host"                        # what the device gets: the files, no .git
    shutil.copytree(repo, host, ignore=shutil.ignore_patterns(".git"))
    assert git_commit(host) == head
    (host / "pkg" / "a.py").write_text("x = 2\n")
    _staged.cache_clear()
    assert git_commit(host) == head + "-dirty"
    (host / "pkg" / "a.py").write_text("x = 1\n")
    (host / "b.txt").unlink()
    _staged.cache_clear()
    assert git_commit(host) == head + "-dirty"
    shutil.rmtree(host / ".devrun")
    _staged.cache_clear()
    assert git_commit(host) is None                 # nothing staged: unknown, never a guess
    monkeypatch.setenv("COMMITBENCH_GIT_COMMIT", "abc123")
    assert git_commit(host) == "abc123"             # set by hand: it wins
    monkeypatch.delenv("COMMITBENCH_GIT_COMMIT")
    (repo / "b.txt").write_text("changed\n")        # staged from a dirty tree: says so
    subprocess.run(["bash", str(stage), "commit"], cwd=repo, capture_output=True, text=True, timeout=60, check=True)
    assert (repo / ".devrun" / "commit").read_text().strip() == head + "-dirty"
    _staged.cache_clear()
    assert git_commit(repo) == head + "-dirty"
    # a host whose copy of .git is stale (results/kernels/ once read 598b26b-dirty for 957d1db's code): the
    # staged commit, whose files are all here unchanged, wins over git's HEAD
    subprocess.run([*git, "commit", "-qam", "two"], check=True)
    two = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    subprocess.run(["bash", str(stage), "commit"], cwd=repo, capture_output=True, text=True, timeout=60, check=True)
    stale = tmp_path / "stale"
    shutil.copytree(repo, stale)
    subprocess.run(["git", "-C", str(stale), "reset", "-q", "--soft", "HEAD~1"], check=True)
    _staged.cache_clear()
    assert git_commit(stale) == two
    (stale / "pkg" / "a.py").write_text("x = 3\n")  # ... and once a file differs, the nearer of the two: the
    _staged.cache_clear()                           # staged commit (a.py differs) over the stale HEAD (a.py, b.txt)
    assert git_commit(stale) == two + "-dirty"      # (the H100 tree-memory runs once read eafe669-dirty for b394d1a)
    (stale / "b.txt").write_text("b\n")             # the files back to HEAD's: one differs from the staged commit
    (stale / "pkg" / "a.py").write_text("x = 1\n")  # (b.txt), one from git's (its index, left at two's by the
    _staged.cache_clear()                           # soft reset): a tie goes to git
    assert git_commit(stale) == head + "-dirty"
