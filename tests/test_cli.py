"""The CLI as users run it: ``python -m harness ...`` in a subprocess."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import strategies

ROOT = Path(__file__).resolve().parents[1]


def harness(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout, env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"})


def test_help_lists_the_commands_that_exist():
    out = harness("--help")
    assert out.returncode == 0, out.stderr
    for word in ("sweep", "run", "analyze", "report", "compare", "memory", "workloads", "bench"):
        assert word in out.stdout
    sub = harness("bench", "--help")
    assert sub.returncode == 0 and "strategies" in sub.stdout and "sim" in sub.stdout


def test_every_sweep_grid_the_help_names_composes():
    import re

    from harness.cli import _sweep_names
    from harness.config import compose

    out = harness("sweep", "--help")
    names = _sweep_names().split("|")
    assert set(names) == {f.stem for f in (ROOT / "conf" / "sweep").glob("*.yaml")}
    assert re.sub(r"\s+", "", out.stdout).count(re.sub(r"\s+", "", _sweep_names())) == 1
    for name in names:
        cfg = compose("sweep", [f"sweep={name}"])
        assert cfg.strategy and cfg.gmu, name


def test_memory_json_reproduces_the_paper_figures():
    out = harness("memory", "model=qwen35_397b", "drafts=[[1,1,1]]", "state_dtypes=[bfloat16]", "format=json")
    assert out.returncode == 0, out.stderr
    rows = {r["strategy"]: r for r in json.loads(out.stdout)}
    codecs = {f"store_delta:{c}" for c in ("sparse", "bf16", "fp8_e4m3")}      # store_delta's other codecs' rows
    assert set(rows) == set(strategies.names()) | codecs
    assert rows["store_all"]["recurrent_total_bytes"] == 360 * 2 ** 20
    assert rows["treewy"]["recurrent_total_bytes"] == 90 * 2 ** 20
    assert rows["store_all"]["state_pages"] == 4 and rows["treewy"]["state_pages"] == 1


def test_memory_table_skips_replay_for_trees():
    out = harness("memory", "drafts=[[3,3,3]]")
    assert out.returncode == 0, out.stderr
    assert "Qwen3.5-35B-A3B" in out.stdout and "3,3,3+root" in out.stdout
    assert "1200.0" in out.stdout  # store_all: 40 bf16 snapshots of 30 MiB
    assert "replay " not in out.stdout


def test_bad_input_names_the_input_and_the_fix():
    out = harness("memory", "model=qwen9")
    assert out.returncode == 2
    assert "model=qwen9" in out.stderr and "qwen35_35b" in out.stderr
    out = harness("memory", "drafts=[banana]")
    assert out.returncode == 2 and "draft='banana'" in out.stderr and "chain:3" in out.stderr
    out = harness("memory", "format=yaml")
    assert out.returncode == 2 and "format=yaml: must be table or json" in out.stderr


def test_cfg_prints_the_composed_config():
    out = harness("memory", "model=qwen35_9b", "--cfg")
    assert out.returncode == 0 and "display_name: Qwen3.5-9B" in out.stdout


def test_bench_strategies_small_run(tmp_path):
    dest = tmp_path / "bench.json"
    out = harness("bench", "strategies", "drafts=[chain:3,[2,2]]", "batch=2", "steps=2", "repeats=2",
                  "warmup=0", f"out={dest}")
    assert out.returncode == 0, out.stderr
    assert "x store_all" in out.stdout
    payload = json.loads(dest.read_text())
    assert payload["engine"] == "torch-cpu-reference"
    assert payload["provenance"]["torch"]
    rows = payload["rows"]
    by = {(r["draft"], r["strategy"]): r for r in rows}
    assert {s for d, s in by if d.startswith("chain:3")} == set(strategies.names())
    assert {s for d, s in by if d.startswith("2,2")} == set(strategies.names()) - {"replay"}   # replay: chains only
    for r in rows:
        assert len(r["step_seconds_all"]) == 2 and r["step_seconds_median"] > 0
        # each strategy's time over store_all's on the same draft (a ratio to itself would check nothing)
        base = by[(r["draft"], "store_all")]["step_seconds_median"]
        assert r["vs_store_all"] == pytest.approx(r["step_seconds_median"] / base)
    assert len({r["vs_store_all"] for r in rows if r["strategy"] != "store_all"}) > 1
    assert by[("chain:3 (N=3)", "store_all")]["speculative_bytes"] == 3 * 30 * 2 * 2 ** 20  # 3 fp32 snapshots


def test_a_key_no_config_has_is_refused_with_the_nearest_one_and_plus_only_opens_the_open_maps(capsys):
    """Hydra's advice for a typo (`use +gmuu=0.6`) adds a key nothing reads: every command refuses both spellings,
    naming the key it probably meant; '+' still adds the server's environment variables. (In this process:
    the CLI's main, without an interpreter start per case.)"""
    from harness.cli import main

    for args, want in ((["sweep", "gmuu=0.6"], "gmuu=0.6: no such key; did you mean gmu?"),
                       (["sweep", "+gmuu=0.6"], "+gmuu=0.6: adds a key no config has, which nothing would read "
                                                "(did you mean gmu?)"),
                       (["sweep", "engine=sim", "engine.mood=graphs"], "did you mean engine.mode"),
                       (["sweep", "engine.mood=graphs"], "did you mean engine.mode"),    # auto resolved first
                       (["memory", "+formatt=json"], "did you mean format?"),
                       (["memory", "+workload.x=1"], "adds a key no config has"),     # no grid: no workload settings
                       (["sweep", "engine=sim", "+engine.env.X=1"], "adds a key no config has"),   # sim has no env
                       (["sweep", "engine=vllm", "engine.env.X=1"], "engine.env takes new keys with '+'"),
                       (["sweep", "engine.name=vllm"], "the engine is a choice of conf/engine/"),
                       (["sweep", "workload.seed=1,2"], "a workload setting takes one"),
                       (["sweep", "workload.nope=1"], "none of the swept workloads")):   # --cfg checks the grid too
        assert main([*args, "--cfg"]) == 2, args
        err = capsys.readouterr().err
        assert want in err, (args, err[-1500:])
    assert main(["sweep", "engine=vllm", "+engine.env.VLLM_CPU_OMP_THREADS_BIND=0", "--cfg"]) == 0
    assert "VLLM_CPU_OMP_THREADS_BIND: 0" in capsys.readouterr().out
    assert main(["sweep", "++gmu=[0.6]", "--cfg"]) == 0 and "- 0.6" in capsys.readouterr().out    # an existing key
