"""``time_budget_s``: a sweep command's wall-clock allowance, for hosts lent by the call (10 minutes on the
H200 host) or a batch job's time limit.

A point killed by the host's limit is lost, and on vLLM so is the server start it paid for (100-300 s with
CUDA graphs). With a budget the command instead stops before a point it does not expect to finish in time,
writes its call log, analysis and report, and leaves the rest to the next command (which resumes the grid).

A point's expected time is a run plus, where it starts a server, a start (MARGIN on top of both):
  - the run: the latest point this command ran, without its server start, scaled by the requests each asks
    for (a c256 point after a c128 one: 512/256 requests, x2; an overestimate, since the larger batch is faster);
  - the start (vLLM: a point whose :func:`harness.sweep.server_key` differs from the point before). vLLM keeps
    its compiled graphs in a cache on the host, keyed by the draft and the plugin's page shape, so by strategy,
    not by gmu (``warm_key``). A start of a kind this host has started before (in this command, or in an
    earlier one on the same boot: ``warm``) loads them: as long as the shortest start seen (~105 s on the
    H200). Any other compiles: as long as the longest start seen (250-310 s), in this command or in the
    sweep's stored points.
A command's first point always runs: nothing is known about it yet. An estimate can still be short (a slower
strategy, a longer request mix); keep the host's own limit as the backstop.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Iterable

MARGIN = 1.1     # x the estimate: a point's time varies by a few % between runs on one host


class TimeBudget:
    """Decides, before each point, whether it is expected to finish within the budget (seconds, wall clock).

    ``key(point)``: what decides a server (None: the engine has none to start, e.g. the simulator);
    ``warm_key(point)``: what decides whether a start can reuse an earlier start's compiled graphs;
    ``past_starts``: server start times (s) the sweep folder already holds;
    ``warm``: warm keys of servers this host started in earlier commands (its caches hold their graphs).
    """

    def __init__(self, seconds: float, key: Callable[[dict[str, Any]], Any] | None = None,
                 warm_key: Callable[[dict[str, Any]], Any] | None = None, past_starts: Iterable[float] = (),
                 warm: Iterable[Any] = (), clock=time.monotonic):
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or seconds <= 0:
            raise ValueError(f"time_budget_s={seconds}: must be a number of seconds > 0, or null for no limit")
        self.seconds = float(seconds)
        self.key, self.warm_key = key, warm_key or key
        self.clock = clock
        self.t0 = clock()
        self.last_key: Any = object()            # no server up yet
        self.last_run: tuple[float, int] | None = None     # (s without the start, requests) of the latest point
        self.warm = set(warm)                    # kinds whose compiled graphs this host has
        self.start_times: list[float] = []       # s, every server start seen
        self.learn(past_starts)

    def learn(self, starts: Iterable[float]) -> None:
        """Server start times (s) seen elsewhere, e.g. in the sweep folder's points."""
        self.start_times += [float(s) for s in starts if s]

    def left(self) -> float:
        return self.seconds - (self.clock() - self.t0)

    def opens_server(self, p: dict[str, Any]) -> bool:
        return self.key is not None and self.key(p) != self.last_key

    def estimate(self, p: dict[str, Any]) -> float | None:
        """Expected seconds for point ``p``; None before this command has finished a point."""
        if self.last_run is None:
            return None
        run_s, requests = self.last_run
        est = run_s * max(int(p.get("requests") or requests), 1) / max(requests, 1)
        if self.opens_server(p) and self.start_times:
            est += (min if self.warm_key(p) in self.warm else max)(self.start_times)
        return MARGIN * est

    def fits(self, p: dict[str, Any]) -> tuple[bool, float | None]:
        est = self.estimate(p)
        return est is None or est <= self.left(), est

    def record(self, p: dict[str, Any], wall_s: float, startup_s: float | None = None) -> None:
        """Point ``p`` took ``wall_s``; ``startup_s``: the server start it included, where it started one."""
        start = float(startup_s or 0.0) if self.opens_server(p) else 0.0
        if start:
            self.start_times.append(start)
        if self.key is not None:
            self.warm.add(self.warm_key(p))
        self.last_run = (max(wall_s - start, 0.0), max(int(p.get("requests") or 1), 1))
        if self.key is not None:
            self.last_key = self.key(p)
