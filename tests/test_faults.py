"""Fault injection: a sweep killed (SIGKILL, the whole process group) at seeded random moments, while it runs
points and while it writes its report, loses no finished point and no good report, and ends equal to an
uninterrupted run of the same command."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq

from harness.store import Store

ROOT = Path(__file__).resolve().parents[1]
# 12 simulator points (~1 s of points, the rest is Python start-up, analysis and the report)
SWEEP = ["sweep", "sweep=quick", "gpu=h200", "engine=sim", "concurrency=[2,4,8,16,32,64]",
         "workload=balanced_chat"]
KILLS = 12     # 6 while points run (a fresh or partial folder), 6 in commands that only analyse and report (the
#                last 3 of them while the PDF is written)


def _command(out: Path) -> list[str]:
    return [sys.executable, "-m", "harness", *SWEEP, f"out={out}"]


def _finished(out: Path) -> dict[str, bytes]:
    """The finished points: point id -> its requests.parquet's bytes (a kill must never take one away)."""
    store = Store(out)
    return {s["point_id"]: (out / "points" / s["point_id"] / "requests.parquet").read_bytes()
            for s in store.summaries() if s["status"] == "ok"}


def _whole_pdf(path: Path) -> bool:
    data = path.read_bytes() if path.is_file() else b""
    return data.startswith(b"%PDF") and b"%%EOF" in data[-64:]


def _kill_after(out: Path, seconds: float) -> None:
    proc = subprocess.Popen(_command(out), cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        proc.wait(timeout=seconds)            # it may finish first: then nothing was killed
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _kill_while_writing_the_pdf(out: Path, delay_s: float) -> bool:
    """Kill the command ``delay_s`` after it starts writing its PDF (report.pdf or a temporary beside it
    changes), the few hundred ms a random moment rarely hits; False if it finished first."""
    def stamp():
        return {p.name: p.stat().st_mtime_ns for p in out.glob("*report.pdf*") if p.is_file()}

    before = stamp()
    proc = subprocess.Popen(_command(out), cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    while proc.poll() is None:
        try:
            now = stamp()
        except FileNotFoundError:             # a temporary renamed away between the glob and its stat
            continue
        if now != before:
            time.sleep(delay_s)
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            return True
        time.sleep(0.002)
    return False


def test_random_kills_lose_no_finished_point_and_no_good_report(tmp_path):
    clean = tmp_path / "clean"
    t0 = time.perf_counter()
    done = subprocess.run(_command(clean), cwd=ROOT, capture_output=True, text=True, timeout=300)
    whole_s = time.perf_counter() - t0
    assert done.returncode == 0, done.stderr[-2000:]
    rng = random.Random(20261206)
    out = tmp_path / "killed"
    seen: dict[str, bytes] = {}
    good_report = False
    kinds, in_pdf = [], 0
    for i in range(KILLS):
        if i == KILLS // 2:                   # the points are all in from here on: kills land in analysis/report
            assert subprocess.run(_command(out), cwd=ROOT, capture_output=True, timeout=300).returncode == 0
            seen, good_report = _finished(out), True
        if i >= KILLS - 3:                    # the last three inside the PDF's write
            in_pdf += _kill_while_writing_the_pdf(out, rng.uniform(0.0, 0.05))
        else:                                 # a moment in the command's life: start, points, analysis, figures
            _kill_after(out, rng.uniform(0.3, whole_s))
        now = _finished(out) if (out / "points").is_dir() else {}
        lost = {p for p in seen if now.get(p) != seen[p]}
        assert not lost, f"kill {i}: finished points lost or changed: {sorted(lost)}"
        store = Store(out)
        damaged = [p.name for p in store.points.glob("[!.]*") if store.damage(p.name)] if store.points.is_dir() else []
        assert not damaged, f"kill {i}: points left half-written: {damaged}"
        if good_report:
            assert _whole_pdf(out / "report.pdf"), f"kill {i}: the last good report.pdf was lost or truncated"
            assert (out / "report.html").read_text().rstrip().endswith("</html>")
            json.loads((out / "analysis.json").read_text())
        kinds.append("points" if i < KILLS // 2 else "report")
        seen = now
    final = subprocess.run(_command(out), cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert final.returncode == 0, final.stderr[-2000:]
    # the same points with the same requests as the uninterrupted run, and the same analysis of them
    a, b = _finished(clean), _finished(out)
    assert sorted(a) == sorted(b) and len(a) == 12
    for p in a:
        assert pq.read_table(clean / "points" / p / "requests.parquet").equals(
            pq.read_table(out / "points" / p / "requests.parquet")), p
    ra, rb = (json.loads((d / "analysis.json").read_text()) for d in (clean, out))
    assert ra["ratios"] == rb["ratios"] and ra["counts"] == rb["counts"] and ra["groups"] == rb["groups"]
    assert _whole_pdf(out / "report.pdf")
    # only hidden temporaries of killed writers may differ between the folders
    files = lambda d: sorted(str(p.relative_to(d)) for p in d.rglob("*")          # noqa: E731
                             if p.is_file() and not any(part.startswith(".") for part in p.relative_to(d).parts))
    assert files(clean) == files(out)
    assert kinds.count("report") == KILLS // 2 and in_pdf >= 2, in_pdf
