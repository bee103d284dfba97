"""Memory-bound means the baseline's KV pool bound its batch (analysis.regimes.memory_bound): a preemption, or
requests that waited for blocks, by the simulator's own admission decisions or, on vLLM, in one /metrics sample
(waiting, seats free, usage at the threshold). Waiting for a batch slot is not memory; no evidence is unknown."""

from __future__ import annotations

import pytest

from analysis.regimes import Thresholds, memory_bound
from analysis.sweep import analyze
from harness.engines.vllm.scrape import Sampler
from harness.store import Store
from tests.test_sweep import cli

TH = Thresholds(peak_kv_usage=0.95, preemptions=1)


@pytest.mark.parametrize("metrics, bound, reason", [
    # the simulator: its scheduler's decisions
    ({"memory_evidence": "admission", "memory_refusals": 12, "preemptions": 0, "peak_kv_usage": 0.99}, True,
     "refused for blocks at 12 steps"),
    ({"memory_evidence": "admission", "memory_refusals": 0, "preemptions": 0, "peak_kv_usage": 0.99,
      "wait_batch_slot_s": 500.0}, False, "queued for a batch slot: 500"),
    ({"memory_evidence": "admission", "memory_refusals": 0, "preemptions": 2}, True, "2 preemptions"),
    # vLLM: the same /metrics sample
    ({"memory_evidence": "metrics", "blocked_kv_peak": 0.97, "preemptions": 0}, True, "at 97% KV usage"),
    ({"memory_evidence": "metrics", "blocked_kv_peak": 0.95, "preemptions": 0}, True, "at 95% KV usage"),
    ({"memory_evidence": "metrics", "blocked_kv_peak": 0.50, "preemptions": 0, "peak_kv_usage": 0.99}, False,
     "never bound"),       # waited with seats free at half a pool (the token budget); full at another moment
    ({"memory_evidence": "metrics", "blocked_kv_peak": None, "preemptions": 0, "peak_kv_usage": 0.99}, False,
     "never bound"),
    ({"memory_evidence": "metrics", "blocked_kv_peak": 0.99, "preemptions": None}, True, "at 99% KV usage"),
    # missing telemetry is unknown, never "not memory-bound"
    ({"memory_evidence": "metrics", "blocked_kv_peak": 0.5, "preemptions": None}, None, "no preemption counter"),
    ({"preemptions": 0, "waiting_for_memory_s": 3.0, "peak_kv_usage": 0.99}, None, "no memory-bound evidence"),
    ({}, None, "unknown"),
    # a point stored before the evidence was recorded, whose queue never waited with seats free: known
    ({"preemptions": 0, "waiting_for_memory_s": 0, "peak_kv_usage": 0.99}, False, "never bound"),
])
def test_memory_bound_rules(metrics, bound, reason):
    got, why = memory_bound(metrics, TH)
    assert got is bound and reason in why, why


def _sampler(samples) -> Sampler:
    s = Sampler("http://unused", hz=4)
    for i, (kv, running, waiting) in enumerate(samples):
        s.add(i * 0.25, kv, running, waiting)
    return s


def test_vllm_samples_split_waiting_for_a_batch_slot_from_waiting_with_seats_free():
    # every seat taken at 35% of the pool (concurrency 512 over max_num_seqs 64): a batch slot, not memory
    full = _sampler([(0.35, 64, 448)] * 8).summary(max_num_seqs=64)
    assert full["memory_evidence"]["blocked_kv_peak"] is None and full["memory_evidence"]["blocked_samples"] == 0
    assert full["waiting_s"]["batch_slot"] == pytest.approx(8 * 0.25 * 448) and full["waiting_s"]["free_seats"] == 0
    # seats free while the pool is full in the same sample: memory; a full pool in another sample does not count
    s = _sampler([(0.99, 64, 10), (0.60, 40, 5), (0.97, 40, 3), (0.99, 50, 0)]).summary(max_num_seqs=64)
    assert s["memory_evidence"] == {"source": "metrics", "samples": 4, "blocked_samples": 2, "blocked_kv_peak": 0.97}
    assert s["peak_kv_usage"] == 0.99


def test_a_gauge_vllm_did_not_export_is_missing_not_zero():
    s = _sampler([(None, 40, 3), (0.9, None, 3)]).summary(max_num_seqs=64)
    assert s["memory_evidence"] is None and s["metrics_incomplete"] == 2
    assert memory_bound({"preemptions": 0, "waiting_for_memory_s": s["waiting_for_memory_s"],
                         "memory_evidence": None}, TH)[0] in (None, False)
    s = _sampler([(None, 40, 3), (0.97, 40, 3)]).summary(max_num_seqs=64)
    assert s["memory_evidence"]["samples"] == 1 and s["memory_evidence"]["blocked_kv_peak"] == 0.97


def test_queueing_for_a_batch_slot_is_not_memory_bound_in_the_simulator(tmp_path, capsys):
    out = tmp_path / "s"
    r = cli(capsys, "sweep", "engine=sim", "gpu=h200", "workload=sharegpt", "gmu=[0.9]", "concurrency=[512]",
            "max_num_seqs=64", "strategy=[store_all]", "draft=[chain:3]", "requests.min=600", "report=false",
            f"out={out}")
    assert r.returncode == 0, r.stdout + r.stderr
    (p,) = Store(out).summaries()
    m = p["metrics"]
    assert m["peak_kv_usage"] < 0.5 and m["preemptions"] == 0 and m["memory_refusals"] == 0
    assert m["wait_batch_slot_s"] > 0 and m["wait_memory_s"] == 0
    a = analyze(Store(out))
    assert a["counts"]["memory_bound"] == 0 and "batch slot" in a["groups"][0]["reason"]


def test_only_the_baseline_classifies_a_point(tmp_path, capsys):
    out = tmp_path / "s"
    r = cli(capsys, "sweep", "engine=sim", "gpu=h200", "workload=sharegpt", "gmu=[0.6]", "concurrency=[32,64,96]",
            "strategy=[store_all,treewy]", "draft=[chain:3]", "requests.min=64", "requests.per_concurrency=2",
            "report=false", f"out={out}")
    assert r.returncode == 0, r.stdout + r.stderr
    own = {(s["config"]["load"]["concurrency"], s["config"]["strategy"]): memory_bound(s["metrics"], TH)[0]
           for s in Store(out).summaries()}
    # the pin bites only where the two strategies' own verdicts differ
    assert any(own[(c, "store_all")] != own[(c, "treewy")] for c in (32, 64, 96)), own
    for base in ("store_all", "treewy"):
        a = analyze(Store(out), baseline=base)
        for g in a["groups"]:
            assert g["memory_bound"] is own[(g["load"], base)]
        for p in a["points"]:
            if p["status"] == "ok":
                assert p["memory_bound"] is own[(p["load"], base)]


def test_an_open_loop_point_behind_its_arrival_schedule_is_flagged_in_the_summary_and_the_report(tmp_path, capsys):
    import json

    from reports.build import summary_lines

    out = tmp_path / "s"
    r = cli(capsys, "sweep", "engine=sim", "gpu=h200", "workload=sharegpt", "gmu=[0.9]", "concurrency=[4,8]",
            "strategy=[store_all]", "draft=[chain:3]", "requests.min=16", "report=false", f"out={out}")
    assert r.returncode == 0 and analyze(Store(out))["behind_schedule"] == []
    # the load generator's own check, as the vLLM engine records it, says this point fell behind
    path = next((out / "points").glob("*c8*/summary.json"))
    s = json.loads(path.read_text())
    s["telemetry"]["loadgen"] = {"kind": "poisson", "on_schedule": False, "lag_p99_s": 0.25, "rate_error": -0.12}
    path.write_text(json.dumps(s))
    a = analyze(Store(out))
    assert [b["point_id"] for b in a["behind_schedule"]] == [s["point_id"]]
    assert any("behind its arrival schedule (p99 lag 250 ms, achieved rate -12.0%" in x for x in summary_lines(a))
    r = cli(capsys, "analyze", str(out))
    assert "behind schedule" in r.stdout and s["point_id"] in r.stdout
