"""The host's CPU accounting a vLLM point records (harness/engines/vllm/host_cpu.py)."""

import time

import pytest

from harness.engines.vllm import host_cpu

STAT = """cpu  {user} 0 {system} {idle} {iowait} 0 0 {steal} 0 0
cpu0 1 2 3 4 5 6 7 8 0 0
intr 1 2 3
"""


def _snap(t, **ticks):
    fields = {"user": 0, "system": 0, "idle": 0, "iowait": 0, "steal": 0, **ticks}
    return {"t": t, "ticks": host_cpu.parse_stat(STAT.format(**fields)), "mhz": 2600.0, "loadavg_1m": 1.0,
            "other_servers": 0}


def test_window_splits_busy_idle_and_steal():
    """Over 1000 ticks: 500 user, 100 system, 300 idle, 50 iowait, 50 steal: busy 0.65, steal 0.05."""
    before = _snap(10.0, user=1000, system=100, idle=5000, iowait=10, steal=7)
    after = _snap(12.5, user=1500, system=200, idle=5300, iowait=60, steal=57)
    w = host_cpu.window(before, after)
    assert w["busy_fraction"] == pytest.approx(0.65) and w["steal_fraction"] == pytest.approx(0.05)
    assert w["seconds"] == pytest.approx(2.5) and w["cpu_mhz_mean"] == [2600.0, 2600.0]
    assert host_cpu.window(before, before) is None and host_cpu.window(None, after) is None


def test_old_kernels_and_missing_lines():
    """A /proc/stat without the steal column parses with steal 0; one without a cpu line is refused; cpuinfo
    without clock lines gives None."""
    assert host_cpu.parse_stat("cpu 1 2 3 4\n")["steal"] == 0
    with pytest.raises(ValueError, match="cpu"):
        host_cpu.parse_stat("intr 1 2\n")
    assert host_cpu.mean_mhz("processor : 0\nBogoMIPS : 50\n") is None
    assert host_cpu.mean_mhz("cpu MHz\t\t: 2000.0\ncpu MHz\t\t: 3000.0\n") == 2500.0


def test_a_busy_loop_shows_on_this_host():
    """On this machine (Linux), a window over a second of busy work counts it as busy time."""
    before = host_cpu.snapshot()
    if before is None:
        pytest.skip("no /proc/stat here")
    end = time.perf_counter() + 0.5
    while time.perf_counter() < end:
        pass
    w = host_cpu.window(before, host_cpu.snapshot())
    assert w is not None and w["busy_fraction"] >= 0.5 / w["cpus"] * 0.5
