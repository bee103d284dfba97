"""The host's CPUs over one measured run: how busy they were, how much time the hypervisor took (steal), the
load average, the mean clock, and processes of other vLLM servers still alive.

Why a point records this: vLLM's steps that run outside CUDA graphs (eager mode, and the GDN and attention
layers of PIECEWISE mixed prefill-decode steps) are paced by the host launching kernels, so the host's speed is
part of what such a step measures. On the H200 host the second server of a device call ran those steps 1.2-1.5x
slower than the first, in either order of the strategies (results/h200-kernel-speed/e2e/layer-clock-eager2/),
which is as large as the differences between strategies. With these numbers a reader can tell a slow point
from a slow host: busy CPUs or a leftover server (contention), steal (a neighbour on the same machine), or a
lower clock.

Linux only (``/proc``); elsewhere :func:`snapshot` returns None and the point records ``host: null``.
"""

from __future__ import annotations

import os
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


def snapshot(other_servers: int | None = None) -> dict[str, Any] | None:
    """The host now: CPU ticks, load average, mean clock; ``other_servers``: live processes of other vLLM
    servers (the caller counts them: it knows its own server's tag)."""
    try:
        ticks = parse_stat(_STAT.read_text())
        mhz = mean_mhz(_CPUINFO.read_text())
        load = os.getloadavg()
    except (OSError, ValueError):
        return None
    return {"t": time.time(), "ticks": ticks, "mhz": mhz, "loadavg_1m": load[0], "other_servers": other_servers}


def window(before: dict[str, Any] | None, after: dict[str, Any] | None) -> dict[str, Any] | None:
    """Between two snapshots: the fraction of all CPUs' time that was busy (not idle or iowait) and that was
    stolen by the hypervisor, with the CPU count, load average and clock at both ends."""
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
    }
