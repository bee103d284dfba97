"""The step profile's summary (results/h200-kernel-speed/device/profile_summary.py) on a table in the layout
torch's profiler writes on a GPU: the groups, the per-step times and the unlisted rest."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HEAD = ["Name", "Self CPU %", "Self CPU", "CPU total %", "CPU total", "CPU time avg", "Self CUDA", "Self CUDA %",
        "CUDA total", "CUDA time avg", "# of Calls"]


def _load():
    spec = importlib.util.spec_from_file_location("profile_summary",
                                                  ROOT / "results/h200-kernel-speed/device/profile_summary.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _table(rows: list[tuple[str, str, int]], total: str) -> str:
    widths = [60] + [12] * (len(HEAD) - 1)
    line = lambda cells: "".join(f"{c:>{w}}  " for c, w in zip(cells, widths))
    sep = "".join("-" * w + "  " for w in widths)
    body = [line([name, "1.00%", "1.000ms", "1.00%", "1.000ms", "1.000us", t, "1.00%", t, "1.000us", str(n)])
            for name, t, n in rows]
    return "\n".join([sep, line(HEAD), sep, *body, sep, "Self CPU time total: 50.000ms",
                      f"Self CUDA time total: {total}", ""])


def test_the_summary_groups_device_time_per_step_and_keeps_the_unlisted_rest(tmp_path):
    ps = _load()
    t = tmp_path / "profile-store_all-b40-table.txt"
    t.write_text(_table([("execute_context_0(0)_generation_40(160)", "0.000us", 10),
                         ("fused_moe_kernel", "200.000ms", 800),
                         ("void flash::FlashAttnFwdSm90<...>", "30.000ms", 100),
                         ("fused_sigmoid_gating_delta_rule_update_kernel", "40.000ms", 300),
                         ("nvjet_tst_128x64_64x4_1x2_h_bz_TNT", "100.000ms", 900),
                         ("triton_poi_fused_add_mul_0", "10.000ms", 500),
                         ("some_unknown_kernel", "5000.000us", 10)], "400.000ms"))
    rows, total, device = ps.parse(t.read_text())
    assert device == "CUDA" and total == pytest.approx(400.0) and len(rows) == 7
    out = ps.summarize(t)
    assert "400.0 ms over 10 steps = 40.00 ms per step" in out
    lines = {ln.split()[0]: ln for ln in out.splitlines()[1:]}
    assert "20.00 ms/step" in lines["moe"] and "50.0%" in lines["moe"]
    assert "4.00 ms/step" in lines["gdn"] and "delta_rule" in lines["gdn"]       # the commit, not "gdn other"
    assert "10.00 ms/step" in lines["gemm"] and "3.00 ms/step" in lines["attention"]
    assert "0.50 ms/step" in lines["other"] and "some_unknown_kernel" in lines["other"]
    assert "1.50 ms/step" in lines["not"]           # 400 - 385 listed, over 10 steps
