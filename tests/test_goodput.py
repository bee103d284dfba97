"""Goodput as `vllm bench serve --goodput` counts it, the SLOs' checks, and the highest load meeting them."""

from __future__ import annotations

import json

import pytest

from analysis.goodput import SLO, goodput, is_good, max_load_meeting
from tests.test_sweep import cli

QUICK = ["sweep", "sweep=quick", "gpu=h200", "engine=sim", "workload=spec_bench", "concurrency=[2,64]",
         "report=false"]


def req(ttft_s: float, decode_s: float, tokens: int, error: str | None = None) -> dict:
    """A request that arrived at 10 s: its first token after ``ttft_s``, the rest ``decode_s`` later."""
    return {"arrival_s": 10.0, "first_token_s": 10.0 + ttft_s, "finish_s": 10.0 + ttft_s + decode_s,
            "output_tokens": tokens, "error": error}


def test_a_request_is_good_when_it_meets_every_objective():
    slo = SLO(ttft_ms=2000, tpot_ms=50)
    assert is_good(req(1.5, 0.4, 11), slo)                    # TPOT (E2E - TTFT) / (11 - 1) = 40 ms
    assert not is_good(req(1.5, 0.6, 11), slo)                # 60 ms per token
    assert not is_good(req(1.0, 0.52, 11), slo)               # 52 ms: the first token is not one of the 10 gaps
    assert not is_good(req(2.5, 0.1, 11), slo)                # TTFT 2.5 s
    assert is_good(req(1.0, 0.0, 1), slo)                     # one token: TPOT 0, as vLLM counts it
    assert not is_good(req(0.1, 0.1, 11, error="HTTP 400"), slo)
    assert not is_good({**req(0.1, 0.1, 11), "finish_s": None}, slo)
    assert not is_good(req(1.5, 0.4, 11), SLO(ttft_ms=2000, tpot_ms=50, e2el_ms=1800))   # E2E 1.9 s
    assert is_good(req(5.0, 0.4, 11), SLO(ttft_ms=None, tpot_ms=50))                       # no TTFT objective


def test_goodput_is_good_requests_over_the_duration_and_the_fraction_counts_every_request():
    recs = [req(1.0, 0.2, 11)] * 3 + [req(3.0, 0.2, 11), req(0.5, 0.2, 11, error="cancelled")]
    out = goodput(recs, SLO(ttft_ms=2000, tpot_ms=50), duration_s=2.0)
    assert out == {"goodput": 1.5, "good_fraction": 0.6}
    assert goodput([], SLO(), None) == {"goodput": None, "good_fraction": None}


def test_the_highest_load_meeting_the_slos():
    pts = [{"load": 1, "good_fraction": 1.0, "goodput": 0.5}, {"load": 8, "good_fraction": 0.95, "goodput": 3.0},
           {"load": 32, "good_fraction": 0.5, "goodput": 4.0}]
    assert max_load_meeting(pts, SLO(attainment=0.9))["load"] == 8
    assert max_load_meeting(pts, SLO(attainment=0.4))["load"] == 32
    assert max_load_meeting(pts[2:], SLO(attainment=0.9)) is None


@pytest.mark.parametrize("cfg, match", [
    ({"ttft_ms": -1}, r"slo.ttft_ms=-1: give a time in milliseconds > 0"),
    ({"tpot_ms": "fast"}, r"slo.tpot_ms='fast'"),
    ({"ttft": 100}, r"slo.ttft: no such objective"),
    ({"attainment": 0}, r"slo.attainment=0: the fraction of requests that must be good"),
    ({"ttft_ms": None, "tpot_ms": None, "e2el_ms": None}, r"every objective is null"),
])
def test_bad_slos_are_named(cfg, match):
    with pytest.raises(ValueError, match=match):
        SLO.from_config(cfg)


def test_a_sweep_reports_goodput_and_analyze_reads_it_again_under_other_slos(tmp_path, capsys):
    out = tmp_path / "s"
    r = cli(capsys, *QUICK, f"out={out}")
    assert r.returncode == 0, r.stderr
    said = " ".join(r.stdout.split())
    assert "a request is good when TTFT <= 2000 ms and TPOT <= 50 ms" in said and "spec_bench gmu 0.9 chain:3 treewy: up to c" in said
    result = json.loads((out / "analysis.json").read_text())
    assert result["slo"]["ttft_ms"] == 2000 and all(p["good_fraction"] is not None for p in result["points"])
    assert all(c["max"] for c in result["slo"]["max_load"])          # the simulator meets 2 s at c2 at least
    # the same stored requests under a TTFT no request meets: nothing rerun, every curve fails the SLOs
    r = cli(capsys, "analyze", str(out), "slo.ttft_ms=1")
    assert r.returncode == 0 and "TTFT <= 1 ms" in " ".join(r.stdout.split())
    result = json.loads((out / "analysis.json").read_text())
    assert all(c["max"] is None for c in result["slo"]["max_load"]) and all(p["goodput"] == 0 for p in result["points"])
    # a bad SLO stops a sweep before its first point, and analyze, with the input named
    r = cli(capsys, *QUICK, "slo.attainment=2", f"out={tmp_path / 'bad'}")
    assert r.returncode == 2 and "slo.attainment=2" in r.stderr and not (tmp_path / "bad" / "points").exists()
    assert cli(capsys, "analyze", str(out), "slo.tpot_ms=0").returncode == 2
