"""The host's state a vLLM point records over its run (harness/engines/vllm/host_state.py)."""

import os
import time

import pytest

from harness.engines.vllm import host_state

STAT = """cpu  {user} 0 {system} {idle} {iowait} 0 0 {steal} 0 0
cpu0 1 2 3 4 5 6 7 8 0 0
intr 1 2 3
"""


def _snap(t, **ticks):
    fields = {"user": 0, "system": 0, "idle": 0, "iowait": 0, "steal": 0, **ticks}
    return {"t": t, "ticks": host_state.parse_stat(STAT.format(**fields)), "mhz": 2600.0, "loadavg_1m": 1.0}


def test_window_splits_busy_idle_and_steal():
    """Over 1000 ticks: 500 user, 100 system, 300 idle, 50 iowait, 50 steal: busy 0.65, steal 0.05."""
    before = _snap(10.0, user=1000, system=100, idle=5000, iowait=10, steal=7)
    after = _snap(12.5, user=1500, system=200, idle=5300, iowait=60, steal=57)
    w = host_state.cpu_window(before, after)
    assert w["busy_fraction"] == pytest.approx(0.65) and w["steal_fraction"] == pytest.approx(0.05)
    assert w["seconds"] == pytest.approx(2.5) and w["cpu_mhz_mean"] == [2600.0, 2600.0]
    assert host_state.cpu_window(before, before) is None and host_state.cpu_window(None, after) is None


def test_old_kernels_and_missing_lines():
    """A /proc/stat without the steal column parses with steal 0; one without a cpu line is refused; cpuinfo
    without clock lines gives None."""
    assert host_state.parse_stat("cpu 1 2 3 4\n")["steal"] == 0
    with pytest.raises(ValueError, match="cpu"):
        host_state.parse_stat("intr 1 2\n")
    assert host_state.mean_mhz("processor : 0\nBogoMIPS : 50\n") is None
    assert host_state.mean_mhz("cpu MHz\t\t: 2000.0\ncpu MHz\t\t: 3000.0\n") == 2500.0
    assert host_state.mean_mhz("cpu MHz\ncpu MHz : fast\ncpu MHz : 1000\n") == 1000.0     # odd lines skipped


def test_a_busy_loop_shows_on_this_host():
    """On this machine (Linux), a window over a second of busy work counts it as busy time."""
    before = host_state.cpu_snapshot()
    if before is None:
        pytest.skip("no /proc/stat here")
    end = time.perf_counter() + 0.5
    while time.perf_counter() < end:
        pass
    w = host_state.cpu_window(before, host_state.cpu_snapshot())
    assert w is not None and w["busy_fraction"] >= 0.5 / w["cpus"] * 0.5


def test_gpu_lines_parse_with_missing_values():
    """nvidia-smi's csv (nounits): numbers as floats, the throttle mask kept as written, [N/A] as None; a line
    with the wrong count of values is refused rather than misread."""
    rows = host_state.parse_gpus("1980, 1980, 41, 118.52, 0x0000000000000000\n1755, 1980, 77, [N/A], 0x0000000000000020\n")
    assert rows[0] == {"sm_mhz": 1980.0, "sm_max_mhz": 1980.0, "temperature_c": 41.0, "power_w": 118.52,
                       "throttle_reasons": "0x0000000000000000"}
    assert rows[1]["power_w"] is None and rows[1]["sm_mhz"] == 1755.0 and rows[1]["throttle_reasons"].endswith("20")
    with pytest.raises(ValueError, match="expected 5"):
        host_state.parse_gpus("1980, 41\n")


def test_gpu_snapshot_falls_back_to_the_old_query_name(tmp_path, monkeypatch):
    """A driver older than 535 knows the throttle reasons only by their old name: the snapshot asks again with
    it; an nvidia-smi that fails both ways gives None, not an exception in the middle of a point."""
    smi = tmp_path / "nvidia-smi"
    smi.write_text('#!/bin/sh\ncase "$1" in *clocks_event_reasons*) echo "Field is not valid" >&2; exit 2;; esac\n'
                   'echo "1980, 1980, 41, 118.5, 0x0"\n')
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    monkeypatch.setattr(host_state, "_query_names", None)
    assert host_state.gpu_snapshot() == [{"sm_mhz": 1980.0, "sm_max_mhz": 1980.0, "temperature_c": 41.0,
                                          "power_w": 118.5, "throttle_reasons": "0x0"}]
    assert host_state._query_names[-1] == "clocks_throttle_reasons.active"      # asked once per process
    smi.write_text("#!/bin/sh\nexit 9\n")
    assert host_state.gpu_snapshot() is None


def test_the_watch_samples_the_gpus_during_the_run_not_at_its_ends(tmp_path, monkeypatch):
    """A fake nvidia-smi that reports a lower clock after its first two calls: the watch sees the loaded GPU's
    clock in its samples and summary (an idle reading before and after would miss it), the CPU window covers the
    load, and the other servers' count is the caller's."""
    calls = tmp_path / "calls"
    smi = tmp_path / "nvidia-smi"
    smi.write_text(f'#!/bin/sh\necho x >> {calls}\nn=$(wc -l < {calls})\n'
                   'if [ "$n" -le 2 ]; then echo "1980, 1980, 40, 100, 0x0000000000000001"; '
                   'else echo "1400, 1980, 83, 690, 0x0000000000000020"; fi\n')
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    monkeypatch.setattr(host_state, "_query_names", None)
    watch = host_state.HostWatch(other_servers=0, gpu_every_s=0.05).start()
    time.sleep(0.6)
    host = watch.stop()
    g = host["gpus"]
    assert g["samples"] >= 5 and len(g["series"]) == g["samples"]
    assert g["per_gpu"][0]["sm_mhz"][0] == 1400.0 and g["per_gpu"][0]["sm_mhz"][2] == 1980.0
    assert g["per_gpu"][0]["temperature_c_max"] == 83.0 and "0x0000000000000020" in g["per_gpu"][0]["throttle_reasons_seen"]
    assert host["other_servers_processes"] == 0
    if host["cpu"] is not None:
        assert host["cpu"]["seconds"] == pytest.approx(0.6, abs=0.3)


def test_the_summary_thins_long_series():
    rows = [{"sm_mhz": 1980.0, "sm_max_mhz": 1980.0, "temperature_c": 50.0, "power_w": None, "throttle_reasons": None}]
    g = host_state.gpu_summary([(i * 2.0, rows) for i in range(1000)])
    assert g["samples"] == 1000 and len(g["series"]) <= 120 and g["per_gpu"][0]["power_w_max"] is None
    assert host_state.gpu_summary([]) is None


def test_other_servers_are_counted_by_exact_tag():
    """A point counts the live processes of other servers by the tag each server's processes inherit: port 6000's
    own processes are not counted, port 60001's (whose tag starts with 6000's) are."""
    import subprocess
    from types import SimpleNamespace

    from harness.engines.vllm.engine import _other_servers
    from harness.engines.vllm.server import TAG_ENV

    if not os.path.isdir("/proc"):
        pytest.skip("no /proc here")
    mine, other = "commitbench-1-6000", "commitbench-1-60001"
    procs = [subprocess.Popen(["sleep", "30"], env={**os.environ, TAG_ENV: tag}) for tag in (mine, mine, other)]
    try:
        time.sleep(0.2)
        before = _other_servers(SimpleNamespace(served_name="commitbench-none"))
        assert _other_servers(SimpleNamespace(served_name=mine)) == before - 2
    finally:
        for p in procs:
            p.kill()
            p.wait()
