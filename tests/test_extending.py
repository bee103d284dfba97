"""Adding a strategy or a workload is one module plus one config: a throwaway one, written to a temporary folder
(the module on PYTHONPATH, the config in a copy of conf/ named by COMMITBENCH_CONF), runs through every command
that takes it without any other file changed. The commands run as subprocesses: the throwaway registers itself in
their registries, never in this test process's."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

TOY_STRATEGY = '''
"""store_all's math with one spare snapshot page per request: a footprint and a step traffic of its own, which the
memory table and the simulator must take from it (not from its name)."""
from strategies.base import register
from strategies.store_all import StoreAll


@register("toy_snapshots")
class ToySnapshots(StoreAll):
    options = ("spare",)

    def __init__(self, spare: int = 1):
        self.spare = int(spare)

    def footprint(self, tree):
        return tree.num_drafts + 1 + self.spare, 0

    def step_traffic(self, tree, state_bytes, token_stash_bytes, mean_tokens):
        return (1 + tree.num_nodes + self.spare) * state_bytes
'''


@pytest.fixture()
def extended(tmp_path):
    """A copy of conf/ with the throwaway strategy's config, its module beside it; the env for the commands."""
    conf = tmp_path / "conf"
    shutil.copytree(ROOT / "conf", conf)
    (tmp_path / "mods").mkdir()
    (tmp_path / "mods" / "toy_strategy.py").write_text(TOY_STRATEGY)
    (conf / "strategies" / "toy_snapshots.yaml").write_text(
        "module: toy_strategy\noptions:\n  spare: 2     # spare snapshot pages per request\n")
    env = {**os.environ, "COMMITBENCH_CONF": str(conf), "COMMITBENCH_CACHE": str(tmp_path / "cache"),
           "PYTHONPATH": os.pathsep.join([str(tmp_path / "mods"), str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return tmp_path, env


def _harness(env, *args, timeout=600) -> subprocess.CompletedProcess:
    out = subprocess.run([sys.executable, "-m", "harness", *args], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=timeout)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    return out


def test_a_throwaway_strategy_runs_through_memory_the_simulator_the_bench_and_the_gate(extended):
    tmp, env = extended
    # the memory table: its footprint (1 + 3 drafts + 2 spare pages of 30 MiB, bf16 35B shape), with its option
    rows = json.loads(_harness(env, "memory", "format=json", "drafts=[[1,1,1]]", "state_dtypes=[bfloat16]").stdout)
    toy = next(r for r in rows if r["strategy"] == "toy_snapshots")
    store = next(r for r in rows if r["strategy"] == "store_all")
    assert toy["recurrent_total_bytes"] - store["recurrent_total_bytes"] == 2 * store["recurrent_total_bytes"] / 4
    rows = json.loads(_harness(env, "memory", "format=json", "drafts=[[1,1,1]]", "state_dtypes=[bfloat16]",
                               "strategies.toy_snapshots.spare=0").stdout)
    assert next(r for r in rows if r["strategy"] == "toy_snapshots")["total_bytes"] == store["total_bytes"]

    # the simulator: a sweep with it beside store_all; its pool holds fewer requests (more pages each)
    out = tmp / "sweep"
    _harness(env, "sweep", "sweep=quick", "gpu=h200", "engine=sim", "strategy=[store_all,toy_snapshots]",
             "gmu=[0.6]", "concurrency=[8]", "report=false", f"out={out}")
    points = {json.loads(p.read_text())["config"]["strategy"]: json.loads(p.read_text())
              for p in out.glob("points/*/summary.json")}
    assert set(points) == {"store_all", "toy_snapshots"} and all(p["status"] == "ok" for p in points.values())
    assert points["toy_snapshots"]["config"]["strategy_options"] == {"spare": 2}
    fits = {s: p["telemetry"]["max_concurrency_max_len"] for s, p in points.items()}
    assert fits["toy_snapshots"] < fits["store_all"]

    # bench strategies: timed beside store_all (same math: the same step, within noise)
    bench = tmp / "bench.json"
    _harness(env, "bench", "strategies", "drafts=[chain:3]", "batch=2", "steps=2", "repeats=1", "warmup=0",
             f"out={bench}")
    assert {r["strategy"] for r in json.loads(bench.read_text())["rows"]} >= {"store_all", "toy_snapshots"}

    # the acceptance gate: it reproduces the reference's decoding
    gate = _harness(env, "check-acceptance", "strategy=[store_all,toy_snapshots]", "dtypes=[float64]",
                    "drafts=[chain:3,'2,2']", "prompts.count=2", "max_new_tokens=16", "baseline=null",
                    "tree_sweep=null")
    assert "toy_snapshots" in gate.stdout and "FAIL" not in gate.stdout


def test_the_vllm_engine_refuses_a_strategy_without_a_paged_layout_before_the_first_point(extended):
    """vLLM runs what the plugin has a paged stash for; a registered strategy without one is named, with where it
    does run, before any server starts (exit 2, nothing written)."""
    tmp, env = extended
    out = tmp / "vllm"
    run = subprocess.run([sys.executable, "-m", "harness", "sweep", "sweep=quick", "engine=vllm",
                          "strategy=[store_all,toy_snapshots]", f"out={out}"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 2, run.stdout[-2000:] + run.stderr[-2000:]
    assert "strategy=toy_snapshots with engine=vllm" in run.stderr and "engine=sim" in run.stderr
    assert not (out / "points").exists()


def test_a_strategy_config_that_registers_nothing_is_refused_naming_the_file(extended):
    tmp, env = extended
    (tmp / "conf" / "strategies" / "toy_snapshots.yaml").write_text("module: json\noptions: {}\n")
    out = subprocess.run([sys.executable, "-m", "harness", "memory"], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 2 and "conf/strategies/toy_snapshots.yaml: module json registers no strategy" in out.stderr


TOY_WORKLOAD = '''
"""Every request the same shape, from the config's own keys: a source of its own outside workloads/."""
from workloads import Request, register
from workloads.base import LoadReport, Workload


@register
class Fixed(Workload):
    name = "toy_fixed"

    def load(self):
        n = int(self.cfg["pool"])
        reqs = [Request(prompt_len=int(self.cfg["prompt_len"]), output_len=int(self.cfg["output_len"]),
                        category="toy", source_id=f"toy:{i}") for i in range(n)]
        return reqs, LoadReport(source="toy_fixed", tokenizer=None, counts={"generated": n}), None
'''

TOY_WORKLOAD_CONF = """# every request 300 prompt and 40 output tokens (tests/test_extending.py)
module: toy_workload
source: toy_fixed
prompt_len: 300
output_len: 40
pool: 50
num_requests: 100
seed: 0
filters: null
arrival: {kind: closed, max_concurrency: 4, rate: null, burstiness: 1.0}
"""


def test_a_throwaway_workload_runs_through_describe_and_a_sweep_and_takes_its_settings(extended):
    tmp, env = extended
    (tmp / "mods" / "toy_workload.py").write_text(TOY_WORKLOAD)
    (tmp / "conf" / "workload" / "toy_fixed.yaml").write_text(TOY_WORKLOAD_CONF)
    described = _harness(env, "workloads", "describe", "workload=toy_fixed")
    assert "toy_fixed" in described.stdout and "300" in described.stdout
    out = tmp / "sweep"
    _harness(env, "sweep", "sweep=quick", "gpu=h200", "engine=sim", "workloads=[toy_fixed]", "strategy=[treewy]",
             "baseline=treewy", "gmu=[0.9]",
             "concurrency=[8]", "workload.output_len=24", "report=false", f"out={out}")
    (point,) = [json.loads(p.read_text()) for p in out.glob("points/*/summary.json")]
    assert point["status"] == "ok" and point["config"]["workload"]["output_len"] == 24
    import pyarrow.parquet as pq

    reqs = pq.read_table(next(out.glob("points/*/requests.parquet"))).to_pylist()
    assert {(r["prompt_len"], r["output_len"]) for r in reqs} == {(300, 24)}


TOY_FIGURE = '''
"""One more report figure: each point's output throughput as a bar (registered by the decorator)."""
import matplotlib.pyplot as plt

from reports.figures import figure


@figure("Toy: output throughput per point")
def toy_throughput(inp):
    ok = [p for p in inp.result["points"] if p["status"] == "ok"]
    if not ok:
        return None
    fig, ax = plt.subplots(figsize=(4, 2))
    ax.bar(range(len(ok)), [p["output_throughput"] for p in ok])
    return fig
'''


def test_a_throwaway_figure_is_drawn_in_the_report(extended):
    tmp, env = extended
    (tmp / "mods" / "toy_figure.py").write_text(TOY_FIGURE)
    (tmp / "conf" / "figures" / "toy.yaml").write_text("module: toy_figure\n")
    out = tmp / "sweep"
    _harness(env, "sweep", "sweep=quick", "gpu=h200", "engine=sim", "gmu=[0.9]", "concurrency=[8]", f"out={out}")
    html = (out / "report.html").read_text()
    assert "Toy: output throughput per point" in html
    assert html.index("Toy: output throughput per point") > html.index("<img")      # after the built-in ones


TOY_ENGINE = '''
"""The simulator under another name, its steps twice as slow: an engine registered from outside harness/."""
from harness.engines.base import register_engine
from harness.engines.sim.engine import SimEngine


@register_engine("toy_sim")
class SlowSim(SimEngine):
    def __init__(self, cfg, log_dir=None):
        cfg = dict(cfg)
        cfg["efficiency"] = {k: v / 2 for k, v in cfg["efficiency"].items()}
        super().__init__(cfg, log_dir)
'''


def test_a_throwaway_engine_runs_a_sweep(extended):
    tmp, env = extended
    (tmp / "mods" / "toy_engine.py").write_text(TOY_ENGINE)
    sim = (tmp / "conf" / "engine" / "sim.yaml").read_text()
    (tmp / "conf" / "engine" / "toy_sim.yaml").write_text(
        sim.replace("name: sim\n", "name: toy_sim\n").replace("module: harness.engines.sim.engine", "module: toy_engine"))
    runs = {}
    for engine in ("sim", "toy_sim"):
        out = tmp / engine
        _harness(env, "sweep", "sweep=quick", "gpu=h200", f"engine={engine}", "strategy=[treewy]", "baseline=treewy",
                 "gmu=[0.9]", "concurrency=[128]", "report=false", f"out={out}")
        (runs[engine],) = [json.loads(p.read_text()) for p in out.glob("points/*/summary.json")]
    assert runs["toy_sim"]["engine"] == "toy_sim" and runs["toy_sim"]["status"] == "ok"
    assert runs["toy_sim"]["metrics"]["output_throughput"] < 0.9 * runs["sim"]["metrics"]["output_throughput"]


def test_the_engine_is_asked_only_about_strategies_that_run_under_speculation(monkeypatch):
    """Speculation-off points run no strategy, so an engine that cannot run one still takes a draft=none grid;
    the same grid with a draft is refused before the first point, after engine=auto is resolved."""
    from omegaconf import OmegaConf

    from harness.engines.base import engine_class
    from harness.grid import compose_sweep, point_configs

    cls = engine_class({"name": "sim"})
    monkeypatch.setattr(cls, "runs_strategy", classmethod(lambda c, n: "not here" if n == "treewy" else None),
                        raising=False)
    grid = ["sweep=quick", "engine=sim", "strategy=[treewy]", "concurrency=[8]"]
    off = point_configs(OmegaConf.to_container(compose_sweep(grid + ["draft=[none]"]), resolve=True))
    assert [p["draft"] for p in off] == [None]
    with pytest.raises(ValueError, match="strategy=treewy with engine=sim: not here"):
        point_configs(OmegaConf.to_container(compose_sweep(grid + ["draft=[chain:3]"]), resolve=True))
