"""``time_budget_s``: a sweep command's wall-clock allowance, for hosts lent by the call (10 minutes on the
H200 host) or a batch job's time limit. It counts from the process's start (Linux; elsewhere from when the
sweep has composed its grid), so interpreter start-up and config composition are inside it.

A point killed by the host's limit is lost, and on vLLM so is the server start it paid for (100-300 s with
CUDA graphs). With a budget the command instead stops before a point it does not expect to finish in time,
writes its call log, analysis and report, and leaves the rest to the next command (which resumes the grid).

A point's expected time is a run plus, where it starts a server, a start (MARGIN on top of both):
  - the run: the latest finished point (this command's, or before its first the folder's latest), without its
    server start, scaled by the requests each asks for (a c256 point after a c128 one: 512/256 requests, x2;
    an overestimate, since the larger batch is faster);
  - the start (vLLM: a point whose :func:`harness.sweep.server_key` differs from the point before, or any point
    after a failed one, since a failure may have stopped the server). vLLM keeps its compiled graphs in a cache
    on the host, keyed by the draft and the plugin's page shape, so by strategy, not by gmu (``warm_key``). A
    start of a kind this host has started before (in this command, or in an earlier one on the same boot), or
    whose graphs the caches hold by their note (restored from another host: :mod:`harness.compile_cache`),
    loads them (``warm``): as long as the shortest start seen (~90-105 s on the H200). Any other compiles: as
    long as the longest start seen (250-370 s), in this command or the sweep's stored points. Where no start
    is known at all, as long as the longest point seen.
Only a point with no timing anywhere (a new folder's first) runs unestimated. Failed points teach nothing about
how long a point takes and are not learnt from. An estimate can still be short; keep the host's own limit as
the backstop.
"""

from __future__ import annotations

import math
import os
import time
from typing import Any, Callable, Iterable

MARGIN = 1.2     # x the estimate: one point's time varied by up to 18% between calls on one H200 host
RUN_OVERHEAD_S = 5.0   # s, a stored point's run beyond its level and warm-up (metrics scrapes, storing it)


def _startup_s(summary: dict[str, Any]) -> float:
    """The server start (s) a stored point's telemetry names; 0 where it names none (the simulator)."""
    return float(((summary.get("telemetry") or {}).get("server") or {}).get("startup_s") or 0.0)


def process_age_s() -> float:
    """Seconds since this process started (Linux's /proc), 0 where that cannot be read."""
    try:
        start_ticks = int(open("/proc/self/stat").read().rsplit(")", 1)[1].split()[19])
        uptime = float(open("/proc/uptime").read().split()[0])
        return max(uptime - start_ticks / os.sysconf("SC_CLK_TCK"), 0.0)
    except (OSError, ValueError, IndexError):
        return 0.0


class TimeBudget:
    """Decides, before each point, whether it is expected to finish within the budget (seconds, wall clock).

    ``key(point)``: what decides a server (None: the engine has none to start, e.g. the simulator);
    ``warm_key(point)``: what decides whether a start can reuse an earlier start's compiled graphs;
    ``warm``: warm keys of servers this host started in earlier commands (its caches hold their graphs);
    ``spent_s``: seconds of the budget already gone (the process's age when the budget is made).
    """

    def __init__(self, seconds: Any, key: Callable[[dict[str, Any]], Any] | None = None,
                 warm_key: Callable[[dict[str, Any]], Any] | None = None, warm: Iterable[Any] = (),
                 spent_s: float = 0.0, clock=time.monotonic):
        if (isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not math.isfinite(seconds)
                or seconds <= 0):
            raise ValueError(f"time_budget_s={seconds!r} ({type(seconds).__name__}): must be a finite number of "
                             "seconds > 0, e.g. time_budget_s=540, or null for no limit")
        self.seconds = float(seconds)
        self.key, self.warm_key = key, warm_key or key
        self.clock = clock
        self.t0 = clock() - float(spent_s)
        self.no_server: Any = object()
        self.last_key: Any = self.no_server
        self.last_run: tuple[float, int] | None = None     # (s without the start, requests) of the latest point
        self.warm = set(warm)                    # kinds whose compiled graphs this host has
        self.start_times: list[float] = []       # s, every server start seen
        self.longest_wall = 0.0                  # s, the longest point seen, its start included

    def learn(self, summaries: Iterable[dict[str, Any]]) -> None:
        """Timings of finished points seen elsewhere (the sweep folder's, oldest first): their server starts,
        and the latest one's run, for a command's first point."""
        for s in summaries:
            if s.get("status") != "ok":
                continue
            start = _startup_s(s)
            if start:
                self.start_times.append(start)
            wall = s.get("wall_s")
            requests = (s.get("config") or {}).get("requests")
            if isinstance(wall, (int, float)) and isinstance(requests, int) and requests > 0:
                # a stored point's wall time includes its server's start only if it opened that server, which
                # the summary does not say: its run is the measured level plus its warm-up, at most its wall
                run = float(wall)
                level = (s.get("metrics") or {}).get("duration_s")
                if isinstance(level, (int, float)):
                    warm_s = ((s.get("telemetry") or {}).get("warmup") or {}).get("seconds") or 0.0
                    run = min(run, level + warm_s + RUN_OVERHEAD_S)
                self.last_run = (run, requests)
                self.longest_wall = max(self.longest_wall, float(wall))

    def left(self) -> float:
        return self.seconds - (self.clock() - self.t0)

    def opens_server(self, p: dict[str, Any]) -> bool:
        return self.key is not None and self.key(p) != self.last_key

    def estimate(self, p: dict[str, Any]) -> float | None:
        """Expected seconds for point ``p``; None where nothing has been timed yet."""
        if self.last_run is None:
            return None
        run_s, requests = self.last_run
        est = run_s * max(int(p.get("requests") or requests), 1) / max(requests, 1)
        if self.opens_server(p):
            if self.start_times:
                est += (min if self.warm_key(p) in self.warm else max)(self.start_times)
            else:
                est = max(est, self.longest_wall)
        return MARGIN * est

    def fits(self, p: dict[str, Any]) -> tuple[bool, float | None]:
        est = self.estimate(p)
        return est is None or est <= self.left(), est

    def record(self, p: dict[str, Any], wall_s: float, summary: dict[str, Any]) -> None:
        """Point ``p`` took ``wall_s`` and stored ``summary`` (its telemetry names the server start it
        included, where it started one)."""
        self.longest_wall = max(self.longest_wall, wall_s)
        if summary.get("status") != "ok":
            self.last_key = self.no_server       # its server may be gone: the next point may start one
            return
        start = _startup_s(summary) if self.opens_server(p) else 0.0
        if start:
            self.start_times.append(start)
        self.last_run = (max(wall_s - start, 0.0), max(int(p.get("requests") or 1), 1))
        if self.key is not None:
            self.warm.add(self.warm_key(p))
            self.last_key = self.key(p)
