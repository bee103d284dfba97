"""Sweeps end to end on the simulator: store, resume, failures, analysis math, reports, launchers."""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import yaml

from analysis.regimes import Thresholds, geomean, memory_bound, ratio
from analysis.sweep import fmt_ratio
from harness.store import Store

ROOT = Path(__file__).resolve().parents[1]
QUICK = ["sweep=quick", "gpu=h200", "engine=sim"]
THRESHOLDS = yaml.safe_load((ROOT / "conf" / "thresholds" / "memory_bound.yaml").read_text())   # what sweeps record


def harness(*args, timeout=600, **kw):
    return subprocess.run([sys.executable, "-m", "harness", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, **kw)


def cli(capsys, *args) -> subprocess.CompletedProcess:
    """``python -m harness ARGS`` in this process (no interpreter start and imports per call): exit code and
    what it printed, as :func:`harness` returns them. Not for time_budget_s: a budget counts the process's age
    (harness.budget.process_age_s), here pytest's."""
    from harness.cli import main

    capsys.readouterr()
    rc = main(list(args))
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess(args, rc, out, err)


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("COMMITBENCH_CACHE", str(tmp_path / "cache"))


# -- the front door -------------------------------------------------------------

def test_sweep_writes_points_analysis_and_reports(tmp_path):
    out = harness("sweep", *QUICK, f"out={tmp_path / 's'}", "gmu=0.6,0.9")
    assert out.returncode == 0, out.stderr[-3000:]
    store = Store(tmp_path / "s")
    summaries = list(store.summaries())
    assert len(summaries) == 8 and all(s["status"] == "ok" for s in summaries)  # 2 gmu x 2 loads x 2 strategies
    s = summaries[0]
    assert s["engine"] == "sim" and s["provenance"]["torch"] and "git_commit" in s["provenance"]
    assert "triton" in s["provenance"]           # None where it is not installed, its version where it is
    assert s["config"]["model"]["name"] == "qwen35_35b" and s["config"]["gpu"]["name"] == "h200"
    assert len(store.requests(s["point_id"])) == s["config"]["requests"]
    from harness.telemetry import problems
    assert [problems(x["telemetry"]) for x in summaries] == [[]] * len(summaries)     # the schema analysis reads
    analysis = json.loads((tmp_path / "s" / "analysis.json").read_text())
    assert analysis["counts"]["groups"] == 4 and analysis["engine"] == "sim"
    html = (tmp_path / "s" / "report.html").read_text()
    from html import escape

    from reports import figures
    # every registered view has something to draw here (two strategies, two memory budgets): each is in the page
    assert "engine: sim" in html and html.count("data:image/png;base64") == len(figures.FIGURES) and "sortTable" in html
    assert all(f"<b>{escape(t)}.</b>" in html for t, _ in figures.FIGURES)
    assert 'id="setup">setup: engine sim | 1x simulated H200 (TP 1)' in html and 'id="verdict"' in html
    assert "treewy vs store_all, not memory-bound: output throughput" in html
    # the published figures are rows of the ratio table, read from conf/scale/*.yaml and conf/published/
    assert '<td class="published">treewy (TreeWY paper: 35B on one B200, incl. BurstGPT, measured)</td>' in html
    assert '<td class="published">memory-bound (31/105 points)</td>' in html
    # every point in vllm bench serve's field names and as CSV
    bench = json.loads((tmp_path / "s" / "bench_serve.json").read_text())
    assert len(bench) == 8 and {"request_throughput", "output_throughput", "mean_ttft_ms", "median_ttft_ms",
                                "p99_ttft_ms", "p99_tpot_ms", "mean_itl_ms", "p99_e2el_ms"} <= set(bench[0])
    one = next(p for p in analysis["points"] if p["point_id"] == bench[0]["point_id"])
    assert bench[0]["p99_ttft_ms"] == pytest.approx(one["ttft_p99"] * 1e3)
    assert (tmp_path / "s" / "points.csv").read_text().count("\n") == 9        # a header and 8 points
    assert (tmp_path / "s" / "report.pdf").read_bytes()[:5] == b"%PDF-"
    assert "memory-bound" in out.stdout and "report:" in out.stdout


def test_speculation_off_is_one_baseline_per_group(tmp_path):
    """draft=none runs once per (workload, gmu, load), whatever the strategies, and every strategy under
    speculation (store_all too) gets its ratio to it; the memory-bound count leaves it out."""
    out = harness("sweep", *QUICK, f"out={tmp_path / 's'}", "draft=[chain:3,none]")
    assert out.returncode == 0, out.stderr[-3000:]
    summaries = list(Store(tmp_path / "s").summaries())
    off = [s for s in summaries if not s["config"]["draft"]]
    assert len(summaries) == 6 and len(off) == 2                # 2 loads x (2 strategies + speculation off)
    assert all(s["point_id"].endswith("-nospec-store_all") and s["metrics"]["acceptance_length"] is None for s in off)
    a = json.loads((tmp_path / "s" / "analysis.json").read_text())
    assert a["counts"]["groups"] == 2                             # the speculative groups only
    by = {p["point_id"]: p for p in a["points"]}
    for s in ("store_all", "treewy"):
        got = a["vs_no_spec"][s]["not memory-bound"]
        assert got["points"] == 2
        pairs = [(p, by[p["point_id"].replace("chain3-" + s, "nospec-store_all")]) for p in a["points"]
                 if p["strategy"] == s and p["draft"] != "none"]
        want = [x["output_throughput"] / y["output_throughput"] for x, y in pairs]
        assert got["throughput"]["geomean"] == pytest.approx((want[0] * want[1]) ** 0.5)
    html = (tmp_path / "s" / "report.html").read_text()
    assert "Ratios to speculation off" in html and "no_spec" in html
    assert "ratios to speculation off" in out.stdout


def test_rerun_skips_finished_points(tmp_path):
    args = ("sweep", *QUICK, f"out={tmp_path / 's'}", "report=false")
    assert harness(*args).returncode == 0
    stamps = {p.name: p.stat().st_mtime_ns for p in (tmp_path / "s" / "points").iterdir()}
    again = harness(*args)
    assert again.returncode == 0 and "4 already in" in again.stdout and "0 to run" in again.stdout
    assert stamps == {p.name: p.stat().st_mtime_ns for p in (tmp_path / "s" / "points").iterdir()}


def test_a_damaged_point_is_named_left_out_and_redone_by_a_rerun(tmp_path):
    """Four kinds of damage a disk, a copy or a hand can do to finished points. Before: a truncated summary.json was
    skipped without a word, {"status": "ok"} broke analyze, report and the rerun with KeyError: 'config', a deleted
    requests.parquet silently dropped the point's curve, a garbage one was never repaired."""
    args = ("sweep", *QUICK, "concurrency=[4,8,16]", "strategy=[store_all]", f"out={tmp_path / 's'}")
    assert harness(*args).returncode == 0
    pts = tmp_path / "s" / "points"
    ids = sorted(p.name for p in pts.iterdir())
    good = {i: (pts / i / "requests.parquet").read_bytes() for i in ids}
    (pts / ids[0] / "summary.json").write_text((pts / ids[0] / "summary.json").read_text()[:200])
    (pts / ids[1] / "summary.json").write_text('{"status": "ok"}')
    (pts / ids[2] / "requests.parquet").unlink()
    reasons = ["summary.json does not parse", "summary.json lacks config, metrics", "requests.parquet is missing"]
    analyzed = harness("analyze", str(tmp_path / "s"))
    assert analyzed.returncode == 0, analyzed.stderr[-2000:]
    said = " ".join(analyzed.stdout.split())
    for i, why in zip(ids, reasons):
        assert f"{i}: {why}" in said, said
    rerun = harness(*args)
    said = " ".join(rerun.stdout.split())
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    assert "3 to run" in said and all(f"damaged: {i}: {why}" in said for i, why in zip(ids, reasons))
    assert said.count("; runs again") == 3
    assert all((pts / i / "requests.parquet").read_bytes() == good[i] for i in ids)      # the same points again
    (pts / ids[0] / "requests.parquet").write_bytes(b"not parquet at all")
    again = harness(*args)
    assert "damaged: " + ids[0] + ": requests.parquet is unreadable" in " ".join(again.stdout.split())
    assert (pts / ids[0] / "requests.parquet").read_bytes() == good[ids[0]]
    assert "damaged:" not in harness(*args).stdout


def test_an_output_written_atomically_keeps_the_old_file_when_the_writer_fails(tmp_path):
    from harness.store import atomic_file

    path = tmp_path / "report.pdf"
    path.write_bytes(b"the last good report")
    with pytest.raises(RuntimeError):
        with atomic_file(path) as tmp:
            tmp.write_bytes(b"half a new rep")
            raise RuntimeError("killed mid-write")
    assert path.read_bytes() == b"the last good report" and sorted(tmp_path.iterdir()) == [path]
    with atomic_file(path) as tmp:
        tmp.write_bytes(b"a new report")
    assert path.read_bytes() == b"a new report" and sorted(tmp_path.iterdir()) == [path]


def test_metrics_are_recomputed_from_the_stored_requests_so_a_metric_fix_reaches_old_sweeps(tmp_path):
    """summary.json's metrics are what the run computed; the store derives them again from requests.parquet (a
    copy tampered with, as an old sweep under a since-fixed metric would be, does not reach analysis)."""
    from analysis.metrics import point_metrics
    from analysis.sweep import analyze

    out = harness("sweep", *QUICK, f"out={tmp_path / 's'}", "report=false", "concurrency=[4]")
    assert out.returncode == 0, out.stderr[-3000:]
    store = Store(tmp_path / "s")
    first = next(store.summaries())
    f = store.points / first["point_id"] / "summary.json"
    stored = json.loads(f.read_text())
    assert stored["metrics"] == first["metrics"]                     # the run and the store agree
    f.write_text(json.dumps({**stored, "metrics": {**stored["metrics"], "output_throughput": 1.0, "ttft_p99": -1}}))
    again = {s["point_id"]: s for s in Store(tmp_path / "s").summaries()}[first["point_id"]]
    assert again["metrics"] == point_metrics(store.requests(first["point_id"]), stored["telemetry"])
    assert again["metrics"]["output_throughput"] == stored["metrics"]["output_throughput"] != 1.0
    rows = {r["point_id"]: r for r in analyze(Store(tmp_path / "s"))["points"]}
    assert rows[first["point_id"]]["output_throughput"] == stored["metrics"]["output_throughput"]
    # Its requests gone, the point is damaged, not an "ok" point with the run's (here tampered) numbers
    (store.points / first["point_id"] / "requests.parquet").unlink()
    after = Store(tmp_path / "s")
    assert first["point_id"] not in {s["point_id"] for s in after.summaries()}
    assert after.damaged == {first["point_id"]: "requests.parquet is missing"}


def test_the_anchor_runs_first_in_every_command_and_is_measured_again_when_a_campaign_resumes(tmp_path):
    """A campaign over several calls: the first command measures the anchor as a grid point, first; a later one
    with work measures it again (anchors/), first, and leaves the grid's copy alone; one with nothing to run
    adds no call. Analysis and the report show every measurement."""
    anchor = "balanced_chat-gmu0.9-c8-chain3-store_all"
    args = ("sweep", *QUICK, f"out={tmp_path / 's'}", f"anchor={anchor}")
    first = harness(*args, "concurrency=[8]", "report=false")
    assert first.returncode == 0, first.stderr[-3000:]
    grid_copy = (tmp_path / "s" / "points" / anchor / "summary.json").read_text()
    second = harness(*args)
    assert second.returncode == 0, second.stderr[-3000:]
    flat = lambda out: " ".join(out.stdout.split())          # rich wraps lines at the terminal's width
    assert f"anchor {anchor} measured again first" in flat(second)
    assert f"anchor {anchor}: measured 2x over 2 sweep commands" in flat(second)
    third = harness(*args, "report=false")
    assert third.returncode == 0 and "0 to run" in third.stdout and "measured again" not in flat(third)
    calls = json.loads((tmp_path / "s" / "calls.json").read_text())
    assert [c["call"] for c in calls] == [1, 2]                  # the third had nothing to run
    assert calls[0]["points"][0] == anchor and not calls[0]["anchor_remeasured"] and len(calls[0]["points"]) == 2
    assert calls[1]["points"][0] == anchor and calls[1]["anchor_remeasured"] and len(calls[1]["points"]) == 3
    again = tmp_path / "s" / "anchors" / "call-02" / "points" / anchor / "summary.json"
    assert json.loads(again.read_text())["status"] == "ok"
    assert (tmp_path / "s" / "points" / anchor / "summary.json").read_text() == grid_copy
    assert len(list((tmp_path / "s" / "points").iterdir())) == 4  # the grid, without the second measurement
    a = json.loads((tmp_path / "s" / "analysis.json").read_text())["anchor"]
    assert a["point_id"] == anchor and a["calls"] == 2
    assert [(m["call"], m["what"]) for m in a["measurements"]] == [(1, "grid point"), (2, "re-measured")]
    assert a["spread"]["output_throughput"] is not None
    assert "Drift between sweep commands" in (tmp_path / "s" / "report.html").read_text()
    # every point beside the baseline's at its settings, with the call each ran in
    pairs = json.loads((tmp_path / "s" / "analysis.json").read_text())["side_by_side"]
    assert pairs and {(r["call"], r["baseline_call"]) for r in pairs} >= {(2, 2), (1, 1)}
    assert "Each point beside store_all" in (tmp_path / "s" / "report.html").read_text()


def test_a_shared_server_runs_the_anchor_then_the_points_of_its_server_then_one_server_at_a_time():
    from harness.sweep import run_order

    def pt(gmu, strategy, c, draft="chain:3"):
        return {"gmu": gmu, "strategy": strategy, "draft": draft, "max_num_seqs": 256, "max_model_len": 4096, "c": c}

    grid = [pt(g, s, c) for g in (0.6, 0.9) for s in ("replay", "store_all", "treewy") for c in (256, 128)]
    anchor = pt(0.9, "store_all", 128)
    got = [(p["gmu"], p["strategy"], p["c"]) for p in run_order(grid, anchor, shared_server=True)]
    assert got[:2] == [(0.9, "store_all", 128), (0.9, "store_all", 256)]     # one start for both
    # then the anchor's strategy at the other gmu (vLLM's compile cache is warm for it), then one strategy at a
    # time over its gmu values, so only a strategy's first start compiles
    assert got[2:] == [(0.6, "store_all", 256), (0.6, "store_all", 128), (0.6, "replay", 256), (0.6, "replay", 128),
                       (0.9, "replay", 256), (0.9, "replay", 128), (0.6, "treewy", 256), (0.6, "treewy", 128),
                       (0.9, "treewy", 256), (0.9, "treewy", 128)]
    assert run_order(grid, None, shared_server=False) == grid                  # the simulator keeps the grid's order
    assert run_order(grid[1:], anchor, shared_server=False)[0] == anchor


def _campaign_point(gmu, strategy, c):
    """What run_order reads of a vLLM point (server and compile keys), and its concurrency to name it by."""
    return {"gmu": gmu, "strategy": strategy, "draft": "chain:3", "max_num_seqs": 256, "max_model_len": 4096, "c": c}


def _campaign_grid(gmus):
    return [_campaign_point(g, s, c) for g in gmus for c in (128, 256) for s in ("store_all", "treewy", "replay")]


def test_a_resumed_campaign_keeps_the_grids_kind_order_and_runs_the_hosts_warm_kinds_first():
    # the eighth session's call 11: treewy's gmu 0.9 points done, its gmu 0.6 c256 left; replay comes later in
    # the config, and its gmu 0.9 c128 point comes earlier in the grid than treewy's gmu 0.6 c256
    from harness.sweep import compile_key, run_order

    pt = _campaign_point
    grid = _campaign_grid((0.9, 0.6))
    anchor = pt(0.9, "store_all", 128)
    todo = [p for p in grid if p == anchor or p["strategy"] == "replay" or p == pt(0.6, "treewy", 256)]
    order = lambda **kw: [(p["strategy"], p["gmu"], p["c"]) for p in run_order(todo, anchor, True, **kw)]
    # the config's order: treewy before replay, although replay's first todo point comes first in todo
    assert order(grid=grid)[:2] == [("store_all", 0.9, 128), ("treewy", 0.6, 256)]
    # without the grid it falls back to todo's order (replay first)
    assert order()[1][0] == "replay"
    # a kind this host has compiled goes before one it has not, whatever the config's order
    warm_replay = order(grid=grid, warm={compile_key(pt(0.9, "replay", 128))})
    assert [s for s, _, _ in warm_replay[1:]] == ["replay"] * 4 + ["treewy"]
    assert warm_replay[1:3] == [("replay", 0.9, 128), ("replay", 0.9, 256)]   # one server at a time, grid order
    # the anchor's kind, whose graphs its start has just compiled, is as cheap to start as a warm one: its other
    # servers take their grid places among the warm kinds' ones, all before a cold kind
    todo.append(pt(0.6, "store_all", 128))
    assert order(grid=grid, warm={compile_key(pt(0.9, "replay", 128))}) == [
        ("store_all", 0.9, 128), ("replay", 0.9, 128), ("replay", 0.9, 256), ("store_all", 0.6, 128),
        ("replay", 0.6, 128), ("replay", 0.6, 256), ("treewy", 0.6, 256)]


def test_a_campaign_call_after_a_precompile_runs_the_precompiled_kind_in_the_grids_order():
    # the eleventh session's campaign (gmu 0.6 first, its store_all c128 the anchor) on a host that precompiled
    # treewy: the memory-bound pair runs in one call, before store_all's gmu 0.9 server, whose start is as cheap
    from harness.sweep import compile_key, run_order

    pt = _campaign_point
    grid = _campaign_grid((0.6, 0.9))
    anchor = pt(0.6, "store_all", 128)
    got = [(p["strategy"], p["gmu"], p["c"])
           for p in run_order(list(grid), anchor, True, grid=grid, warm={compile_key(pt(0.6, "treewy", 1))})]
    assert got == [("store_all", 0.6, 128), ("store_all", 0.6, 256), ("treewy", 0.6, 128), ("treewy", 0.6, 256),
                   ("store_all", 0.9, 128), ("store_all", 0.9, 256), ("treewy", 0.9, 128), ("treewy", 0.9, 256),
                   ("replay", 0.6, 128), ("replay", 0.6, 256), ("replay", 0.9, 128), ("replay", 0.9, 256)]


def test_a_time_budget_stops_before_a_point_it_expects_to_overrun_and_the_next_command_resumes(tmp_path):
    """A lent host kills a call at its limit, and with it the point running (on vLLM also the server start it
    paid for). time_budget_s stops cleanly instead: a new folder's first point runs (nothing is timed yet), each
    later one, and a resumed command's first, only if the timings say it fits; the call log says why it
    stopped and under which budget (sweep.json does not: it describes the experiment, not the call), and the
    same command with time enough finishes the grid."""
    args = ("sweep", *QUICK, f"out={tmp_path / 's'}", "report=false")
    out = harness(*args, "time_budget_s=0.001")
    assert out.returncode == 0, out.stderr[-3000:]
    flat = " ".join(out.stdout.split())
    assert "ran 1 points" in flat and "time_budget_s=0.001: stopped before" in flat and "3 points left" in flat
    assert len(list(Store(tmp_path / "s").summaries())) == 1
    call = json.loads((tmp_path / "s" / "calls.json").read_text())[0]
    assert len(call["points"]) == 1 and call["stopped"]["by"] == "time_budget_s"
    assert call["stopped"]["points_left"] == 3 and call["stopped"]["before"] not in call["points"]
    assert call["time_budget_s"] == 0.001
    assert "time_budget_s" not in json.loads((tmp_path / "s" / "sweep.json").read_text())
    again = harness(*args, "time_budget_s=0.001")             # the folder's timings now say: nothing fits
    assert again.returncode == 0 and "ran 0 points" in " ".join(again.stdout.split())
    assert len(list(Store(tmp_path / "s").summaries())) == 1
    rest = harness(*args, "time_budget_s=3600")
    assert rest.returncode == 0 and "1 already in" in rest.stdout and "3 to run" in rest.stdout
    assert "stopped before" not in rest.stdout and len(list(Store(tmp_path / "s").summaries())) == 4
    assert "stopped" not in json.loads((tmp_path / "s" / "calls.json").read_text())[-1]
    for bad in ("time_budget_s=-5", "time_budget_s=abc", "time_budget_s=0", "time_budget_s=nan",
                "time_budget_s=true", "time_budget_s='600'"):
        why = "must be a finite number of seconds > 0"
        r = harness("sweep", *QUICK, f"out={tmp_path / 'bad'}", bad, timeout=120)
        assert r.returncode == 2 and bad.split("=")[0] in r.stderr and why in r.stderr, r.stderr[-2000:]
        assert not (tmp_path / "bad").exists()                  # refused before the folder is touched
    r = harness("sweep", *QUICK, f"out={tmp_path / 'par'}", "time_budget_s=60", "jobs=2", timeout=120)
    assert r.returncode == 2 and "use jobs=1, or time_budget_s=null" in r.stderr


def _ok(startup_s=None, status="ok"):
    return {"status": status, "telemetry": {"server": {"startup_s": startup_s}} if startup_s else {}}


def test_the_budget_expects_a_server_start_only_where_a_point_opens_a_server():
    """The run from the latest point, scaled by requests; a start only where the point opens a server: one of a
    kind this host has compiled for as long as the shortest start seen, any other as long as the longest."""
    from harness.budget import MARGIN, TimeBudget

    now = [0.0]
    b = TimeBudget(600, key=lambda p: (p["strategy"], p["gmu"]), warm_key=lambda p: p["strategy"],
                   warm={"replay"}, clock=lambda: now[0])
    b.start_times.append(280.0)                              # a cold start the folder has seen
    sa9_128, sa9_256 = ({"strategy": "store_all", "gmu": 0.9, "requests": n} for n in (256, 512))
    sa6, tw6, rp6 = ({"strategy": s, "gmu": 0.6, "requests": 256} for s in ("store_all", "treewy", "replay"))
    assert b.fits(sa9_128) == (True, None)                   # nothing timed yet: it runs
    b.record(sa9_128, 140.0, _ok(110.0)); now[0] = 140.0
    assert b.estimate(sa9_256) == pytest.approx(MARGIN * 60.0)   # 30 s run x 512/256 requests, no start
    b.record(sa9_256, 50.0, _ok(110.0)); now[0] = 190.0          # the server's start, not this point's
    assert b.estimate(sa6) == pytest.approx(MARGIN * (110.0 + 25.0))   # compiled in this command: warm
    assert b.estimate(rp6) == pytest.approx(MARGIN * (110.0 + 25.0))   # compiled by an earlier command here
    assert b.estimate(tw6) == pytest.approx(MARGIN * (280.0 + 25.0))   # never: the longest start seen
    assert b.fits(tw6)[0]                                     # 410 s left
    now[0] = 400.0
    assert b.fits(sa6)[0] and not b.fits(tw6)[0]              # 200 s left
    # a failed point teaches no run time, and its server may be gone: the next point expects a start
    b.record(sa6, 0.5, _ok(status="failed"))
    assert b.last_run == (50.0, 512)                          # still the c256 point before it
    assert b.opens_server(sa6) and "treewy" not in b.warm
    sim = TimeBudget(10, clock=lambda: 0.0)
    sim.record({"requests": 100}, 3.0, _ok())
    assert sim.estimate({"requests": 200}) == pytest.approx(MARGIN * 6.0) and not sim.opens_server({})
    fresh = TimeBudget(600, key=lambda p: p["gmu"], clock=lambda: 0.0)
    fresh.record({"gmu": 0.9, "requests": 256}, 0.4, _ok(status="failed"))   # no start, no run known
    assert fresh.estimate({"gmu": 0.6}) is None
    fresh.record({"gmu": 0.9, "requests": 256}, 300.0, _ok())    # a server whose start the summary lacks
    assert fresh.estimate({"gmu": 0.6, "requests": 256}) == pytest.approx(MARGIN * 300.0)


def test_the_budget_learns_start_times_and_the_latest_run_from_the_folder_and_warm_servers_from_this_boot(tmp_path):
    from harness.anchor import CallLog, boot_id
    from harness.budget import MARGIN, TimeBudget
    from harness.point import point_id
    from harness.sweep import budget_history, compile_key, server_key

    if boot_id() is None:
        pytest.skip("no /proc/sys/kernel/random/boot_id here (not Linux): the budget cannot tell boots apart")

    def pt(strategy, gmu):
        return {"workload_name": "sharegpt", "gmu": gmu, "load": {"kind": "closed", "concurrency": 128},
                "draft": "chain:3", "strategy": strategy, "max_num_seqs": 256, "max_model_len": 4096,
                "requests": 256}

    points = [pt(s, g) for s in ("store_all", "treewy", "replay") for g in (0.6, 0.9)]
    ids = [point_id(p) for p in points]
    root = tmp_path / "s"
    rows = ((Store(root), ids[0], 290.0, 320.0, "ok", "t1"),                       # a cold start + a 20 s level
            (Store(root / "anchors" / "call-02"), ids[1], 104.0, 130.0, "ok", "t2"),
            (Store(root), ids[2], None, 3.0, "failed", "t3"))
    for store, pid, start, wall, status, t in rows:
        d = store.root / "points" / pid
        d.mkdir(parents=True)
        (d / "summary.json").write_text(json.dumps({
            "point_id": pid, "status": status, "wall_s": wall, "config": {"requests": 256},
            "provenance": {"time_utc": t}, "metrics": {"duration_s": 20.0} if status == "ok" else None,
            "telemetry": {"server": {"startup_s": start}, "warmup": {"seconds": 2.0}} if start else {}}))
    (root / "calls.json").write_text(json.dumps([
        {"call": 1, "boot_id": boot_id(), "points": [ids[0], ids[1], ids[2]]},
        {"call": 2, "boot_id": "another-host", "points": [ids[4]]}]))
    b = TimeBudget(600, server_key, compile_key, clock=lambda: 0.0)
    budget_history(b, Store(root), CallLog(root), points)
    assert sorted(b.start_times) == [104.0, 290.0]
    assert b.last_run == (27.0, 256)                         # the latest ok point: its level + warm-up + 5 s
    # the failed point's kind and the other boot's are not warm
    assert b.warm == {compile_key(points[0])}
    assert b.estimate(points[0]) == pytest.approx(MARGIN * (104.0 + 27.0))   # the first point is estimated too


def test_the_note_beside_vllm_s_caches_makes_its_kinds_warm_for_the_budget(tmp_path, monkeypatch):
    """A host that restored other hosts' compile caches reads their notes: those kinds, for this model and
    graph mode, start warm; notes merge by copying files; a torn one reads as none."""
    import shutil as sh

    from harness.anchor import CallLog
    from harness.budget import MARGIN, TimeBudget
    from harness.compile_cache import NOTES, compiled_kinds, note_compiled, vllm_cache_root
    from harness.sweep import budget_history, compile_key, server_key

    monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path / "vc"))
    assert vllm_cache_root() == tmp_path / "vc"
    monkeypatch.delenv("VLLM_CACHE_ROOT")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert vllm_cache_root() == tmp_path / "xdg" / "vllm"          # where vLLM itself puts them

    def pt(strategy, draft="chain:3", model="qwen35_35b", eager=False):
        return {"workload_name": "sharegpt", "gmu": 0.9, "load": {"kind": "closed", "concurrency": 128},
                "draft": draft, "strategy": strategy, "max_num_seqs": 256, "max_model_len": 4096,
                "requests": 256, "model": {"name": model}, "engine": {"name": "vllm", "enforce_eager": eager}}

    a, b = tmp_path / "host-a", tmp_path / "host-b"
    assert compiled_kinds(pt("store_all"), a) == set()             # no note: nothing known
    note_compiled([pt("store_all"), pt("store_all", model="tiny"), pt("treewy", eager=True)], a)
    stamp = {f.name: f.stat().st_mtime_ns for f in (a / NOTES).iterdir()}
    note_compiled([pt("store_all")], a)                             # known already: its file stays as it was
    assert {f.name: f.stat().st_mtime_ns for f in (a / NOTES).iterdir()} == stamp
    assert compiled_kinds(pt("treewy"), a) == {("chain:3", "store_all", "")}    # other models and graph modes apart
    assert compiled_kinds(pt("treewy", model="tiny"), a) == {("chain:3", "store_all", "")}
    note_compiled([pt("replay"), pt("store_all", draft=None)], b)
    for f in (b / NOTES).iterdir():                                 # a restore copies host b's notes over a's
        sh.copy(f, a / NOTES / f.name)
    assert compiled_kinds(pt("treewy"), a) == {("chain:3", "store_all", ""), ("chain:3", "replay", ""), ("", "store_all", "")}
    (a / NOTES / "torn.json").write_text('{"model": "qwen35_35b", "draft": ')
    (a / NOTES / "foreign.json").write_text(json.dumps([["chain:3", "treewy"]]))
    assert ("chain:3", "treewy", "") not in compiled_kinds(pt("treewy"), a)
    # vLLM hashes its capture sizes too: graphs up to 2048 tokens and the default's are different kinds, both ways
    big = {"max_cudagraph_capture_size": 2048}
    note_compiled([{**pt("treewy"), "engine": {**pt("treewy")["engine"], **big}}], b)
    assert ("chain:3", "treewy", "") not in compiled_kinds(pt("treewy"), b)
    assert compiled_kinds({**pt("store_all"), "engine": {**pt("store_all")["engine"], **big}}, b) == {("chain:3", "treewy", "")}
    # a sub-grid's variant is a kind of its own: a plain point's note never makes it warm
    piecewise = {**pt("store_all"), "variant": "piecewise",
                 "engine": {**pt("store_all")["engine"], "cudagraph_mode": "PIECEWISE"}}
    assert compile_key(piecewise) != compile_key(pt("store_all"))
    assert compile_key(piecewise) not in compiled_kinds(pt("store_all"), a) | compiled_kinds(piecewise, a)
    note_compiled([piecewise], a)
    assert compiled_kinds(piecewise, a) == {compile_key(piecewise)}
    for f in (b / NOTES).iterdir():
        if "2048" in f.read_text():
            f.unlink()

    points = [pt("store_all"), pt("replay"), pt("treewy")]
    bud = TimeBudget(600, server_key, compile_key, clock=lambda: 0.0)
    budget_history(bud, Store(tmp_path / "s"), CallLog(tmp_path / "s"), points, compiled_kinds(points[0], b))
    assert bud.warm == {compile_key(points[1]), ("", "store_all", "")}
    bud.start_times, bud.last_run = [90.0, 300.0], (25.0, 256)
    assert bud.estimate(points[1]) == pytest.approx(MARGIN * (90.0 + 25.0))     # restored: a warm start
    assert bud.estimate(points[2]) == pytest.approx(MARGIN * (300.0 + 25.0))    # not noted: it compiles


def test_an_anchor_outside_the_grid_names_the_grid_s_points_and_touches_nothing(tmp_path):
    first = harness("sweep", *QUICK, f"out={tmp_path / 's'}", "concurrency=[8]", "report=false")
    assert first.returncode == 0, first.stderr[-3000:]
    before = {p: p.read_bytes() for p in (tmp_path / "s").rglob("*") if p.is_file()}
    out = harness("sweep", *QUICK, f"out={tmp_path / 's'}", "anchor=sharegpt-gmu0.6-c1-chain3-store_all",
                  timeout=120)
    assert out.returncode == 2
    assert "anchor=sharegpt-gmu0.6-c1-chain3-store_all: not a point of this sweep's grid" in out.stderr
    assert "balanced_chat-gmu0.9-c8-chain3-store_all" in out.stderr and "anchor=null" in out.stderr
    # sweep.json, the points and the call log are as they were: a typo must not relabel the folder
    assert {p: p.read_bytes() for p in (tmp_path / "s").rglob("*") if p.is_file()} == before


def _summary(status="ok", tput=100.0, reason=None):
    return {"status": status, "reason": reason, "metrics": {"output_throughput": tput} if status == "ok" else None,
            "config": {}, "provenance": {"time_utc": "t", "host": "h"}}


def test_drift_counts_only_the_anchor_s_own_measurements_and_credits_the_grid_copy_to_its_last_writer(tmp_path):
    from analysis.sweep import drift
    from harness.anchor import CallLog

    root = tmp_path / "s"
    store = Store(root)
    store.init({"anchor": "A"})
    store.write("A", _summary(tput=100.0), None)
    # call 1 failed the anchor, call 2 retried it as a grid point (the copy in points/), call 3 re-measured it
    # (and call 3 also re-measured B, the anchor of an earlier setting, which must not count)
    (root / "calls.json").write_text(json.dumps([
        {"call": 1, "points": ["A"], "anchor_remeasured": False},
        {"call": 2, "points": ["A", "x"], "anchor_remeasured": False},
        {"call": 3, "points": ["A", "B", "y"], "anchor_remeasured": True}]))
    Store(root / "anchors" / "call-03").write("A", _summary(tput=110.0), None)
    Store(root / "anchors" / "call-03").write("B", _summary(tput=300.0), None)
    d = drift(store)
    assert [(m["call"], m["what"]) for m in d["measurements"]] == [(2, "grid point"), (3, "re-measured")]
    assert d["spread"]["output_throughput"] == pytest.approx(0.10) and d["other_points"] == ["B"]
    # the log moved aside: the next call is numbered after the anchors/ there, never into call-03 again
    (root / "calls.json").rename(root / "calls.moved")
    assert CallLog(root).begin("A", True)["call"] == 4
    (root / "calls.json").write_text('{"call": 1}')
    with pytest.raises(ValueError, match="calls.json: not a list of calls.*move it aside"):
        CallLog(root)


def test_side_by_side_names_each_pair_s_calls_and_adjusts_only_across_calls_by_each_call_s_anchor(tmp_path):
    """A campaign's ratios between points of different calls carry the drift between those calls: each pair is
    listed with both calls, and the adjusted ratio divides each point by its own call's anchor measurement."""
    from analysis.sweep import drift, side_by_side

    root = tmp_path / "s"
    store = Store(root)
    store.init({"anchor": "A"})
    store.write("A", _summary(tput=100.0), None)
    Store(root / "anchors" / "call-02").write("A", _summary(tput=80.0), None)
    Store(root / "anchors" / "call-03").write("A", _summary(tput=60.0), None)
    Store(root / "anchors" / "call-04").write("A", _summary(tput=120.0), None)
    (root / "calls.json").write_text(json.dumps([
        {"call": 1, "anchor": "A", "points": ["A", "T9"], "anchor_remeasured": False},
        {"call": 2, "anchor": "A", "points": ["A", "B6", "N6"], "anchor_remeasured": True},
        {"call": 3, "anchor": "A", "points": ["A", "T6"], "anchor_remeasured": True},
        {"call": 4, "anchor": "A", "points": ["A", "T6"], "anchor_remeasured": True}]))   # T6 failed in 3

    def row(pid, strategy, tput, ttft, series=None, running=None, itl=None):
        return {"point_id": pid, "strategy": strategy, "series": series or strategy, "output_throughput": tput,
                "ttft_p99": ttft, "mean_running": running, "itl_mean": itl}

    groups = {("w", 0.9, "concurrency", 128.0, "chain:3"): {"store_all": row("A", "store_all", 100.0, 1.0),
                                                            "treewy": row("T9", "treewy", 97.0, 0.8)},
              ("w", 0.6, "concurrency", 128.0, "chain:3"): {"store_all": row("B6", "store_all", 50.0, 4.0,
                                                                             running=40.0, itl=0.04),
                                                            "treewy": row("T6", "treewy", 90.0, 2.0,
                                                                          running=100.0, itl=0.08)},
              ("w", 0.6, "concurrency", 128.0, "none"): {"store_all": row("N6", "store_all", 40.0, 0.5, "no_spec")}}
    pairs = {r["point_id"]: r for r in side_by_side(groups, "store_all", store, drift(store))}
    assert set(pairs) == {"T9", "T6", "N6"}
    t9, t6, n6 = pairs["T9"], pairs["T6"], pairs["N6"]
    # the anchor's own grid copy is call 1's (calls 2 and 3 measured it again into anchors/)
    assert (t9["call"], t9["baseline_call"], t9["same_call"]) == (1, 1, True)
    assert t9["throughput_ratio"] == pytest.approx(0.97) and t9["adjusted_throughput_ratio"] == pytest.approx(0.97)
    # T6's grid copy is its retry's, call 4's
    assert (t6["call"], t6["baseline_call"], t6["same_call"]) == (4, 2, False)
    assert t6["throughput_ratio"] == pytest.approx(1.8)
    assert t6["adjusted_throughput_ratio"] == pytest.approx(1.8 * 80.0 / 120.0)    # call 4 ran 1.5x call 2
    assert t6["p99_ttft_ratio"] == pytest.approx(2.0)
    # what the ratio is made of: 2.5x the running requests, each engine step 2x as long
    assert t6["running_ratio"] == pytest.approx(2.5) and t6["step_ratio"] == pytest.approx(2.0)
    assert t9["running_ratio"] is None and t9["step_ratio"] is None          # not measured: no ratio
    assert n6["series"] == "no_spec" and n6["baseline_point"] == "B6" and n6["same_call"]
    assert n6["adjusted_throughput_ratio"] == pytest.approx(0.8)
    # a call without a good anchor measurement gives no adjusted ratio; no anchor at all, no table
    shutil.rmtree(root / "anchors" / "call-04")
    Store(root / "anchors" / "call-04").write("A", _summary(status="failed", reason="boom"), None)
    t6 = {r["point_id"]: r for r in side_by_side(groups, "store_all", store, drift(store))}["T6"]
    assert t6["adjusted_throughput_ratio"] is None and t6["throughput_ratio"] == pytest.approx(1.8)
    # a point the call log does not list (run before it existed) gets no call, so no adjusted ratio
    groups[("w", 0.6, "concurrency", 128.0, "chain:3")]["replay"] = row("R6", "replay", 55.0, 3.0)
    r6 = {r["point_id"]: r for r in side_by_side(groups, "store_all", store, drift(store))}["R6"]
    assert r6["call"] is None and r6["adjusted_throughput_ratio"] is None
    assert side_by_side(groups, "store_all", store, None) == []


def test_an_anchor_that_only_failed_says_why():
    from analysis.sweep import anchor_line

    a = {"point_id": "A", "calls": 1, "spread": {}, "measurements": [
        {"call": 1, "what": "grid point", "status": "failed", "reason": "RuntimeError: no KV memory"}]}
    assert anchor_line(a) == "anchor A: every measurement failed (last: RuntimeError: no KV memory)"


def test_resume_after_a_killed_sweep(tmp_path):
    """SIGKILL mid-sweep: every stored point is whole; the rerun redoes none of them and finishes the rest."""
    out = tmp_path / "s"
    args = [sys.executable, "-m", "harness", "sweep", *QUICK, "concurrency=1,2,4,8,16,32,64,128,256",
            "workload=balanced_chat,generation_heavy", f"out={out}", "report=false"]
    proc = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True, env={**os.environ})
    deadline = time.time() + 120
    while time.time() < deadline:
        pts = out / "points"
        done = [p for p in pts.glob("*") if not p.name.startswith(".")] if pts.exists() else []
        if len(done) >= 4:
            break
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    store = Store(out)
    before = {s["point_id"]: (out / "points" / s["point_id"] / "summary.json").stat().st_mtime_ns
              for s in store.summaries()}
    assert 4 <= len(before) < 36, "the kill must land mid-sweep"
    for pid in before:  # whole points only: summary and requests both there and readable
        assert store.status(pid) == "ok" and store.requests(pid)
    rerun = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    assert f"{len(before)} already in" in rerun.stdout
    after = {s["point_id"]: (out / "points" / s["point_id"] / "summary.json").stat().st_mtime_ns
             for s in store.summaries()}
    assert len(after) == 36 and all(after[p] == before[p] for p in before)


def test_a_failing_point_is_recorded_and_the_rest_completes(tmp_path):
    # gmu=0.42 leaves the 35B model no KV memory on an H200: that point fails, the others run.
    out = harness("sweep", *QUICK, "gmu=0.42,0.9", f"out={tmp_path / 's'}")
    # the other points ran and were reported on, and the command says it failed (scripts see exit status 1)
    assert out.returncode == 1, out.stderr[-2000:]
    statuses = {s["point_id"]: s for s in Store(tmp_path / "s").summaries()}
    failed = [s for s in statuses.values() if s["status"] == "failed"]
    assert len(statuses) == 8 and len(failed) == 4
    assert all("gmu=0.42" in s["reason"] and "leaves no KV memory" in s["reason"] for s in failed)
    said = " ".join(out.stdout.split())
    assert "(4 failed)" in said and "4 of 8 points failed (exit status 1)" in said
    # every failed point is named with its reason, not only the first few
    assert all(s["point_id"] in said for s in failed) and "leaves no KV memory" in said
    assert "leaves no KV memory" in (tmp_path / "s" / "report.html").read_text()
    # a rerun that finds them still failed says so again; one that runs nothing new but has none failed exits 0
    again = harness("sweep", *QUICK, "gmu=0.42,0.9", "retry_failed=false", f"out={tmp_path / 's'}")
    assert again.returncode == 1 and "retry_failed=true" in " ".join(again.stdout.split())
    assert harness("sweep", *QUICK, "gmu=0.9", f"out={tmp_path / 's'}").returncode == 0


def test_a_point_whose_requests_all_fail_is_failed_and_a_sweep_of_only_such_points_names_why(tmp_path):
    # max_model_len=16: the simulator rejects every request (prompt + output exceed it), as vLLM answers HTTP 400.
    # Before, each point was "ok" with 0 completed requests, and the sweep said "4 ok, 0 failed" and exited 0.
    out = harness("sweep", *QUICK, "max_model_len=16", f"out={tmp_path / 's'}")
    said = " ".join(out.stdout.split())
    assert out.returncode == 1, out.stderr[-2000:]
    points = list(Store(tmp_path / "s").summaries())
    assert len(points) == 4 and all(p["status"] == "failed" for p in points)
    for p in points:
        n = p["metrics"]["requests"]
        assert p["reason"].startswith(f"{n} of {n} requests failed ({n} errored or were rejected)"), p["reason"]
        assert "thresholds.failed_requests=0.01" in p["reason"] and "exceed max_model_len=16" in p["reason"]
    # no report of nothing, but the reasons, on the console (before: "no finished points to report on")
    assert "no report: no point" in said and "exceed max_model_len=16" in said
    assert not (tmp_path / "s" / "report.html").exists()


@pytest.mark.parametrize("limit, status", [(0.0, "failed"), (0.5, "ok")])
def test_requests_that_return_fewer_tokens_than_asked_count_against_the_failed_requests_threshold(limit, status):
    from harness.engines.base import RequestRecord
    from harness.point import too_many_failed
    from analysis.metrics import point_metrics

    recs = [RequestRecord(id=i, arrival_s=0.0, prompt_len=10, output_len=8, first_token_s=0.1, finish_s=1.0,
                          output_tokens=8 if i else 3) for i in range(4)]
    m = point_metrics(recs)
    assert (m["completed"], m["short"], m["failed"], m["errored"]) == (3, 1, 1, 0)
    why = too_many_failed(m, recs, limit)
    assert (why is None) == (status == "ok")
    if why:
        assert why.startswith("1 of 4 requests failed (1 returned fewer tokens than asked)"), why


def test_failed_requests_threshold_is_validated(tmp_path):
    out = harness("sweep", *QUICK, "thresholds.failed_requests=1.5", f"out={tmp_path / 's'}", timeout=120)
    assert out.returncode == 2 and "thresholds.failed_requests=1.5" in out.stderr and "[0, 1)" in out.stderr
    assert not (tmp_path / "s").exists()


@pytest.mark.parametrize("override, match", [
    ("gmu=1.4", r"gmu=1.4: must be in \(0, 1\]"),
    ("strategy=nope", "strategy=nope: unknown; choose from store_all, replay, treewy, treewy_deferred"),
    ("workload=nope", "workload=nope: unknown; choose from balanced_chat, burstgpt"),
    ("model=qwen35_35b,qwen35_397b", "only the grid's axes take several values"),
    ("concurrency=0", "concurrency=0: must be a whole number >= 1"),
    ("draft=banana", "draft='banana': not a draft shape"),
    ("sweep=nope", "Could not find 'sweep/nope'"),
])
def test_bad_overrides_are_clear(tmp_path, override, match):
    import re

    out = harness("sweep", "engine=sim", override, f"out={tmp_path / 's'}", timeout=120)
    assert out.returncode == 2
    assert re.search(match, out.stderr), out.stderr


def test_a_kv_cache_bytes_pool_is_what_the_point_id_says(capsys):
    """With engine.kv_cache_bytes the pool is sized outright: the id says so (not the gmu it ignores), and a gmu
    axis beside it, which would run one point several times under different names, is refused."""
    from omegaconf import OmegaConf

    from harness.point import point_id
    from harness.grid import compose_sweep, point_configs

    pts = point_configs(OmegaConf.to_container(compose_sweep(["sweep=ci_vllm"]), resolve=True))
    assert pts and all(point_id(p).startswith("smoke-kv32MiB-c") for p in pts)
    gmu = point_configs(OmegaConf.to_container(compose_sweep(["sweep=ci_vllm", "engine.kv_cache_bytes=null"]),
                                               resolve=True))
    assert all(point_id(p).startswith("smoke-gmu0.9-c") for p in gmu)
    out = cli(capsys, "sweep", "sweep=ci_vllm", "gmu=0.6,0.9", "--cfg")
    assert out.returncode == 2 and "every gmu would run the same point" in out.stderr, out.stderr
    bad = cli(capsys, "sweep", "sweep=ci_vllm", "engine.kv_cache_bytes=-5", "--cfg")
    assert bad.returncode == 2 and "engine.kv_cache_bytes=-5: must be a whole number" in bad.stderr
    yes = cli(capsys, "sweep", "sweep=ci_vllm", "engine.kv_cache_bytes=true", "--cfg")
    assert yes.returncode == 2 and "engine.kv_cache_bytes=True: must be a whole number" in yes.stderr, yes.stderr


def test_run_one_point_and_the_result_commands_spellings(tmp_path):
    """(The README's run, analyze, report and compare commands run as written in tests/test_readme.py.)"""
    one = harness("run", "workload=balanced_chat", "gmu=0.9", "concurrency=16", "strategy=treewy",
                  f"out={tmp_path / 'one'}")
    assert one.returncode == 0, one.stderr[-2000:]
    assert json.loads(one.stdout)["status"] == "ok"
    many = harness("run", "workload=balanced_chat", "gmu=0.6,0.9", f"out={tmp_path / 'one'}")
    assert many.returncode == 2 and "describe 2 points" in many.stderr
    rep = harness("report", f"out={tmp_path / 'one'}")   # sweep's spelling of the folder works here too
    assert rep.returncode == 0 and (tmp_path / "one" / "report.pdf").is_file()
    odd = harness("analyze", "outdir=x")
    assert odd.returncode == 2 and "plain path" in odd.stderr
    bad = harness("analyze", str(tmp_path / "nothing"))
    assert bad.returncode == 2 and "not a sweep folder" in bad.stderr


# -- Hydra launchers: the scale-out route ------------------------------------------

@pytest.mark.parametrize("launcher", ["joblib", "submitit_local"])
def test_hydra_launchers_fan_points_into_one_store(tmp_path, launcher):
    """submitit_local is the Slurm launcher's local executor: the same job code, no cluster."""
    out = subprocess.run([sys.executable, "-m", "harness.point", "--multirun", f"hydra/launcher={launcher}",
                          "workload=balanced_chat", "workload.seed=7", "gmu=0.6,0.9", "strategy=store_all,treewy",
                          "concurrency=64", f"out={tmp_path / 'h'}"], cwd=ROOT, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    store = Store(tmp_path / "h")
    assert sorted(s["status"] for s in store.summaries()) == ["ok"] * 4
    assert {s["config"]["workload"]["seed"] for s in store.summaries()} == {7}   # the job's workload.* reached it
    ana = harness("analyze", str(tmp_path / "h"))
    assert ana.returncode == 0 and "memory-bound" in ana.stdout


def test_concurrent_writers_keep_the_first_complete_point(tmp_path):
    store = Store(tmp_path)
    whole = {"status": "ok", "config": {}, "metrics": {}}
    store.write("p", {**whole, "v": 1}, [{"id": 0}])
    store.write("p", {**whole, "v": 2}, [{"id": 1}])   # a late duplicate is dropped
    assert json.loads((tmp_path / "points" / "p" / "summary.json").read_text())["v"] == 1
    store.write("q", {"status": "failed", "reason": "x", "config": {}}, None)
    store.write("q", {**whole, "v": 3}, [{"id": 0}])   # a retry replaces a failure
    assert store.status("q") == "ok"
    assert not [p for p in (tmp_path / "points").iterdir() if p.name.startswith(".")]


# -- analysis math on hand-made numbers ------------------------------------------

def test_ratios_and_geomean_by_hand():
    s, b = {"output_throughput": 300.0, "ttft_p99": 2.0}, {"output_throughput": 200.0, "ttft_p99": 8.0}
    assert ratio(s, b, "throughput") == 1.5 and ratio(s, b, "p99_ttft") == 4.0
    assert ratio({"output_throughput": None}, b, "throughput") is None
    g = geomean([1.0, 4.0, 2.0, 8.0, 0.5])
    assert g["geomean"] == pytest.approx(math.exp(np.log([1, 4, 2, 8, 0.5]).mean())) == pytest.approx(2.0, rel=1e-4)
    assert g["lo"] <= g["geomean"] <= g["hi"] and g["n"] == 5
    # The percentile bootstrap of the mean of logs: its interval matches a hand-rolled one closely.
    rng = np.random.default_rng(0)
    x = np.log([1.0, 4.0, 2.0, 8.0, 0.5])
    means = x[rng.integers(0, 5, (20000, 5))].mean(1)
    assert g["lo"] == pytest.approx(math.exp(np.quantile(means, 0.025)), rel=0.05)
    assert g["hi"] == pytest.approx(math.exp(np.quantile(means, 0.975)), rel=0.05)
    # below 5 groups no interval: a bootstrap of one group printed [0.29, 0.29], which reads as certainty
    for few in ([3.0], [1.0, 4.0, 2.0, 8.0]):
        g = geomean(few)
        assert g["n"] == len(few) and g["lo"] is None and g["hi"] is None and g["geomean"] > 0
    assert fmt_ratio(geomean([3.0])) == "3.00 (n=1)"
    assert geomean([])["geomean"] is None


def test_the_verdict_says_better_worse_indistinguishable_or_too_few():
    from analysis.sweep import verdict_lines

    def g(x, lo, hi, n=8):
        return {"geomean": x, "lo": lo, "hi": hi, "n": n}

    result = {"baseline": "store_all", "ratios": {
        "treewy": {"memory-bound": {"points": 8, "throughput": g(1.5, 1.2, 1.9), "p99_ttft": g(4.0, 2.0, 8.0)},
                   "not memory-bound": {"points": 8, "throughput": g(0.8, 0.7, 0.9), "p99_ttft": g(0.5, 0.4, 0.6)}},
        "replay": {"memory-bound": {"points": 8, "throughput": g(1.02, 0.95, 1.1), "p99_ttft": g(1.0, 0.9, 1.1)},
                   "not memory-bound": {"points": 3, "throughput": g(1.1, None, None, 3), "p99_ttft": g(1.0, None, None, 3)},
                   "unknown": {"points": 0}},
        # significant but negligible (the simulator's 1.00x [1.00, 1.01] read "better"), or just past 2%
        "treewy_deferred": {"not memory-bound": {"points": 9, "throughput": g(1.005, 1.001, 1.01, 9),
                                                 "p99_ttft": g(1.01, 1.001, 1.021, 9)}}}}
    lines = verdict_lines(result)
    assert lines == [
        "treewy vs store_all, memory-bound: output throughput better: 1.50x store_all's [1.20, 1.90] over 8 groups; "
        "p99 TTFT better: 4.00x lower [2.00, 8.00] over 8 groups",
        "treewy vs store_all, not memory-bound: output throughput worse: 0.80x store_all's [0.70, 0.90] over 8 groups; "
        "p99 TTFT worse: 2.00x higher [1.67, 2.50] over 8 groups",
        "replay vs store_all, memory-bound: output throughput indistinguishable: 1.02x store_all's [0.95, 1.10] over 8 "
        "groups; p99 TTFT indistinguishable: 1.00x lower [0.90, 1.10] over 8 groups",
        "replay vs store_all, not memory-bound: output throughput 1.10x store_all's on 3 groups (too few for an "
        "interval); p99 TTFT 1.00x lower on 3 groups (too few for an interval)",
        "treewy_deferred vs store_all, not memory-bound: output throughput equal within 2%: 1.00x store_all's "
        "[1.00, 1.01] over 9 groups; p99 TTFT better: 1.01x lower [1.00, 1.02] over 9 groups",
    ]


# -- the report in a real browser (where Chromium is installed) ------------------

@pytest.mark.skipif(not (shutil.which("chromium") and shutil.which("chromedriver") and shutil.which("pdftoppm")),
                    reason="Debian's chromium, chromium-driver and poppler-utils are not installed")
def test_report_opens_in_headless_chromium_without_console_errors(tmp_path):
    pytest.importorskip("selenium")
    assert harness("sweep", *QUICK, f"out={tmp_path / 's'}").returncode == 0
    out = subprocess.run([sys.executable, "-m", "reports.browser_check", str(tmp_path / "s")], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "0 console errors" in out.stdout
    assert (tmp_path / "s" / "render" / "report-html.png").stat().st_size > 10_000
    assert len(list((tmp_path / "s" / "render").glob("report-pdf-*.png"))) >= 3


def test_a_vllm_server_started_after_the_anchor_logs_beside_the_point_it_starts_for(tmp_path):
    """The anchor measured again runs into anchors/call-NN/; the grid's servers started after it in the same
    command log into the grid's folder, not the anchor's (the engine is created once per command)."""
    from harness.point import _ENGINES, engine_for

    cfg = {"engine": {"name": "vllm", "log_dir": None}}
    try:
        first = engine_for(cfg, Store(tmp_path / "s" / "anchors" / "call-02"))
        assert first.log_dir == tmp_path / "s" / "anchors" / "call-02" / "engine-logs"
        again = engine_for(cfg, Store(tmp_path / "s"))
        assert again is first and again.log_dir == tmp_path / "s" / "engine-logs"
    finally:
        _ENGINES.clear()


def test_points_whose_decode_steps_passed_vllm_s_largest_graph_are_named(tmp_path):
    """A vLLM point whose running requests x (1 + k) tokens passed the largest CUDA graph vLLM captured ran those
    steps without graphs: analysis names it, in the console's summary and on the report's first page. A point
    that does not say what vLLM captured is not guessed at."""
    from analysis.sweep import analyze, graph_line
    from reports.build import summary_lines

    final = ROOT / "results" / "h200-kernel-speed" / "e2e" / "final" / "points"
    cap512 = {"PIECEWISE": {"graphs": 49, "largest": 512}, "FULL": {"graphs": 49, "largest": 512}}
    store = Store(tmp_path / "s")
    store.init({"baseline": "store_all", "sweep_name": "t", "model": "qwen35_35b", "gpu": "h200",
                "thresholds": THRESHOLDS})
    encoder = {"ENCODER": {"graphs": 3, "largest": 16384}}            # vLLM's vision graphs: not the decoder's
    picks = {"sharegpt-gmu0.9-c256-chain3-treewy": {**cap512, **encoder},  # 256 running x 4 tokens = 1024 > 512
             "sharegpt-gmu0.9-c256-chain3-store_all": {**cap512, "PIECEWISE": {"graphs": 145, "largest": 2048}},
             "sharegpt-gmu0.6-c128-chain3-store_all": cap512,        # 48 running x 4 = 192
             "sharegpt-gmu0.6-c256-nospec-store_all": cap512,        # no draft: 209 running x 1 = 209
             "sharegpt-gmu0.9-c128-chain3-treewy": None}             # recorded before capture sizes were
    for pid, capture in picks.items():
        s = json.loads((final / pid / "summary.json").read_text())
        if capture is not None:
            s["telemetry"]["server"]["graph_capture"] = capture
        store.write(pid, s, None)
    result = analyze(store)
    assert result["graph_coverage"] == {"known": 4, "past": ["sharegpt-gmu0.9-c256-chain3-treewy"]}
    rows = {r["point_id"]: r for r in result["points"]}
    assert rows["sharegpt-gmu0.9-c256-chain3-store_all"]["decode_past_graphs"] is False   # 192 x 4 = 768 <= 2048
    assert rows["sharegpt-gmu0.9-c128-chain3-treewy"]["decode_past_graphs"] is None
    line = graph_line(result)
    assert line.startswith("1 of 4 points had decode steps past vLLM's largest CUDA graph (512 tokens")
    assert line in summary_lines(result)
    # the same point with decode graphs up to 1024 tokens: within them
    s = json.loads((store.root / "points" / "sharegpt-gmu0.9-c256-chain3-treewy" / "summary.json").read_text())
    s["telemetry"]["server"]["graph_capture"] = {**cap512, "FULL": {"graphs": 81, "largest": 1024}}
    (store.root / "points" / "sharegpt-gmu0.9-c256-chain3-treewy" / "summary.json").write_text(json.dumps(s))
    again = analyze(store)
    assert again["graph_coverage"]["past"] == [] and graph_line(again) is None
    assert not any("largest CUDA graph" in ln for ln in summary_lines(again))


def test_engine_auto_is_resolved_before_the_overrides_so_engine_keys_reach_the_engine_that_runs(tmp_path, capsys):
    """`engine=auto` (the default) picks the simulator here; `engine.mode=graphs` must set that simulator's mode,
    not fail on auto's config nor be dropped when auto is resolved (the README's paper_35b command)."""
    one = ["sweep=quick", "concurrency=[8]", "strategy=[store_all]", "report=false"]
    runs = {}
    for mode in ("eager", "graphs"):
        out = cli(capsys, "sweep", *one, f"engine.mode={mode}", f"out={tmp_path / mode}")
        assert out.returncode == 0, out.stderr[-2000:]
        assert out.stderr.count("engine=auto: using the simulator") == 1      # said once, where it was decided
        (s,) = Store(tmp_path / mode).summaries()
        assert s["engine"] == "sim" and s["config"]["engine"]["mode"] == mode
        runs[mode] = s["metrics"]["output_throughput"]
    assert runs["graphs"] > 1.2 * runs["eager"]     # the graphs' smaller per-step overhead did apply
    assert json.loads((tmp_path / "graphs" / "sweep.json").read_text())["engine"]["mode"] == "graphs"
    for cmd in (["sweep", "sweep=paper_35b", "gpu=b200"], ["run"]):     # run's engine comes through sweep's defaults
        cfg = cli(capsys, *cmd, "engine.mode=graphs", "--cfg")
        assert cfg.returncode == 0, (cmd, cfg.stderr[-2000:])
        engine = yaml.safe_load(cfg.stdout)["engine"]
        assert engine["name"] == "sim" and engine["mode"] == "graphs", (cmd, engine)
    bad = cli(capsys, "sweep", *one, "engine.mood=graphs", f"out={tmp_path / 'bad'}")
    assert bad.returncode == 2 and "engine.mood" in bad.stderr and not (tmp_path / "bad").exists()


def test_workload_settings_reach_every_swept_workload_that_has_them_and_a_typo_is_refused(tmp_path, capsys):
    """`workload.<key>=` sets the swept workloads' own configs (before, the sweep reloaded each workload's file and
    dropped it, so a Spec-Bench path the user gave ran the bundled questions); a path that does not exist, a key no
    swept workload has, and a trace arrival a sweep cannot offer stop the command before the folder is touched."""
    import pyarrow.parquet as pq

    one = ["concurrency=[8]", "strategy=[store_all]", "draft=[chain:3]", "report=false", "engine=sim"]
    # Spec-Bench's questions with every first turn one short sentence: a point that read this file has short prompts
    mine = tmp_path / "question.jsonl"
    rows = [json.loads(line) for line in (ROOT / "workloads/data/spec_bench/question.jsonl").read_text().splitlines()]
    mine.write_text("".join(json.dumps({**r, "turns": ["Write one short sentence about the sea."] + r["turns"][1:]}) + "\n" for r in rows))
    out = cli(capsys, "sweep", "workload=spec_bench,balanced_chat", f"workload.path={mine}",
              "workload.seed=3", "workload.filters.max_prompt_len=100", *one, f"out={tmp_path / 's'}")
    assert out.returncode == 0, out.stderr[-2000:]
    got = {s["config"]["workload_name"]: s for s in Store(tmp_path / "s").summaries()}
    assert got["spec_bench"]["status"] == "ok" and got["spec_bench"]["config"]["workload"]["path"] == str(mine)
    prompts = pq.read_table(tmp_path / "s" / "points" / got["spec_bench"]["point_id"] / "requests.parquet")
    assert max(prompts.column("prompt_len").to_pylist()) <= 16          # the bundled first turns run to hundreds
    assert got["balanced_chat"]["status"] == "ok" and "path" not in got["balanced_chat"]["config"]["workload"]
    assert {s["config"]["workload"]["seed"] for s in got.values()} == {3}
    # below a key a workload leaves null (Spec-Bench has no filters by default; balanced_chat sets its own)
    assert got["spec_bench"]["config"]["workload"]["filters"] == {"max_prompt_len": 100}
    # one workload of several: its name first (ShareGPT, Spec-Bench and BurstGPT all have a path)
    two = cli(capsys, "sweep", "workload=spec_bench,sharegpt", f"workload.spec_bench.path={mine}",
              *one, f"out={tmp_path / 'two'}")
    assert two.returncode == 0, two.stderr[-2000:]
    got = {s["config"]["workload_name"]: s for s in Store(tmp_path / "two").summaries()}
    assert got["spec_bench"]["config"]["workload"]["path"] == str(mine)
    assert got["sharegpt"]["status"] == "ok" and got["sharegpt"]["config"]["workload"]["path"] is None
    # a path that does not exist would fail every point of its workload: refused before the first
    for bad, why in (("workload.path=/nonexistent/q.jsonl", "workload.path=/nonexistent/q.jsonl (workload=spec_bench): "
                                                            "no such file"),
                     ("workload.pth=/x", "did you mean workload.path"),
                     ("workload.spec_bench.pth=/x", "workload.spec_bench.pth=/x: spec_bench has no pth; did you "
                                                    "mean workload.spec_bench.path"),
                     ("workload.arrival.kind=trace", "arrival.kind=trace")):
        r = cli(capsys, "sweep", "workload=spec_bench", bad, *one, f"out={tmp_path / 'bad'}")
        assert r.returncode == 2 and why in r.stderr, r.stderr[-2000:]
        assert not (tmp_path / "bad").exists()


def test_draft_shapes_parse_as_the_readme_writes_them_and_bad_grid_values_stop_before_the_first_point(tmp_path,
                                                                                                      capsys):
    """A flat list of integers is one tree, a list of shapes an axis; Hydra's bare draft=3,3,3 (three drafts of
    width 3, which the sweep used to run as one level of width 3) is refused with both spellings; parents:[...]
    passes Hydra's grammar; values that used to fail every point, or an empty grid, exit 2 first: among them a
    chain longer than a request may be (it ended in a RecursionError; as a tree it is a shape like any other,
    tests/test_tree.py)."""
    one = ["sweep=quick", "concurrency=[8]", "strategy=[store_all]", "requests.min=20", "requests.per_concurrency=1",
           "report=false", "engine=sim"]
    cases = (("draft=[3,3,3]", ["3,3,3"]), ("draft=[chain:2,'2,2']", ["chain:2", "2,2"]),
             ("draft=[[2,1],chain:1]", ["2,1", "chain:1"]), ("draft=parents:[-1,0,0]", ["parents:[-1,0,0]"]),
             ("draft=chain:2,none", ["chain:2", None]))
    for i, (arg, want) in enumerate(cases):
        out = cli(capsys, "sweep", *one, arg, f"out={tmp_path / f'd{i}'}")
        assert out.returncode == 0, (arg, out.stderr[-2000:])
        got = sorted(Store(tmp_path / f"d{i}").summaries(), key=lambda s: want.index(s["config"]["draft"]))
        assert [s["config"]["draft"] for s in got] == want and all(s["status"] == "ok" for s in got), arg
    (tree,) = Store(tmp_path / "d0").summaries()
    assert tree["point_id"].endswith("-3x3x3-store_all") and tree["metrics"]["acceptance_length"] > 3.3   # 39 nodes
    for bad, why in (("draft=3,3,3", "write draft=[3,3,3] for the (3,3,3) tree"),
                     ("draft=chain:0", "draft=none is speculation off"),
                     ("draft=chain:5000", "draft=chain:5000: a step verifies 5001 tokens per request, more than "
                                          "max_model_len=4096"),
                     ("seed=0,1", "one sweep per model, GPU, engine and seed"),
                     ("seed=[0,1]", "seed=[0, 1]: one whole number per sweep"),
                     ("gmu=[]", "gmu=[]: the grid needs at least one value"),
                     ("jobs=abc", "jobs=abc: must be a whole number"),
                     ("workload.path=/nonexistent", "none of the swept workloads (balanced_chat) has path")):
        r = cli(capsys, "sweep", *one, bad, f"out={tmp_path / 'bad'}")
        assert r.returncode == 2 and why in r.stderr, (bad, r.stderr[-2000:])
        assert not (tmp_path / "bad").exists()


def test_points_sized_by_kv_cache_bytes_are_grouped_and_labelled_by_their_pool_not_by_the_gmu_they_ignore(tmp_path):
    """With engine.kv_cache_bytes the pool is sized outright and gmu sizes nothing: analysis groups points by the
    memory budget their id spells (kv<N>MiB), so two pools at one stored gmu are two groups, never one, and the
    figures and tables say the pool, not the gmu."""
    import matplotlib.pyplot as plt

    from analysis.sweep import analyze, memory_order, memory_title
    from harness.point import point_id
    from reports import build, figures

    store = Store(tmp_path / "s")
    store.init({"baseline": "store_all",
                "thresholds": THRESHOLDS})
    for mib, tput in ((32, 100.0), (64, 300.0)):
        for strategy, factor in (("store_all", 1.0), ("treewy", 2.0)):
            cfg = {"workload_name": "sharegpt", "gmu": 0.9, "load": {"kind": "closed", "concurrency": 8},
                   "draft": "chain:3", "strategy": strategy, "model": {"name": "m"}, "gpu": {"name": "g"},
                   "engine": {"name": "vllm", "kv_cache_bytes": mib * 2**20}}
            store.write(point_id(cfg), {"point_id": point_id(cfg), "status": "ok", "config": cfg, "engine": "vllm",
                                        "metrics": {"output_throughput": tput * factor, "peak_kv_usage": 0.5,
                                                    # evidence that the pool never bound the batch, so the groups
                                                    # are "not memory-bound", not "unknown"
                                                    "preemptions": 0, "memory_evidence": "metrics",
                                                    "blocked_kv_peak": None}}, None)
    result = analyze(store)
    assert sorted(p["memory"] for p in result["points"]) == ["kv32MiB"] * 2 + ["kv64MiB"] * 2
    assert sorted(c["memory"] for c in result["groups"]) == ["kv32MiB", "kv64MiB"]
    assert result["ratios"]["treewy"]["not memory-bound"]["throughput"]["n"] == 2   # two groups, not one
    assert memory_title("kv32MiB") == "KV pool 32 MiB" and memory_title("gmu0.9") == "gmu 0.9"
    assert sorted(["kv64MiB", "kv128MiB", "kv32MiB"], key=memory_order) == \
        ["kv32MiB", "kv64MiB", "kv128MiB"]
    fig = figures.peak_kv_vs_load(figures.Inputs(result)).fig
    assert [ax.get_title() for ax in fig.axes if ax.get_visible()] == ["sharegpt, KV pool 32 MiB",
                                                                       "sharegpt, KV pool 64 MiB"]
    plt.close(fig)
    assert ("memory", "memory") in build.COLUMNS and ("gmu", "gmu") not in build.COLUMNS
    same = harness("compare", str(store.root), str(store.root))       # a folder against itself: every point common
    assert same.returncode == 0, same.stderr[-2000:]
    assert "sharegpt KV pool 32 MiB c8 chain:3 treewy" in same.stdout and "4 common points" in same.stdout


def test_a_figure_is_one_registered_function_and_the_report_draws_every_one(tmp_path, monkeypatch):
    """Adding a report figure is one function with @figure(title) in reports/figures.py: the report draws it, in
    the order of definition, and leaves out a figure with nothing to draw (None)."""
    import matplotlib.pyplot as plt

    from reports import build, figures

    out = harness("sweep", *QUICK, f"out={tmp_path / 's'}", "concurrency=[8]", "report=false")
    assert out.returncode == 0, out.stderr[-3000:]
    drawn = []
    monkeypatch.setattr(figures, "FIGURES", list(figures.FIGURES))     # the registrations below end with the test

    @figures.figure("A new figure")
    def new(inp):
        drawn.append(len(inp.result["points"]))
        fig, _ = plt.subplots()
        return fig

    @figures.figure("Nothing to draw here")
    def empty(inp):
        return None

    report = build.build_report(Store(tmp_path / "s"))
    html = (report / "report.html").read_text()
    assert drawn == [2] and "A new figure" in html and "Nothing to draw here" not in html
    titles = [t for t, _ in figures.FIGURES]
    assert titles.index("Peak KV-pool usage vs load") < titles.index("A new figure")



# -- a union of sub-grids ---------------------------------------------------------

def _points(*overrides):
    from omegaconf import OmegaConf

    from harness.grid import compose_sweep, point_configs

    return point_configs(OmegaConf.to_container(compose_sweep(list(overrides)), resolve=True))


def test_the_campaign_preset_is_exactly_the_issue_s_grid_as_a_union_of_sub_grids():
    """sweep=h200_35b_campaign: every strategy and speculation off at gmu 0.6 and 0.9, store_all and treewy also at
    0.75, on ShareGPT; speculation off, store_all and treewy on Spec-Bench; PIECEWISE for store_all and treewy at
    gmu 0.6 (ShareGPT) as a variant whose ids carry it; five concurrencies; fewer requests at concurrency 1."""
    from harness.identity import sweep_identity
    from harness.point import point_id

    pts = _points("sweep=h200_35b_campaign")
    ids = [point_id(p) for p in pts]
    assert len(ids) == len(set(ids)) == 110
    want = set()
    for c in (1, 16, 64, 128, 256):
        for w, gmus, strategies in (("sharegpt", (0.6, 0.9), ("store_all", "treewy", "replay", "treewy_deferred")),
                                    ("sharegpt", (0.75,), ("store_all", "treewy")),
                                    ("spec_bench", (0.6, 0.75, 0.9), ("store_all", "treewy"))):
            for g in gmus:
                want |= {f"{w}-gmu{g:g}-c{c}-chain3-{s}" for s in strategies}
                if g != 0.75:
                    want.add(f"{w}-gmu{g:g}-c{c}-nospec-store_all")
        want |= {f"sharegpt-gmu0.6-piecewise-c{c}-chain3-{s}" for s in ("store_all", "treewy")}
    assert set(ids) == want
    by = {point_id(p): p for p in pts}
    assert {p["engine"]["cudagraph_mode"] for p in pts if p.get("variant")} == {"PIECEWISE"}
    assert {p["engine"]["cudagraph_mode"] for p in pts if not p.get("variant")} == {None}   # vLLM's default
    assert all(p["engine"]["max_cudagraph_capture_size"] == 2048 for p in pts)
    assert by["sharegpt-gmu0.6-c1-chain3-treewy"]["requests"] == 64
    assert by["sharegpt-gmu0.6-c128-chain3-treewy"]["requests"] == 256       # h200_kernel_speed's rule
    assert by["spec_bench-gmu0.9-c256-nospec-store_all"]["requests"] == 512
    # the kernel-speed issue's end-to-end points are a subset, with the same settings
    ks = {point_id(p): p for p in _points("sweep=h200_kernel_speed")}
    assert set(ks) <= set(by) and all(ks[i]["engine"] == by[i]["engine"] and ks[i]["requests"] == by[i]["requests"]
                                      for i in ks)
    ident = sweep_identity(pts, "store_all", None)
    assert ident["variants"]["piecewise"]["settings"]["cudagraph_mode"] == "PIECEWISE"
    assert ident["engine"]["settings"]["cudagraph_mode"] is None


def test_the_preset_s_axes_filter_its_sub_grids_and_bad_sub_grids_are_named(tmp_path):
    from harness.point import point_id

    ids = {point_id(p) for p in _points("sweep=h200_35b_campaign", "gmu=[0.75]", "concurrency=[128]")}
    assert ids == {f"{w}-gmu0.75-c128-chain3-{s}" for w in ("sharegpt", "spec_bench") for s in ("store_all", "treewy")}
    flat = _points("sweep=h200_35b_campaign", "grids=null", "concurrency=[128]")   # one Cartesian product again
    assert len(flat) == 2 * 3 * (4 + 1)
    for overrides, match in (
            (["gmu=[0.5]"], r"gmu=0.5: no sub-grid of sweep=h200_35b_campaign has it \(they have 0.6, 0.9, 0.75\)"),
            (["workloads=[spec_bench]", "strategy=[replay]"], "select no point of sweep=h200_35b_campaign"),
            (["grids=[{gmu:[0.6],colour:[red]}]"], r"grids\[0\] of sweep=h200_35b_campaign: colour is not a sub-grid key"),
            (["grids=[{gmu:[0.6],engine:{cudagraph_mode:PIECEWISE}}]"], "need a variant name"),
            (["grids=[{variant:Bad-Name,engine:{cudagraph_mode:PIECEWISE}}]"], "variant='Bad-Name'"),
            (["grids=[{variant:p,engine:{cudagraph_mod:PIECEWISE}}]"], r"engine.cudagraph_mod is not a setting of "
                                                                          "engine=vllm"),
            (["grids=[{variant:p,engine:{cudagraph_mode:PIECEWISE}},{variant:p,engine:{enforce_eager:true}}]"],
             "one name per set of settings"),
            (["grids=3"], "a list of sub-grids"),
            (["requests.at_concurrency={1:0}"], r"requests.at_concurrency=\{1: 0\}")):
        with pytest.raises(ValueError, match=match):
            _points("sweep=h200_35b_campaign", *overrides)


def test_a_variant_s_points_run_analyse_and_resume_in_their_own_groups(tmp_path, capsys):
    """A sub-grid that changes an engine setting (here the simulator's graph mode) runs under ids that carry its
    name; analysis compares its strategies within its own groups, never with the plain points at the same gmu;
    sweep.json records the sub-grids and the identity the variant's settings; a rerun resumes."""
    from analysis.sweep import analyze, memory_order, memory_title

    grids = "grids=[{gmu:[0.6]},{variant:graphs,gmu:[0.6],concurrency:[8],engine:{mode:graphs}}]"
    args = ("sweep", *QUICK, grids, "gmu=0.6", "report=false", f"out={tmp_path / 's'}")
    out = cli(capsys, *args)
    assert out.returncode == 0, out.stderr[-3000:]
    store = Store(tmp_path / "s")
    ids = sorted(s["point_id"] for s in store.summaries())
    assert ids == sorted([f"balanced_chat-gmu0.6-c{c}-chain3-{s}" for c in (8, 128) for s in ("store_all", "treewy")]
                         + [f"balanced_chat-gmu0.6-graphs-c8-chain3-{s}" for s in ("store_all", "treewy")])
    steps = {s["point_id"]: s["config"]["engine"]["mode"] for s in store.summaries()}
    assert {m for i, m in steps.items() if "-graphs-" in i} == {"graphs"}
    assert {m for i, m in steps.items() if "-graphs-" not in i} == {"eager"}
    result = analyze(store)
    assert sorted((g["memory"], g["load"]) for g in result["groups"]) == [
        ("gmu0.6", 8.0), ("gmu0.6", 128.0), ("gmu0.6-graphs", 8.0)]
    assert result["ratios"]["treewy"]["not memory-bound"]["points"] + \
        result["ratios"]["treewy"]["memory-bound"]["points"] == 3
    assert memory_title("gmu0.6-graphs") == "gmu 0.6 (graphs)"
    assert sorted(["gmu0.6-graphs", "gmu0.9", "gmu0.6"], key=memory_order) == ["gmu0.6", "gmu0.6-graphs", "gmu0.9"]
    sweep = json.loads((tmp_path / "s" / "sweep.json").read_text())
    assert sweep["grids"][1]["variant"] == "graphs"
    assert sweep["identity"]["variants"]["graphs"]["settings"]["mode"] == "graphs"
    again = cli(capsys, *args)
    assert again.returncode == 0 and "6 already in" in again.stdout, again.stdout
    # the variant's settings are its identity: the same name with another mode is another experiment
    other = cli(capsys, "sweep", *QUICK, grids.replace("mode:graphs", "mode:eager"), "gmu=0.6", "report=false",
                f"out={tmp_path / 's'}")
    assert other.returncode == 2 and "variants.graphs.settings.mode" in other.stderr, other.stderr
