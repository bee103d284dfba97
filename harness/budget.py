"""``time_budget_s``: a sweep command's wall-clock allowance, for hosts lent by the call (10 minutes on the
H200 host) or a batch job's time limit.

A point killed by the host's limit is lost, and on vLLM so is the server start it paid for (100-250 s with
CUDA graphs). With a budget the command instead stops before a point it does not expect to finish in time,
writes its call log, analysis and report, and leaves the rest to the next command (which resumes the grid).

The estimate is this command's own history, the latest comparable point it ran plus a margin (MARGIN), so the
host's speed and its caches as they are now count (a host's first vLLM start compiles for ~250 s, later ones
reuse much of that):
  - a point that starts a server (vLLM: its :func:`harness.sweep.server_key` differs from the point before)
    is expected to take as long as the latest point that started one, its start included;
  - a point on the server already up, as long as the latest such point (or, before there is one, as the
    latest point that started a server).
A command's first point always runs: nothing is known about it yet. The estimate can be wrong both ways (a
heavier strategy, a longer grid point); keep the host's own limit as a backstop.
"""

from __future__ import annotations

import time
from typing import Any, Callable

MARGIN = 1.1     # x the latest comparable point: run-to-run spread of a point's time on one host is a few %


class TimeBudget:
    """Decides, before each point, whether it is expected to finish within the budget (seconds, wall clock)."""

    def __init__(self, seconds: float, key: Callable[[dict[str, Any]], Any] | None, clock=time.monotonic):
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or seconds <= 0:
            raise ValueError(f"time_budget_s={seconds}: must be a number of seconds > 0, or null for no limit")
        self.seconds = float(seconds)
        self.key = key                      # what decides a server; None: the engine has none to start
        self.clock = clock
        self.t0 = clock()
        self.last_key: Any = object()       # no server up yet
        self.opening: list[float] = []      # s, points that started a server (the start included)
        self.reusing: list[float] = []      # s, points on a server already up

    def left(self) -> float:
        return self.seconds - (self.clock() - self.t0)

    def opens_server(self, p: dict[str, Any]) -> bool:
        return self.key is not None and self.key(p) != self.last_key

    def estimate(self, p: dict[str, Any]) -> float | None:
        """Expected seconds for point ``p``; None before this command has run a comparable point."""
        if self.key is None:
            done = self.opening + self.reusing
        elif self.opens_server(p):
            done = self.opening
        else:
            done = self.reusing or self.opening
        return MARGIN * done[-1] if done else None

    def fits(self, p: dict[str, Any]) -> tuple[bool, float | None]:
        est = self.estimate(p)
        return est is None or est <= self.left(), est

    def record(self, p: dict[str, Any], seconds: float) -> None:
        (self.opening if self.opens_server(p) or self.key is None else self.reusing).append(seconds)
        if self.key is not None:
            self.last_key = self.key(p)
