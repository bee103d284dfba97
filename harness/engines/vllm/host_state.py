"""The host over one measured run: how busy its CPUs were, how much time the hypervisor took (steal), the load
average, the mean CPU clock, processes of other vLLM servers still alive, and each GPU's SM clock, temperature,
power and active clock-throttle reasons at both ends (``nvidia-smi``).

Why a point records this: vLLM's steps that run outside CUDA graphs (eager mode, and the GDN and attention
layers of PIECEWISE mixed prefill-decode steps) are paced by the host launching kernels, so the host's speed is
part of what such a step measures. On the H200 host the second server of a device call ran those steps 1.2-1.5x
slower than the first, in either order of the strategies (results/h200-kernel-speed/e2e/layer-clock-eager2/),
which is as large as the differences between strategies. The device time of those layers rose with their host
time, so a GPU clocked down (heat, power) is as much a suspect as the CPUs. With these numbers a reader can tell a
slow point from a slow host: busy CPUs or a leftover server (contention), steal (a neighbour on the same machine),
a lower CPU clock, or a throttled GPU.

Linux only (``/proc``); elsewhere :func:`snapshot` returns None and the point records ``host: null``. Without
``nvidia-smi`` (CPU machines) the GPU entries are None.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

_STAT = Path("/proc/stat")
_CPUINFO = Path("/proc/cpuinfo")
# /proc/stat's first line: cpu user nice system idle iowait irq softirq steal [guest guest_nice], in clock ticks;
# guest time is already counted in user, so it is left out of the total
_FIELDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")


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
    mhz = [float(line.split(":", 1)[1]) for line in text.splitlines() if line.startswith("cpu MHz")]
    return sum(mhz) / len(mhz) if mhz else None


# nvidia-smi's names (``--query-gpu``) -> ours; nounits: MHz, degrees C, W, and a hex bit mask of throttle reasons
# (drivers from 535 on call them clock event reasons and keep the old name as an alias; older ones know only it)
_GPU_QUERY = {"clocks.sm": "sm_mhz", "clocks.max.sm": "sm_max_mhz", "temperature.gpu": "temperature_c",
              "power.draw": "power_w", "clocks_event_reasons.active": "throttle_reasons"}
_OLD_NAMES = {"clocks_event_reasons.active": "clocks_throttle_reasons.active"}


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
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    for names in (list(_GPU_QUERY), [_OLD_NAMES.get(n, n) for n in _GPU_QUERY]):
        try:
            out = subprocess.run([exe, f"--query-gpu={','.join(names)}", "--format=csv,noheader,nounits"],
                                 capture_output=True, text=True, timeout=10)
            if out.returncode == 0:
                return parse_gpus(out.stdout)
        except (OSError, subprocess.SubprocessError, ValueError):
            return None
    return None


def snapshot(other_servers: int | None = None) -> dict[str, Any] | None:
    """The host now: CPU ticks, load average, mean clock; ``other_servers``: live processes of other vLLM
    servers (the caller counts them: it knows its own server's tag)."""
    try:
        ticks = parse_stat(_STAT.read_text())
        mhz = mean_mhz(_CPUINFO.read_text())
        load = os.getloadavg()
    except (OSError, ValueError):
        return None
    return {"t": time.time(), "ticks": ticks, "mhz": mhz, "loadavg_1m": load[0], "other_servers": other_servers,
            "gpus": gpu_snapshot()}


def window(before: dict[str, Any] | None, after: dict[str, Any] | None) -> dict[str, Any] | None:
    """Between two snapshots: the fraction of all CPUs' time that was busy (not idle or iowait) and that was
    stolen by the hypervisor, with the CPU count, load average, CPU clock and the GPUs' state at both ends."""
    if before is None or after is None:
        return None
    d = {k: after["ticks"][k] - before["ticks"][k] for k in _FIELDS}
    total = sum(d.values())
    if total <= 0:
        return None
    idle = d["idle"] + d["iowait"]
    return {
        "cpus": os.cpu_count(),
        "seconds": after["t"] - before["t"],
        "busy_fraction": (total - idle) / total,
        "steal_fraction": d["steal"] / total,
        "loadavg_1m": [before["loadavg_1m"], after["loadavg_1m"]],
        "cpu_mhz_mean": [before["mhz"], after["mhz"]],
        "other_servers_processes": before["other_servers"],
        "gpus": [before.get("gpus"), after.get("gpus")],
    }
