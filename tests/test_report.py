"""The reports as a reader gets them: several folders in one report, the exports in vllm bench serve's names, the
percentile choice, and every committed report in a real browser (where Chromium is installed; CI installs it)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SWEEP = ROOT / "results" / "h200-vllm-sweep"          # store_all and treewy (torch path), H200
FUSED = ROOT / "results" / "h200-vllm-treewy-fused"   # treewy alone (the fused kernel), same settings


def harness(*args, timeout=600):
    return subprocess.run([sys.executable, "-m", "harness", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)


def _tree(folder: Path) -> dict[str, int]:
    return {str(p.relative_to(folder)): p.stat().st_mtime_ns for p in folder.rglob("*") if p.is_file()}


def test_two_folders_make_one_report_against_one_baseline_without_writing_into_either(tmp_path):
    """A single-strategy folder (the fused-kernel treewy run) rendered an empty ratio table alone; reported with the
    sweep that has store_all, its treewy points become a series of their own against the same baseline."""
    before = {f: _tree(f) for f in (SWEEP, FUSED)}
    r = harness("report", str(SWEEP), str(FUSED))
    assert r.returncode == 2 and "give out=DIR" in r.stderr
    r = harness("report", str(SWEEP), str(FUSED), f"out={tmp_path / 'both'}")
    assert r.returncode == 2 and "baselines differ (store_all, treewy); give baseline=STRATEGY" in r.stderr
    r = harness("report", str(SWEEP), f"out={tmp_path / 'x'}")
    assert r.returncode == 2 and "baseline= and out= are for a report of several folders" in r.stderr
    r = harness("report", str(SWEEP), str(FUSED), "baseline=store_all", f"out={tmp_path / 'both'}")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "renamed: sharegpt-gmu0.6-c128-chain3-treewy@h200-vllm-treewy-fused" in r.stdout
    a = json.loads((tmp_path / "both" / "analysis.json").read_text())
    assert set(a["ratios"]) == {"treewy", "treewy@h200-vllm-treewy-fused"} and a["baseline"] == "store_all"
    fused = a["ratios"]["treewy@h200-vllm-treewy-fused"]
    assert sum(row["points"] for row in fused.values()) == 2        # its c64 and c128 points, each beside store_all's
    by = {p["point_id"]: p for p in a["points"]}
    want = [by[f"sharegpt-gmu0.6-c{c}-chain3-treewy@h200-vllm-treewy-fused"]["output_throughput"]
            / by[f"sharegpt-gmu0.6-c{c}-chain3-store_all"]["output_throughput"] for c in (64, 128)]
    (got,) = [v["throughput"] for v in fused.values() if v["points"]]      # both groups in one regime
    assert got["n"] == 2 and got["geomean"] == pytest.approx((want[0] * want[1]) ** 0.5)
    html = (tmp_path / "both" / "report.html").read_text()
    assert "points of 2 folders" in html and "treewy@h200-vllm-treewy-fused vs store_all" in html
    assert {f: _tree(f) for f in (SWEEP, FUSED)} == before            # neither input was written
    bench = json.loads((tmp_path / "both" / "bench_serve.json").read_text())
    assert len(bench) == 10 and {b["strategy"] for b in bench} == {"store_all", "treewy",
                                                                   "treewy@h200-vllm-treewy-fused"}


def test_the_points_table_and_export_show_the_percentiles_chosen(tmp_path):
    out = tmp_path / "s"
    r = harness("sweep", "sweep=quick", "engine=sim", "concurrency=[8]", "percentiles.values=[50,90]",
                f"out={out}")
    assert r.returncode == 0, r.stderr[-3000:]
    html = (out / "report.html").read_text()
    assert "TTFT p90 ms" in html and "TTFT p99 ms" not in html and "ITL p90 ms" in html
    # the queue for memory in one unit on both engines (request-seconds): the simulator's refusals for blocks
    a = json.loads((out / "analysis.json").read_text())
    assert all(p["queued_for_memory_s"] == p["wait_memory_s"] is not None for p in a["points"])
    assert "queued for memory, request-s" in html
    bench = json.loads((out / "bench_serve.json").read_text())
    assert "p90_tpot_ms" in bench[0] and "p99_tpot_ms" not in bench[0]
    assert bench[0]["p90_ttft_ms"] >= bench[0]["median_ttft_ms"] > 0
    r = harness("report", str(out), "percentiles.values=[75]")
    assert r.returncode == 2 and "percentiles.values=[75]: every point records p50/p90/p95/p99 only" in r.stderr
    r = harness("sweep", "sweep=quick", "engine=sim", "percentiles.metrics=[ttft,latency]", f"out={tmp_path / 'b'}")
    assert r.returncode == 2 and "'latency' is not one of ttft, tpot, itl, e2el" in r.stderr
    assert not (tmp_path / "b").exists()                        # refused before the first point


# -- every committed report in a real browser ------------------------------------------

def committed_reports() -> list[Path]:
    """The report folders under results/ that git tracks (a sweep's own results/sweeps/ is not committed)."""
    out = subprocess.run(["git", "ls-files", "results"], cwd=ROOT, capture_output=True, text=True)
    names = out.stdout.split() if out.returncode == 0 else [str(p.relative_to(ROOT)) for p in ROOT.glob("results/**/*")]
    return sorted({(ROOT / n).parent for n in names if n.endswith("/report.html")})


BROWSER = bool(shutil.which("chromium") and shutil.which("chromedriver") and shutil.which("pdftoppm"))
REQUIRED = os.environ.get("COMMITBENCH_REQUIRE_BROWSER") == "1"     # .ci/run: a missing browser fails, never skips


def _need_browser():
    if not BROWSER:
        if REQUIRED:
            pytest.fail("COMMITBENCH_REQUIRE_BROWSER=1 but Debian's chromium, chromium-driver or poppler-utils is "
                        "missing: apt-get install chromium chromium-driver poppler-utils")
        pytest.skip("Debian's chromium, chromium-driver and poppler-utils are not installed")
    if REQUIRED:
        import selenium  # noqa: F401  (the browser extra; a missing one fails in CI)
    else:
        pytest.importorskip("selenium")


def test_every_committed_report_opens_clean_with_its_verdict_setup_and_figures(tmp_path):
    _need_browser()
    from reports.browser_check import check

    reports = committed_reports()
    assert len(reports) >= 8
    for folder in reports:
        name = str(folder.relative_to(ROOT)).replace("/", "_")
        found: dict[str, int] = {}
        assert check(folder, tmp_path / name, dpi=30, found=found) == 0, folder   # 30 dpi: every page, quickly
        # every committed report compares two strategies or more: each view has something to draw, and each
        # figure the page holds decoded in the browser
        html = (folder / "report.html").read_text()
        assert found["figures"] == html.count("<figure>") >= 14 and found["figures broken"] == 0, (folder, found)
        assert found["verdict"] >= 1 and found["setup line"] == 1 and found["points table"] >= 2, (folder, found)
        pages = sorted((tmp_path / name).glob("report-pdf-*.png"))
        assert len(pages) == found["pages"] >= 5 + found["figures"], folder      # a page per figure, and tables
        assert all(p.stat().st_size > 2_000 for p in pages), folder


def test_repeats_give_each_design_point_the_mean_of_its_runs_and_their_spread(tmp_path):
    """repeats=N runs every design point N times (repeat r > 1 as <id>-r<r>, drawing with seed + r - 1);
    analysis reports one row per design point: the mean of its runs, and their spread (max - min) / mean."""
    from harness.store import Store

    out = tmp_path / "s"
    r = harness("sweep", "sweep=quick", "engine=sim", "concurrency=[128]", "repeats=3", f"out={out}")
    assert r.returncode == 0, r.stderr[-3000:]
    runs = {s["point_id"]: s for s in Store(out).summaries()}
    assert sorted(runs) == sorted(f"balanced_chat-gmu0.9-c128-chain3-{s}{rep}" for s in ("store_all", "treewy")
                                  for rep in ("", "-r2", "-r3"))
    assert [runs[f"balanced_chat-gmu0.9-c128-chain3-treewy{rep}"]["provenance"]["seed"]
            for rep in ("", "-r2", "-r3")] == [0, 1, 2]
    a = json.loads((out / "analysis.json").read_text())
    assert a["counts"]["ok"] == 2 and a["counts"]["runs"] == 6 and a["counts"]["repeats"] == 3
    for p in a["points"]:
        tput = [runs[pid]["metrics"]["output_throughput"] for pid in p["repeat_ids"]]
        assert len(tput) == 3 and len(set(tput)) > 1                 # the runs drew differently
        assert p["output_throughput"] == pytest.approx(sum(tput) / 3)
        assert p["output_throughput_spread"] == pytest.approx((max(tput) - min(tput)) / (sum(tput) / 3))
    by = {p["strategy"]: p for p in a["points"]}
    want = by["treewy"]["output_throughput"] / by["store_all"]["output_throughput"]
    assert a["ratios"]["treewy"]["not memory-bound"]["throughput"]["geomean"] == pytest.approx(want)
    html = (out / "report.html").read_text()
    assert "each the mean of up to 3 repeated runs" in html and "out tok/s spread %" in html
    r = harness("sweep", "sweep=quick", "engine=sim", "repeats=0", f"out={tmp_path / 'b'}")
    assert r.returncode == 2 and "repeats=0: the runs of every design point" in r.stderr


def test_a_later_folder_s_strategy_is_renamed_whole_even_where_only_one_point_collides(tmp_path):
    """Folder B's treewy run shares one point id with A: every B treewy point becomes treewy@B, so one run is one
    series (before, its other point joined A's treewy line)."""
    from harness.store import Merged

    b = tmp_path / "fused"
    shutil.copytree(FUSED, b)
    pts = b / "points"
    shutil.copytree(pts / "sharegpt-gmu0.6-c64-chain3-treewy", pts / "sharegpt-gmu0.6-c32-chain3-treewy")
    s = json.loads((b / "points" / "sharegpt-gmu0.6-c32-chain3-treewy" / "summary.json").read_text())
    s["point_id"], s["config"]["load"]["concurrency"] = "sharegpt-gmu0.6-c32-chain3-treewy", 32   # A has no c32
    (b / "points" / "sharegpt-gmu0.6-c32-chain3-treewy" / "summary.json").write_text(json.dumps(s))
    m = Merged([SWEEP, b], tmp_path / "out", "store_all")
    from_b = {s["point_id"]: s["config"]["strategy"] for s in m.summaries() if m._of(s["point_id"])[0].root == b}
    assert from_b == {f"sharegpt-gmu0.6-c{c}-chain3-treewy@fused": "treewy@fused" for c in (32, 64, 128)}
    assert m.requests("sharegpt-gmu0.6-c32-chain3-treewy@fused")            # read from B under its own id
    with pytest.raises(ValueError, match="baseline=store_al: no folder has points of it"):
        Merged([SWEEP, b], tmp_path / "out", "store_al").sweep_config()


def test_repeats_collapse_keeps_the_strongest_evidence_and_a_finished_run_s_id():
    """A design point whose first run failed reads its requests from a run that finished; a run that recorded no
    memory-bound evidence (None) does not erase another run's; an id that merely ends in -r2 is not a repeat."""
    from analysis.repeats import collapse, design_id

    def row(rep, tput, blocked, status="ok"):
        pid = "w-gmu0.6-c8-chain3-treewy" + (f"-r{rep}" if rep > 1 else "")
        return {"point_id": pid, "design_id": design_id(pid, rep), "repeat": rep, "status": status,
                "output_throughput": tput, "blocked_kv_peak": blocked, "preemptions": None,
                "memory_evidence": "metrics"}

    failed = [row(1, None, None, "failed")]
    (one,) = collapse([row(2, 100.0, None), row(3, 300.0, 0.97)], failed)
    assert one["point_id"] == "w-gmu0.6-c8-chain3-treewy-r2" and one["design_id"] == "w-gmu0.6-c8-chain3-treewy"
    assert one["repeats"] == 2 and one["runs_failed"] == 1 and one["output_throughput"] == 200.0
    assert one["blocked_kv_peak"] == 0.97 and one["preemptions"] is None
    assert one["output_throughput_spread"] == pytest.approx(1.0)
    assert design_id("my-strategy-r2", 1) == "my-strategy-r2" and design_id("x-r3", 2) == "x-r3"


def test_figures_keep_a_concurrency_and_a_rate_of_the_same_number_apart():
    """Closed-loop concurrency 8 and an open 8 req/s are different loads: separate groups and panels."""
    from reports import figures

    def pt(kind, strategy, tput):
        return {"point_id": f"{kind}-{strategy}", "workload": "w", "memory": "gmu0.9", "load": 8.0, "load_kind": kind,
                "draft": "chain:3", "strategy": strategy, "series": strategy, "status": "ok",
                "output_throughput": tput, "memory_bound": False}

    result = {"engine": "sim", "baseline": "store_all", "points": [
        pt("concurrency", "store_all", 100.0), pt("concurrency", "treewy", 200.0),
        pt("poisson rate", "store_all", 100.0), pt("poisson rate", "treewy", 50.0)]}
    groups = figures._groups(result)
    assert len(groups) == 2 and all(len(by) == 2 for by in groups.values())
    assert len(figures._panels(result)) == 2
    ratios = sorted(by["treewy"]["output_throughput"] / by["store_all"]["output_throughput"] for by in groups.values())
    assert ratios == [0.5, 2.0]          # merged under one key, one would have replaced the other
