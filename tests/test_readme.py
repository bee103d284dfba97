"""Every command the README shows works as written.

The cheap ones run, in a scratch folder, exactly as the README writes them. The rest need a GPU, a cluster, a
dataset this machine cannot reach or minutes of work: they compose and validate as written instead (``--cfg``:
the same checks the command makes before its first point, grids expanded), or, for the scripts outside the
``harness`` CLI, parse their arguments. A command the README gains is in neither table until someone decides how
to check it: ``test_every_readme_command_is_checked`` fails and says so.
"""

from __future__ import annotations

import contextlib
import io
import itertools
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"


def readme_commands(text: str) -> list[str]:
    """The commands in the README, in its order, each as one line: every line of a ```bash block (a trailing
    backslash continues it; ``&&`` separates commands on one line) and every inline ```python -m ...```."""
    lines = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        lines += [line for line in block.replace("\\\n", " ").splitlines() if line.strip()]
    lines += re.findall(r"`(python -m [^`]*)`", text)
    commands = []
    for line in lines:
        words = shlex.split(line, comments=True)
        for is_sep, group in itertools.groupby(words, key=lambda w: w == "&&"):
            if not is_sep:
                commands.append(shlex.join(group))
    return list(dict.fromkeys(commands))


# Run as written in the scratch folder (the fixture makes what they read: a sweep folder, a BurstGPT CSV).
RUN = {
    "python -m harness --help",
    "python -m harness memory",
    "python -m harness memory model=qwen35_397b",
    "python -m harness memory 'drafts=[[1,1,1],[2,2,2],chain:7]' format=json",
    "python -m harness memory strategies.replay.buffer_len=32",
    "python -m harness memory --cfg",
    "python -m harness memory model=qwen35_9b 'drafts=[chain:5,[2,2,2],[3,3,3]]'",
    "python -m harness sweep gmu=0.6,0.75,0.9 strategy=store_all,treewy workload=sharegpt out=results/sweeps/mine",
    "python -m harness run workload=sharegpt gmu=0.6 concurrency=64 strategy=treewy",
    "python -m harness analyze results/sweeps/mine",
    "python -m harness analyze results/sweeps/mine slo.ttft_ms=500",
    "python -m harness report results/sweeps/mine",
    "python -m harness report results/sweeps/a results/sweeps/b baseline=store_all out=results/sweeps/ab",
    "python -m harness compare results/sweeps/a results/sweeps/b",
    "python -m harness analyze results/sweeps/grid",
    "python -m harness report results/sweeps/grid",
    "python -m harness workloads export workload=sharegpt out=sharegpt.jsonl",
    "python -m harness workloads export workload=sharegpt out=sg.jsonl",
    "python -m harness workloads describe workload=sharegpt",
    "python -m harness workloads describe workload=burstgpt workload.path=BurstGPT_1.csv "
    "workload.arrival.kind=trace workload.arrival.rate=2",
    "python -m harness report results/kernels",
    "python -m harness calibrate results/h200-kernel-speed/e2e/capture2048 "
    "layer=results/h200-kernel-speed/layer-fd1310b.json split=concurrency out=/tmp/commitbench-calibration.yaml",
    "python -m harness.engines.vllm.model_dir conf/model/qwen35_35b.yaml /tmp/qwen35-35b",
}

# Composed and validated as written (--cfg), with why they do not run here.
COMPOSE_ONLY = {
    "python -m harness sweep model=qwen35_35b gmu=0.6": "the main job: 90 simulator points (about a minute)",
    "python -m harness sweep sweep=paper_35b gpu=b200 engine.mode=graphs": "the paper's whole 35B grid",
    "python -m harness sweep sweep=paper_trees": "a grid of draft trees (minutes)",
    "python -m harness sweep sweep=h200x8_397b engine=sim": "the 397B grid",
    "python -m harness sweep sweep=h200_35b_campaign gmu=0.75 concurrency=128 --cfg": "prints a config (vLLM: a GPU)",
    "python -m harness bench sim scale=397b gpu=h200 'gmu=[0.75,0.9,0.951]'": "times the paper's grid (minutes)",
    "python -m harness bench strategies": "a CPU benchmark (minutes)",
    "python -m harness bench strategies batch=8 dtype=float64 out=results/bench-strategies.json":
        "a CPU benchmark (about 6 minutes)",
    "python -m harness bench kernels": "needs a CUDA GPU",
    "python -m harness bench kernels out=results/kernels/h200.json": "needs a CUDA GPU",
    "python -m harness bench kernels smoke=true": "runs in tests/test_kernels.py::test_bench_kernels_smoke_and_report",
    "python -m harness bench loadgen": "a 20 s load test; tests/test_loadgen.py drives the same generator",
    "python -m harness bench workloads": "times a cold load of all of ShareGPT",
    "python -m harness sweep sweep=ci_vllm": "starts vLLM; tests/test_vllm_sweep.py runs this grid",
    "python -m harness sweep engine=vllm workload=sharegpt gmu=0.6 concurrency=16,64,128,256 "
    "strategy=store_all,treewy": "the 35B on vLLM: needs a GPU",
    "python -m harness sweep sweep=h200_35b requests_from.sharegpt=sharegpt.jsonl": "the 35B on vLLM: needs a GPU",
    "python -m harness check-acceptance": ".ci/run runs the gate after the tests",
    "python -m harness acceptance vllm":
        ".ci/run runs the in-engine gate after the tests (about 90 s, beside the toy gate)",
    "python -m harness acceptance vllm fault=commit_off_by_one 'strategy=[store_all,treewy]'":
        "tests/test_vllm_acceptance.py::test_the_gate_catches_a_wrong_commit runs each fault",
    "python -m harness sweep sweep=trained_qwen3next gpu=cpu engine.kv_cache_bytes=268435456 "
    "engine.gdn_prefill_backend=null": "ten vLLM points on the trained model (about 6 minutes on two cores)",
    "python -m harness checkpoints out=results/fork-checkpoint": "~30 s of two models' decoding; "
        "tests/test_fork_checkpoint.py runs it on a few prompts",
    "python -m harness check-acceptance 'strategy=[store_delta]' strategies.store_delta.codec=fp8_e4m3":
        "the toy gate (~40 s), failing as it should; results/fork-checkpoint/gate-lossy/ holds its output",
    "python -m harness bench kernels 'sections=[forks]'": "needs a CUDA GPU; test_bench_kernels_smoke_and_report "
        "runs the section",
    "python -m harness acceptance train": "about 6 minutes of training; tests/test_vllm_acceptance.py checks the "
        "training is seeded on a tiny run",
}

# Outside the harness CLI: checked by what they are.
HYDRA_JOBS = {   # python -m harness.point --multirun: every job of the grid composes (launcher config included)
    "python -m harness.point --multirun hydra/launcher=joblib workload=sharegpt gmu=0.6,0.9 "
    "strategy=store_all,treewy concurrency=8,64 out=results/sweeps/grid",
    "python -m harness.point --multirun hydra/launcher=submitit_slurm hydra.launcher.partition=gpu "
    "hydra.launcher.timeout_min=60 workload=sharegpt gmu=0.6,0.75,0.9 strategy=store_all,treewy "
    "concurrency=1,8,32,64,128,256 out=/shared/sweeps/grid",
}
OTHER = {
    # the GPU run of the offline engine: its arguments parse
    "python -m harness.engines.vllm.offline --model-dir /tmp/qwen35-35b --strategy treewy --num-spec 3 "
    "--acceptance-rates 0.90,0.75,0.59 --gmu 0.6 --prompts 256 --prompt-len 1024 --output-len 256": "parse",
    # opens headless Chromium: runs where it and selenium are installed
    "python -m reports.browser_check results/sweeps/mine": "browser",
    # the server vLLM ships, named in the prose: the module exists where vLLM is installed
    "python -m vllm.entrypoints.openai.api_server": "module",
    # this test run itself
    "python -m pytest -q -n 2 --dist loadfile": "self",
}
INSTALL = re.compile(r"^(python3 -m venv|\. \.venv/bin/activate|pip install)")

COMMANDS = readme_commands(README.read_text())


def _normal(cmd: str) -> str:
    return shlex.join(shlex.split(cmd))


def test_the_readme_parser_finds_the_commands():
    got = readme_commands("text `python -m harness memory` more\n```bash\npython -m a x=1 \\\n    y=2   # why\n"
                          "pip install z && python -m b\n```\n")
    assert got == ["python -m a x=1 y=2", "pip install z", "python -m b", "python -m harness memory"]
    assert len(COMMANDS) > 30      # the README's blocks were found at all


def test_every_readme_command_is_checked():
    known = {_normal(c) for c in RUN | set(COMPOSE_ONLY) | HYDRA_JOBS | set(OTHER)}
    missing = [c for c in COMMANDS if c not in known and not INSTALL.match(c)]
    assert not missing, ("README commands no test checks; add each to RUN (cheap: runs here) or COMPOSE_ONLY "
                         f"(with why) in tests/test_readme.py: {missing}")
    stale = sorted(known - set(COMMANDS))
    assert not stale, f"tests/test_readme.py checks commands the README no longer has: {stale}"


def test_the_install_lines_are_ci_s_and_pin_torch():
    """The README's two first commands: the second is what .ci/run runs; both pin torch (a CPU build here) and
    install extras and requirement files that exist."""
    first_block = re.search(r"```bash\n(.*?)```", README.read_text(), re.S).group(1).strip().splitlines()
    assert len(first_block) == 2 and first_block[0].endswith("python -m harness sweep model=qwen35_35b gmu=0.6")
    assert first_block[1] in (ROOT / ".ci" / "run").read_text()
    pyproject = (ROOT / "pyproject.toml").read_text()
    for line in first_block:
        assert "pip install torch==2.13.0" in line
        for extra in re.findall(r"-e '\.\[(\w+)\]'", line):
            assert re.search(rf"^{extra} = \[", pyproject, re.M), f"pyproject has no extra {extra!r}"
        for req in re.findall(r"-r (\S+)", line):
            assert (ROOT / req).is_file(), req


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    """A folder to run the README's commands in, as a user's checkout would be: conf/ (the model_dir command
    names conf/model/...), the kernels' JSON (report results/kernels), the H200 runs calibrate fits, a BurstGPT CSV in its 8-column layout
    (the describe command's workload.path), the README's own sweep into results/sweeps/mine, and copies of it
    where the README names other folders (a, b to compare; grid, which its Hydra launchers would fill)."""
    d = tmp_path_factory.mktemp("readme")
    (d / "conf").symlink_to(ROOT / "conf")
    shutil.copytree(ROOT / "results" / "kernels", d / "results" / "kernels",
                    ignore=shutil.ignore_patterns("*.html"))
    # the H200 runs and layer profile the README's calibrate command fits
    (d / "results" / "h200-kernel-speed").symlink_to(ROOT / "results" / "h200-kernel-speed")
    (d / "BurstGPT_1.csv").write_text(
        "Timestamp,Session ID,Elapsed time,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
        + "".join(f"{t},s{t % 3},0.5,{'GPT-4' if t % 2 else 'ChatGPT'},{40 + t % 700},{20 + t % 300},{60 + t % 700 + t % 300},"
                  f"Conversation log\n" for t in range(2500)))    # 1250 GPT-4 rows: the default 1000 fit
    sweep = "python -m harness sweep gmu=0.6,0.75,0.9 strategy=store_all,treewy workload=sharegpt out=results/sweeps/mine"
    first = _run(sweep, d)
    for name in ("a", "b", "grid"):
        if (d / "results" / "sweeps" / "mine").is_dir():
            shutil.copytree(d / "results" / "sweeps" / "mine", d / "results" / "sweeps" / name)
    # b differs from a in one known place, so that compare has something to find: its first treewy point's
    # requests each asked for and returned twice the tokens in the same time, so its throughput is 2x
    # (a copy compared with itself would pass a compare that printed 1.00 everywhere)
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    for summary in sorted((d / "results" / "sweeps" / "b").glob("points/*/summary.json")):
        point = json.loads(summary.read_text())
        if point["status"] == "ok" and point["config"]["strategy"] == "treewy":
            table = pq.read_table(summary.parent / "requests.parquet")
            for col in ("output_tokens", "output_len"):
                table = table.set_column(table.schema.get_field_index(col), col,
                                         pc.multiply(table[col], 2).cast(table.schema.field(col).type))
            pq.write_table(table, summary.parent / "requests.parquet")
            break
    return d, {sweep: first}


def _run(cmd: str, cwd: Path) -> subprocess.CompletedProcess:
    """``cmd`` as written, run in ``cwd``: ``python -m harness ...`` through the CLI's ``main`` in this process
    (what ``python -m harness`` calls, without an interpreter start and imports each time), anything else in
    a new interpreter."""
    argv = shlex.split(cmd)
    assert argv[:2] == ["python", "-m"]
    if argv[2] != "harness":
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        return subprocess.run([sys.executable, *argv[1:]], cwd=cwd, capture_output=True, text=True, timeout=600,
                              env=env)
    from harness.cli import main

    out, err, here = io.StringIO(), io.StringIO(), os.getcwd()
    try:
        os.chdir(cwd)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                rc = main(argv[3:])
            except SystemExit as e:          # argparse's --help
                rc = e.code or 0
    finally:
        os.chdir(here)
    return subprocess.CompletedProcess(argv, rc, out.getvalue(), err.getvalue())


@pytest.mark.parametrize("cmd", [c for c in COMMANDS if c in {_normal(r) for r in RUN}])
def test_readme_command_runs(cmd, scratch):
    folder, ran = scratch
    compared = [folder / "results" / "sweeps" / name for name in ("a", "b")] if " compare " in cmd else []
    for d in compared:     # as folders analysed by older code: compare must leave what they hold as it is
        (d / "analysis.json").unlink(missing_ok=True)
    before = {p: p.read_bytes() for d in compared for p in d.rglob("*") if p.is_file()}
    out = ran.get(cmd) or _run(cmd, folder)
    assert out.returncode == 0, f"{cmd}\n{out.stdout[-1500:]}\n{out.stderr[-3000:]}"
    assert {p: p.read_bytes() for d in compared for p in d.rglob("*") if p.is_file()} == before, \
        "compare wrote into the folders it compared"
    if compared:     # two copies of one sweep but for b's one treewy throughput: every point in common, that
        # one point at 2.00x, the rest at 1.00x (the classification comes from store_all's points: it agrees)
        n = int(re.search(r"(\d+) common points", out.stdout).group(1))
        assert n > 1 and f"agrees on {n}" in out.stdout and "c8 chain:3" in out.stdout, out.stdout
        rows = [line for line in out.stdout.splitlines() if re.search(r" c\d+ (chain:3|none) ", line)]
        assert len(rows) == n, out.stdout
        doubled = [r for r in rows if re.search(r"\s2\.00\s", r)]
        assert len(doubled) == 1 and "treewy" in doubled[0], out.stdout


@pytest.mark.parametrize("cmd", [c for c in COMMANDS if c in {_normal(r) for r in COMPOSE_ONLY}])
def test_readme_command_composes(cmd, capsys, tmp_path, monkeypatch):
    """``--cfg``: composed and validated as the command would before its first point (a grid's every point)."""
    from harness.cli import main

    monkeypatch.chdir(tmp_path)
    if "requests_from.sharegpt=sharegpt.jsonl" in cmd:      # the README exports this file the line before
        (tmp_path / "sharegpt.jsonl").write_text('{"prompt_len": 12, "output_len": 34}\n')
    argv = shlex.split(cmd)[3:]
    rc = main(argv + ["--cfg"])
    err = capsys.readouterr().err
    assert rc == 0, f"{cmd}: {err[-3000:]}"


@pytest.mark.parametrize("cmd", [c for c in COMMANDS if c in {_normal(h) for h in HYDRA_JOBS}])
def test_readme_hydra_grid_composes(cmd):
    """Every job of the launcher's grid composes with its launcher (the Slurm one included: its config, not a
    cluster) and passes the checks the job makes (harness.point: point_configs)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from omegaconf import OmegaConf

    from harness.config import conf_dir
    from harness.grid import point_configs

    argv = shlex.split(cmd)
    assert argv[:4] == ["python", "-m", "harness.point", "--multirun"]
    parsed = OverridesParser.create().parse_overrides(argv[4:])
    axes = [[f"{o.get_key_element()}={v}" for v in o.sweep_iterator()] if o.is_sweep_override()
            else [o.input_line] for o in parsed]
    jobs = 0
    with initialize_config_dir(str(conf_dir()), version_base=None):
        for job in itertools.product(*axes):
            cfg = compose("point", list(job), return_hydra_config=True)
            assert cfg.hydra.launcher._target_
            c = OmegaConf.to_container(cfg, resolve=False)
            c.pop("hydra")
            c = OmegaConf.to_container(OmegaConf.create(c), resolve=True)
            c["workloads"] = [cfg.hydra.runtime.choices["workload"]]
            (pc,) = point_configs(c)
            jobs += 1
    assert jobs == len(list(itertools.product(*axes))) > 1


@pytest.mark.parametrize("cmd", [c for c in COMMANDS if c in {_normal(o) for o in OTHER}])
def test_readme_other_command(cmd, scratch):
    how = {_normal(k): v for k, v in OTHER.items()}[cmd]
    argv = shlex.split(cmd)
    if how == "parse":
        from harness.engines.vllm.offline import parse_args

        args = parse_args(argv[3:])
        assert args.strategy == "treewy" and args.gmu == 0.6
    elif how == "browser":
        if not (shutil.which("chromium") or shutil.which("chromium-browser")):
            pytest.skip("needs Chromium (apt-get install chromium chromium-driver poppler-utils)")
        pytest.importorskip("selenium")
        out = _run(cmd, scratch[0])
        assert out.returncode == 0, out.stderr[-3000:]
    elif how == "module":
        from conftest import requires_vllm

        if requires_vllm.args[0]:
            pytest.skip(requires_vllm.kwargs["reason"])
        import importlib.util

        top, *rest = argv[2].split(".")
        spec = importlib.util.find_spec(top)      # finds the package without importing it
        assert spec is not None and spec.submodule_search_locations, f"{top}: not installed"
        module = Path(next(iter(spec.submodule_search_locations)), *rest).with_suffix(".py")
        assert module.is_file(), f"{argv[2]}: no such module in this {top} ({module})"
    else:
        assert how == "self"


def test_architecture_doc_names_files_that_exist():
    """docs/ARCHITECTURE.md describes the code as it is: every module, folder and function it names exists."""
    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
    assert "docs/ARCHITECTURE.md" in README.read_text()
    named = set(re.findall(r"`((?:strategies|workloads|harness|analysis|reports|conf|tests)/[\w/<>.-]*)(?::(\w+))?",
                           text))
    assert len(named) > 20
    for path, attr in named:
        if "<" in path:          # a pattern such as strategies/<name>.py
            continue
        assert (ROOT / path).exists(), f"docs/ARCHITECTURE.md names {path}, which is gone"
        if attr and path.endswith(".py"):
            assert re.search(rf"^(def|class) {attr}\b|^{attr}\b", (ROOT / path).read_text(), re.M), \
                f"docs/ARCHITECTURE.md names {path}:{attr}, which is gone"
