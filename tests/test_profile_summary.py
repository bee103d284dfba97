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


def _table(rows: list[tuple], total: str) -> str:
    """Rows of (name, self device time, calls[, host time]): kernels have no host time, ops have some."""
    widths = [60] + [12] * (len(HEAD) - 1)
    line = lambda cells: "".join(f"{c:>{w}}  " for c, w in zip(cells, widths))
    sep = "".join("-" * w + "  " for w in widths)
    body = [line([r[0], "0.00%", h, "0.00%", h, h, r[1], "1.00%", r[1], "1.000us", str(r[2])])
            for r in rows for h in [r[3] if len(r) > 3 else "0.000us"]]
    return "\n".join([sep, line(HEAD), sep, *body, sep, "Self CPU time total: 50.000ms",
                      f"Self CUDA time total: {total}", ""])


def test_the_summary_groups_device_time_per_step_and_keeps_the_unlisted_rest(tmp_path):
    ps = _load()
    t = tmp_path / "profile-store_all-b40-table.txt"
    t.write_text(_table([("execute_context_0(0)_generation_40(160)", "900.000ms", 10),   # a span, not a kernel
                         ("vllm::moe_forward_shared", "200.000ms", 400, "50.000ms"),     # an op: its kernel's time
                         ("fused_moe_kernel", "200.000ms", 800),
                         ("void flash::FlashAttnFwdSm90<...>", "30.000ms", 100),
                         ("fused_sigmoid_gating_delta_rule_update_kernel", "40.000ms", 300),
                         ("nvjet_tst_128x64_64x4_1x2_h_bz_TNT", "100.000ms", 900),
                         ("triton_poi_fused_add_mul_0", "10.000ms", 500),
                         ("some_unknown_kernel", "5000.000us", 10)], "400.000ms"))
    rows, total, device = ps.parse(t.read_text())
    assert device == "CUDA" and total == pytest.approx(400.0) and len(rows) == 8
    out = ps.summarize(t)
    assert "400.0 ms over 10 steps (step ranges) = 40.00 ms per step" in out
    assert "90.00 ms/step" in next(ln for ln in out.splitlines() if "GPU span" in ln)
    lines = {ln.split()[0]: ln for ln in out.splitlines()[1:]}
    assert "20.00 ms/step" in lines["moe"] and "50.0%" in lines["moe"]
    assert "4.00 ms/step" in lines["gdn"] and "delta_rule" in lines["gdn"]       # the commit, not "gdn other"
    assert "10.00 ms/step" in lines["gemm"] and "3.00 ms/step" in lines["attention"]
    assert "0.50 ms/step" in lines["other"] and "some_unknown_kernel" in lines["other"]
    assert "1.50 ms/step" in lines["not"]           # 400 - 385 listed, over 10 steps


def test_steps_come_from_the_runs_json_where_the_ranges_miscount_them(tmp_path):
    """vLLM's table can list two step ranges per engine step (the H200's batch-40 runs did): the run's JSON
    says how many steps the profiler covered."""
    ps = _load()
    t = tmp_path / "profile-treewy-b40-table.txt"
    t.write_text(_table([("execute_context_0(0)_generation_40(160)", "900.000ms", 20),
                         ("fused_moe_kernel", "200.000ms", 800)], "200.000ms"))
    assert "over 20 steps (step ranges)" in ps.summarize(t)
    (tmp_path / "profile-treewy-b40.json").write_text('{"profile": {"steps": 10}}')
    out = ps.summarize(t)
    assert "over 10 steps (profile-treewy-b40.json) = 20.00 ms per step" in out
    assert "20.00 ms/step" in next(ln for ln in out.splitlines() if ln.split()[0] == "moe")


def test_the_h200_tables_sum_each_kernel_once():
    """On the committed H200 profiles: kernels alone make up the table's total (ops' rows would double it), and
    the MoE, which reads all its experts' weights from ~95 tokens on, costs about the same at batch 100 and 40."""
    ps = _load()
    d = ROOT / "results/h200-kernel-speed/step-profile-e14c57a"
    per = {}
    for b in (40, 100):
        out = ps.summarize(d / f"profile-store_all-b{b}-table.txt")
        lines = {ln.split()[0]: ln for ln in out.splitlines()[1:]}
        assert "over 10 steps (profile-store_all" in out
        assert abs(float(lines["not"].split()[2])) < 0.5          # ms per step the listed kernels leave out
        per[b] = float(lines["moe"].split()[1])
    assert 15 < per[40] < 20 and per[100] / per[40] < 1.1
