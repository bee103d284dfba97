"""vLLM's per-iteration log read back as step times (results/h200-kernel-speed/device/iteration_log.py): the fit
recovers known step times from a log written in vLLM 0.26's layout, the default window and a point's span pick
the steady steps, stalls stay out of the fit, and the committed probe's numbers are what its README says."""
from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PROBE = ROOT / "results/h200-kernel-speed/e2e/iteration-details-gmu0.9"


def _load():
    spec = importlib.util.spec_from_file_location("iteration_log",
                                                  ROOT / "results/h200-kernel-speed/device/iteration_log.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod          # its dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


def _line(t: str, n: int, creq: int, ctok: int, greq: int) -> str:
    return (f"(APIServer pid=2385) INFO 12-04 {t} [loggers.py:182] Engine 000: Iteration({n}): {creq} context "
            f"requests, {ctok} context tokens, {greq} generation requests, {4 * greq} generation tokens, "
            "iteration elapsed time: 0.41 ms, GPU KV cache usage: 50.0%")


def _log(seconds: list[tuple[int, int]], start: int = 10, stall_at: int | None = None) -> str:
    """A closed-loop run: a prefill burst, then one second per (steps with prompt tokens, decode-only steps),
    then a drain of decode-only seconds. With ``stall_at``: that second has one step (a JIT compile)."""
    lines, n = ["(APIServer pid=2385) INFO 12-04 12:00:09 [api_server.py:1] unrelated line"], 0
    lines.append(_line(f"12:00:{start:02d}", n, 100, 8000, 0))           # the burst: prefill only
    n += 1
    for i, (m, d) in enumerate(seconds):
        t = f"12:00:{start + 1 + i:02d}"
        if stall_at == i:
            lines.append(_line(t, n, 1, 100, 120))
            n += 1
            continue
        for j in range(m + d):
            lines.append(_line(t, n, 2, 300, 120) if j < m else _line(t, n, 0, 0, 120))
            n += 1
    end = start + 1 + len(seconds)
    for i in range(3):                                                    # the drain: decode only, emptying
        lines.extend(_line(f"12:00:{end + i:02d}", n + j, 0, 0, 60 - 20 * i) for j in range(40))
        n += 40
    return "\n".join(lines) + "\n"


# 100 ms per step with prompt tokens, 25 ms per decode-only step: every second exactly busy
STEADY = [(2, 32), (4, 24), (6, 16), (8, 8), (3, 28), (5, 20), (7, 12)]


def test_the_fit_recovers_known_step_times_inside_the_default_window():
    il = _load()
    # the default window leaves out the burst's second, the first steady one (partial) and the last one
    # before the drain: add a second at each edge so the inner seconds are STEADY
    steps = il.parse(_log([(4, 24)] + STEADY + [(4, 24)]))
    f = il.fit(steps)
    assert (f.start, f.end, f.seconds) == ("12:00:12", "12:00:18", len(STEADY))
    assert f.t_prompt_ms == pytest.approx(100.0, abs=1e-6)
    assert f.t_decode_ms == pytest.approx(25.0, abs=1e-6)
    assert f.residual_ms == pytest.approx(0.0, abs=1e-6)
    assert f.steps == sum(m + d for m, d in STEADY)
    assert f.prompt_share == pytest.approx(sum(m for m, _ in STEADY) / f.steps)
    assert f.prompt_tokens == 300 and f.prompt_requests == 2 and f.decode_requests == 120
    assert il.fit(steps, il._seconds("12:00:10"), il._seconds("12:00:11")).seconds == 2


def test_a_stalled_second_is_left_out_of_the_fit_and_counted():
    il = _load()
    f = il.fit(il.parse(_log([(4, 24)] + STEADY + [(4, 24)], stall_at=3)))
    assert f.stalled_s == 1
    assert f.t_prompt_ms == pytest.approx(100.0, abs=1e-6) and f.t_decode_ms == pytest.approx(25.0, abs=1e-6)


def test_a_window_where_one_kind_does_not_vary_gives_no_times_rather_than_made_up_ones():
    il = _load()
    f = il.fit(il.parse(_log([(4, 24)] * 6)))
    assert f.t_prompt_ms is None and f.t_decode_ms is None and f.steps_per_s == 28


def test_a_point_s_span_picks_its_steps_from_the_server_s_log(tmp_path):
    il = _load()
    summary = {"provenance": {"time_utc": "2026-12-04T12:00:14+00:00"}, "metrics": {"duration_s": 3.2}}
    assert il.point_span(summary) == (il._seconds("12:00:10"), il._seconds("12:00:14"))
    # The engine's own window, where it wrote one, wins over the whole-second time_utc.
    precise = {**summary, "telemetry": {"run_wall_s": [1796385611.3, 1796385612.9]}}   # 12:00:11.3 - 12:00:12.9
    assert il.point_span(precise) == (il._seconds("12:00:11"), il._seconds("12:00:12"))
    with pytest.raises(ValueError, match="provenance.time_utc and metrics.duration_s"):
        il.point_span({"metrics": {}})
    log = tmp_path / "vllm.log"
    log.write_text(_log([(4, 24)] + STEADY + [(4, 24)]))
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    out = tmp_path / "fit.json"
    assert il.main([str(log), "--point", str(tmp_path / "summary.json"), "--json", str(out)]) == 0
    assert json.loads(out.read_text())["end"] == "12:00:13"      # inside the span, one before its last mixed step


def test_bad_input_names_the_fix(tmp_path, capsys):
    il = _load()
    log = tmp_path / "vllm.log"
    log.write_text("INFO 12-04 12:00:00 [api_server.py:1] no iteration lines here\n")
    assert il.main([str(log)]) == 2
    assert "--enable-logging-iteration-details" in capsys.readouterr().err
    log.write_text(_log(STEADY))
    assert il.main([str(log), "--start", "12:00:15", "--end", "12:00:12"]) == 2
    assert "empty window" in capsys.readouterr().err
    with pytest.raises(ValueError, match="midnight"):
        il.parse(_line("23:59:59", 0, 0, 0, 10) + "\n" + _line("00:00:00", 1, 0, 0, 10))


@pytest.mark.skipif(not PROBE.is_dir(), reason="the committed probe is not in this checkout")
@pytest.mark.parametrize("point,steps_per_s", [("sharegpt-gmu0.9-c128-chain3-store_all", 13.1),
                                               ("sharegpt-gmu0.9-c128-chain3-treewy", 10.5),
                                               ("sharegpt-gmu0.9-c256-chain3-store_all", 8.7),
                                               ("sharegpt-gmu0.9-c256-chain3-treewy", 8.2)])
def test_the_committed_probe_gives_the_steps_per_second_its_readme_quotes(point, steps_per_s):
    il = _load()
    strategy = point.rsplit("-", 1)[1]
    (log,) = (PROBE / "engine-logs").glob(f"*-{strategy}.log")
    lo, hi = il.point_span(json.loads((PROBE / "points" / point / "summary.json").read_text()))
    f = il.fit([s for s in il.parse(log.read_text()) if lo <= s.second <= hi])
    assert round(f.steps_per_s, 1) == steps_per_s
    assert json.loads((PROBE / "steps" / f"{point}.json").read_text())["steps"] == f.steps
    assert str(steps_per_s) in (PROBE / "README.md").read_text()
