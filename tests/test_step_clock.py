"""The step clock's reader (results/h200-kernel-speed/device/step_clock.py) on rows in the layout its probe
writes (stepclock/commitbench_stepclock.py; tests/test_vllm_sweep.py runs the probe in a real vLLM): each step's
interval, host wait, launch and sampling, decode-only steps and steps with prompt tokens apart."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

DEVICE = Path(__file__).resolve().parents[1] / "results/h200-kernel-speed/device"
sys.path.insert(0, str(DEVICE))
import step_clock  # noqa: E402

sys.path.remove(str(DEVICE))


def _row(t0, wait, launch, sample, prompt, decodes=100, wall=1000.0):
    tb = t0 + wait
    return {"wall": wall + t0, "t0": t0, "tb": tb, "t1": tb + launch, "t2": tb + launch + 0.001,
            "t3": tb + launch + 0.001 + sample, "reqs": decodes + (1 if prompt else 0), "tokens": 4 * decodes + prompt,
            "decode_reqs": decodes, "prompt_tokens": prompt, "new_reqs": 1 if prompt else 0}


def test_steps_are_timed_and_split_by_kind(tmp_path):
    # decode steps every 30 ms (host waits 20 ms: device-bound); a mixed step of 100 ms whose host never waits
    rows = [_row(0.000, 0.020, 0.005, 0.002, 0), _row(0.030, 0.020, 0.005, 0.002, 0),
            _row(0.060, 0.000, 0.090, 0.005, 300), _row(0.160, 0.020, 0.005, 0.002, 0)]
    (tmp_path / "steps-1.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[:2]))
    (tmp_path / "steps-2.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[2:]) + '{"t0": 0.2, "tb"')
    steps = step_clock.timed(step_clock.load([tmp_path]))           # two files, clock order, torn line skipped
    assert [round(s["interval"], 3) if s["interval"] else None for s in steps] == [30.0, 30.0, 100.0, None]
    kinds = step_clock.summarize(steps)
    assert kinds["with prompt"]["steps"] == 1 and kinds["with prompt"]["prompt_tokens"] == 300
    assert kinds["with prompt"]["wait"]["median"] == pytest.approx(0.0)
    assert kinds["with prompt"]["launch"]["median"] == pytest.approx(90.0)
    assert kinds["decode only"]["steps"] == 3 and kinds["decode only"]["wait"]["mean"] == pytest.approx(20.0)
    assert kinds["decode only"]["interval"]["median"] == pytest.approx(30.0)   # the last step has none


def test_a_point_s_run_and_bad_input(tmp_path, capsys):
    rows = [_row(t, 0.02, 0.005, 0.002, 0, wall=1_800_000_000.0) for t in (0.0, 0.03, 0.06)]
    (tmp_path / "steps-1.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    summary = {"provenance": {"time_utc": "2027-01-15T08:00:00.040000+00:00"}, "metrics": {"duration_s": 0.04}}
    summary["telemetry"] = {"run_wall_s": [1_800_000_000.0, 1_800_000_000.04]}      # what the engine writes
    lo, hi = step_clock.span(summary)
    assert hi - lo == pytest.approx(0.04) and hi == pytest.approx(1_800_000_000.04)
    # An older summary: time_utc in whole seconds, stored after the run's analysis; widened a second each side.
    lo, hi = step_clock.span({k: v for k, v in summary.items() if k != "telemetry"})
    assert lo == pytest.approx(1_800_000_000.04 - 1.04) and hi == pytest.approx(1_800_000_001.04)
    (tmp_path / "s.json").write_text(json.dumps(summary))
    out = tmp_path / "sum.json"
    assert step_clock.main([str(tmp_path), "--point", str(tmp_path / "s.json"), "--json", str(out)]) == 0
    assert json.loads(out.read_text())["decode only"]["steps"] == 2           # the steps at 0.00 and 0.03 s
    assert step_clock.main([str(tmp_path / "empty")]) == 2
    assert "COMMITBENCH_STEPCLOCK" in capsys.readouterr().err
    with pytest.raises(ValueError, match="run_wall_s nor provenance.time_utc"):
        step_clock.span({})


def test_the_layer_clock_s_parts(tmp_path, capsys):
    """Rows with the layer clock's fields (summed over the GDN layers: host seconds, device ms) get a column per
    part and side, in ms, and a second table; rows without them (a part the strategy never ran) leave it out."""
    rows = [_row(t, 0.0, 0.08, 0.005, 300) for t in (0.0, 0.1)]
    rows[0].update(core_host=0.040, core_n=30, core_dev=20.0, leave_host=0.012, leave_n=30, leave_dev=0.5,
                   attn_host=0.004, attn_n=10, attn_dev=6.0)
    rows[1].update(core_host=0.050, core_n=30, core_dev=22.0, attn_host=0.006, attn_n=10, attn_dev=8.0)
    (tmp_path / "steps-1.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    kinds = step_clock.summarize(step_clock.timed(step_clock.load([tmp_path])))
    mixed = kinds["with prompt"]
    assert mixed["core host"]["median"] == pytest.approx(45.0) and mixed["core dev"]["mean"] == pytest.approx(21.0)
    assert mixed["leave host"]["median"] == pytest.approx(12.0)          # one step had it
    assert mixed["attn dev"]["median"] == pytest.approx(7.0) and mixed["attn host"]["mean"] == pytest.approx(5.0)
    assert "spec host" not in mixed and "build dev" not in mixed and "draft_attn host" not in mixed
    assert step_clock.main([str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "layer clock" in out and "core host" in out and "leave dev" in out and "attn dev" in out


def test_the_fit_of_steps_with_prompt_tokens(tmp_path, capsys):
    """--fit: launch of the steps with prompt tokens = 40 ms + 1.5 ms per 100 prompt tokens + 0.2 ms per decoding
    request + 1 ms per new request, recovered exactly from rows that follow it; too few steps: None."""
    rows, t = [], 0.0
    for i in range(12):
        prompt, dec, new = 20 + 37 * i, 60 + (i * 7) % 50, i % 4
        launch = (40 + 1.5 * prompt / 100 + 0.2 * dec + 1.0 * new) / 1e3
        r = _row(t, 0.005, launch, 0.004, prompt, decodes=dec)
        r.update(new_reqs=new, leave_host=(3 + 0.5 * dec) / 1e3, leave_dev=0.1 * dec)    # host s, device ms
        rows.append(r)
        t += 0.2
    (tmp_path / "steps-1.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    f = step_clock.fit(step_clock.timed(step_clock.load([tmp_path])), "launch")
    assert [round(f[k], 6) for k in step_clock.FIT_TERMS] == [40.0, 1.5, 0.2, 1.0] and f["rms"] < 1e-6
    assert step_clock.fit(step_clock.timed(rows[:4]), "launch") is None
    assert step_clock.main([str(tmp_path), "--fit", "--json", str(tmp_path / "s.json")]) == 0
    assert "const 40.00" in capsys.readouterr().out
    fits = json.loads((tmp_path / "s.json").read_text())["fit"]      # and every layer-clock column the rows have
    assert set(fits) == {"interval", "launch", "leave host", "leave dev"}
    assert fits["leave host"]["const"] == pytest.approx(3.0) and fits["leave host"]["per decoding request"] == \
        pytest.approx(0.5) and fits["leave dev"]["per decoding request"] == pytest.approx(0.1)
