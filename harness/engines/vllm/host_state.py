"""The host over one measured run: how busy its CPUs were, how much time the hypervisor took (steal), the load
average, the mean CPU clock, processes of other vLLM servers still alive, and each GPU's SM clock, temperature,
power and clock-throttle reasons sampled during the run (``nvidia-smi``).

Why a point records this: vLLM's steps that run outside CUDA graphs (eager mode, and the GDN and attention
layers of PIECEWISE mixed prefill-decode steps) are paced by the host launching kernels, so the host's speed is
part of what such a step measures. On the H200 host the second server of a device call ran those steps 1.2-1.5x
slower than the first, in either order of the strategies (results/h200-kernel-speed/e2e/layer-clock-eager2/),
which is as large as the differences between strategies. The device time of those layers rose with their host
time, so a GPU clocked down (heat, power) is as much a suspect as the CPUs. With these numbers a reader can tell a
slow point from a slow host: busy CPUs or a leftover server (contention), steal (a neighbour on the same machine),
a lower CPU clock, or a throttled GPU.

:class:`HostWatch` brackets the load: ``/proc/stat`` is read right before the first request and right after the
last (nothing else inside the window), and the GPUs are sampled every ``gpu_every_s`` by a background thread, so
the clocks are those of the loaded GPU, not of the idle one before and after. Linux only (``/proc``): elsewhere
the CPU part is None; without ``nvidia-smi`` (CPU machines) the GPU part is None.
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

_STAT = Path("/proc/stat")
_CPUINFO = Path("/proc/cpuinfo")
# /proc/stat's first line: cpu user nice system idle iowait irq softirq steal [guest guest_nice], in clock ticks;
# guest time is already counted in user, so it is left out of the total
_FIELDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")
_MAX_GPU_SAMPLES = 120   # kept per point (evenly thinned beyond); the summary covers all of them


def parse_stat(text: str) -> dict[str, int]:
    """The aggregate ``cpu`` line of ``/proc/stat`` as ticks per field (fields an old kernel lacks are 0)."""
    for line in text.splitlines():
        parts = line.split()
        if parts and parts[0] == "cpu":
            ticks = [int(x) for x in parts[1:1 + len(_FIELDS)]]
            return dict(zip(_FIELDS, ticks + [0] * (len(_FIELDS) - len(ticks))))
    raise ValueError("no aggregate 'cpu' line in /proc/stat")


def mean_mhz(text: str) -> float | None:
    """Mean of the ``cpu MHz`` lines of ``/proc/cpuinfo`` (None where it has none, e.g. on ARM)."""
    mhz = []
    for line in text.splitlines():
        if line.startswith("cpu MHz") and ":" in line:
            try:
                mhz.append(float(line.split(":", 1)[1]))
            except ValueError:
                pass
    return sum(mhz) / len(mhz) if mhz else None


def cpu_snapshot() -> dict[str, Any] | None:
    """CPU ticks, load average and mean clock now (None off Linux)."""
    try:
        ticks = parse_stat(_STAT.read_text())
        mhz = mean_mhz(_CPUINFO.read_text())
        load = os.getloadavg()
    except (OSError, ValueError):
        return None
    return {"t": time.time(), "ticks": ticks, "mhz": mhz, "loadavg_1m": load[0]}


def cpu_window(before: dict[str, Any] | None, after: dict[str, Any] | None) -> dict[str, Any] | None:
    """Between two :func:`cpu_snapshot`: the fraction of all CPUs' time that was busy (not idle or iowait; steal
    counts as busy here, and is also given alone) and that the hypervisor stole, with the CPU counts (the host's,
    and those this process may run on), load average and clock at both ends."""
    if before is None or after is None:
        return None
    d = {k: after["ticks"][k] - before["ticks"][k] for k in _FIELDS}
    total = sum(d.values())
    if total <= 0:
        return None
    idle = d["idle"] + d["iowait"]
    try:
        usable = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        usable = None
    return {
        "cpus": os.cpu_count(),
        "cpus_usable": usable,
        "seconds": after["t"] - before["t"],
        "busy_fraction": (total - idle) / total,
        "steal_fraction": d["steal"] / total,
        "loadavg_1m": [before["loadavg_1m"], after["loadavg_1m"]],
        "cpu_mhz_mean": [before["mhz"], after["mhz"]],
    }


# nvidia-smi's names (``--query-gpu``) -> ours; nounits: MHz, degrees C, W, and a hex bit mask of throttle reasons
# (drivers from 535 on call them clock event reasons and keep the old name as an alias; older ones know only it)
_GPU_QUERY = {"clocks.sm": "sm_mhz", "clocks.max.sm": "sm_max_mhz", "temperature.gpu": "temperature_c",
              "power.draw": "power_w", "clocks_event_reasons.active": "throttle_reasons"}
_OLD_NAMES = {"clocks_event_reasons.active": "clocks_throttle_reasons.active"}
_query_names: list[str] | None = None    # the spelling this driver took (asked once per process)


def parse_gpus(text: str) -> list[dict[str, Any]]:
    """``nvidia-smi --query-gpu=<_GPU_QUERY keys> --format=csv,noheader,nounits`` output, one dict per GPU
    (numbers as floats; the throttle mask as nvidia-smi writes it; "[N/A]" as None)."""
    gpus = []
    for line in text.strip().splitlines():
        vals = [v.strip() for v in line.split(",")]
        if len(vals) != len(_GPU_QUERY):
            raise ValueError(f"nvidia-smi line {line!r}: {len(vals)} values, expected {len(_GPU_QUERY)}")
        row: dict[str, Any] = {}
        for name, v in zip(_GPU_QUERY.values(), vals):
            if name == "throttle_reasons" or v.startswith("["):
                row[name] = None if v.startswith("[") else v
            else:
                row[name] = float(v)
        gpus.append(row)
    return gpus


def gpu_snapshot() -> list[dict[str, Any]] | None:
    """Each GPU's clocks, temperature, power and throttle reasons now (None without nvidia-smi or on its error)."""
    global _query_names
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    tries = [_query_names] if _query_names else [list(_GPU_QUERY), [_OLD_NAMES.get(n, n) for n in _GPU_QUERY]]
    for names in tries:
        try:
            out = subprocess.run([exe, f"--query-gpu={','.join(names)}", "--format=csv,noheader,nounits"],
                                 capture_output=True, text=True, timeout=10)
            if out.returncode == 0:
                rows = parse_gpus(out.stdout)
                _query_names = names
                return rows
        except (OSError, subprocess.SubprocessError, ValueError):
            return None
    return None


def gpu_summary(samples: list[tuple[float, list[dict[str, Any]]]]) -> dict[str, Any] | None:
    """Samples ``(seconds into the run, per-GPU rows)`` -> per GPU: the SM clock's min / median / max against its
    maximum, the hottest temperature, the highest power, and every throttle mask seen; plus the samples (thinned
    evenly to at most _MAX_GPU_SAMPLES)."""
    if not samples:
        return None
    per_gpu = []
    for i in range(len(samples[0][1])):
        rows = [s[1][i] for s in samples if i < len(s[1])]

        def vals(key):
            return [r[key] for r in rows if r.get(key) is not None]

        sm = vals("sm_mhz")
        per_gpu.append({
            "sm_mhz": [min(sm), statistics.median(sm), max(sm)] if sm else None,
            "sm_max_mhz": max(vals("sm_max_mhz"), default=None),
            "temperature_c_max": max(vals("temperature_c"), default=None),
            "power_w_max": max(vals("power_w"), default=None),
            "throttle_reasons_seen": sorted(set(vals("throttle_reasons"))),
        })
    step = max(1, -(-len(samples) // _MAX_GPU_SAMPLES))
    return {"samples": len(samples), "per_gpu": per_gpu,
            "series": [{"t_s": round(t, 3), "gpus": rows} for t, rows in samples[::step]]}


class HostWatch:
    """The host over one run: ``start()`` right before the load, ``stop()`` right after; ``other_servers``: live
    processes of other vLLM servers, counted by the caller (it knows its own server's tag) before the load."""

    def __init__(self, other_servers: int | None = None, gpu_every_s: float = 2.0) -> None:
        self.other_servers = other_servers
        self.gpu_every_s = gpu_every_s
        self._gpus = shutil.which("nvidia-smi") is not None
        self._samples: list[tuple[float, list[dict[str, Any]]]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._before: dict[str, Any] | None = None
        self._t0 = 0.0

    def start(self) -> "HostWatch":
        self._t0 = time.perf_counter()
        if self._gpus:
            self._thread = threading.Thread(target=self._sample_gpus, name="host-watch-gpus", daemon=True)
            self._thread.start()
        self._before = cpu_snapshot()     # last: nothing of the watch's own start inside the CPU window
        return self

    def _sample_gpus(self) -> None:
        # each nvidia-smi call (~30 ms of one CPU every gpu_every_s) falls inside the CPU window: noise, not load
        while not self._stop.is_set():
            rows = gpu_snapshot()
            if rows:
                self._samples.append((time.perf_counter() - self._t0, rows))
            self._stop.wait(self.gpu_every_s)

    def stop(self) -> dict[str, Any]:
        """What the point records as ``telemetry.host``: ``cpu`` (None off Linux), ``gpus`` (None without
        nvidia-smi), ``other_servers_processes``."""
        after = cpu_snapshot()            # first: the GPU thread's join stays outside the CPU window
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=15)
        return {"cpu": cpu_window(self._before, after), "gpus": gpu_summary(self._samples),
                "other_servers_processes": self.other_servers}
