"""Step times from vLLM's per-iteration log (``--enable-logging-iteration-details``), split into the steps that
carry prompt tokens and the decode-only ones.

  python results/h200-kernel-speed/device/iteration_log.py ENGINE_LOG [--point SUMMARY] [--start HH:MM:SS]
      [--end HH:MM:SS] [--json F]

vLLM 0.26 logs one line per engine step (``vllm/v1/metrics/loggers.py``)::

  ... INFO 12-04 15:26:10 [loggers.py:182] Engine 000: Iteration(2): 0 context requests, 0 context tokens,
      141 generation requests, 564 generation tokens, iteration elapsed time: 0.44 ms, ...

"context" is prompt (prefill) work, "generation" decode work. The line's "iteration elapsed time" is not the
step's time: ``capture_iteration_details`` in ``v1/engine/core.py`` times only the wait for the step's result
after the next step was scheduled (0.2-0.4 ms on the H200). The step time is therefore read from how many steps
of each kind ran per second: each second of the window is one bin, busy throughout, so
``mixed_steps * t_mixed + decode_steps * t_decode = 1 s``, and a least-squares fit over the bins gives t_mixed
(a step with prompt tokens: mixed prefill-decode, or prefill only) and t_decode (decode only). The timestamps
are whole seconds, so the bins are coarse: read the times as rough, and the fit's residual says how rough.

One server's log holds every point it ran: ``--point`` takes one point's ``summary.json`` and keeps the steps of
its measured run (``telemetry.run_wall_s``; in older summaries ``provenance.time_utc``, when it was stored, less
``metrics.duration_s``; vLLM's log clock is the host's, UTC on the H200). The window: ``--start``/``--end`` (the
log's clock, inclusive), else from the second after the first decode step to the second before the last step with prompt tokens (the steady part of a closed-loop run: the first second
holds the initial prefill burst, after the last prompt the batch drains), both edges left out as partial bins.
Seconds with under a quarter of the window's median steps are stalls (a Triton JIT compile during the run, which
the point's ``telemetry.jit_compiles_during_run`` names), not busy with steps: they are left out of the fit and
counted. Milliseconds and steps per second.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

LINE = re.compile(r"(?P<date>\d\d-\d\d) (?P<time>\d\d:\d\d:\d\d)\b.*?Engine \d+: Iteration\((?P<n>\d+)\): "
                  r"(?P<creq>\d+) context requests, (?P<ctok>\d+) context tokens, "
                  r"(?P<greq>\d+) generation requests, (?P<gtok>\d+) generation tokens")


@dataclass(frozen=True)
class Step:
    second: int            # seconds since midnight of the log's clock
    context_requests: int
    context_tokens: int    # prompt tokens in this step
    generation_requests: int
    generation_tokens: int  # decode tokens (requests x (1 + k) with speculation)

    @property
    def with_prompt(self) -> bool:
        return self.context_tokens > 0


def _seconds(hms: str) -> int:
    h, m, s = (int(x) for x in hms.split(":"))
    return 3600 * h + 60 * m + s


def _hms(sec: int) -> str:
    return f"{sec // 3600:02d}:{sec // 60 % 60:02d}:{sec % 60:02d}"


def parse(text: str) -> list[Step]:
    """The log's iteration lines, in order; other lines are skipped. A log that spans midnight is refused
    (its seconds would go backwards)."""
    steps = [Step(_seconds(m["time"]), int(m["creq"]), int(m["ctok"]), int(m["greq"]), int(m["gtok"]))
             for m in map(LINE.search, text.splitlines()) if m]
    if any(b.second < a.second for a, b in zip(steps, steps[1:])):
        raise ValueError("the log's clock goes backwards (a run across midnight?): cut it with --start/--end "
                         "on one side of midnight")
    return steps


def point_span(summary: dict) -> tuple[int, int]:
    """The seconds (log clock, inclusive) of a point's measured run, from its summary: ``telemetry.run_wall_s``
    where the engine wrote it, else ``provenance.time_utc`` less ``metrics.duration_s``."""
    import datetime as dt
    wall = (summary.get("telemetry") or {}).get("run_wall_s")
    if isinstance(wall, (list, tuple)) and len(wall) == 2 and all(isinstance(x, (int, float)) for x in wall):
        lo, hi = (dt.datetime.fromtimestamp(x, dt.timezone.utc) for x in wall)
        return lo.hour * 3600 + lo.minute * 60 + lo.second, hi.hour * 3600 + hi.minute * 60 + hi.second
    try:
        end = dt.datetime.fromisoformat(summary["provenance"]["time_utc"])
        duration = float(summary["metrics"]["duration_s"])
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"the point's summary has no provenance.time_utc and metrics.duration_s ({e})") from None
    e = end.hour * 3600 + end.minute * 60 + end.second
    return e - int(duration + 0.999), e


def window(steps: list[Step]) -> tuple[int, int]:
    """The default steady window (seconds, inclusive): see the module's docstring."""
    decode = [s.second for s in steps if s.generation_requests > 0]
    prompt = [s.second for s in steps if s.with_prompt and s.generation_requests > 0]
    if not decode or not prompt:
        raise ValueError("no mixed prefill-decode step in the log: nothing steady to fit; give --start/--end")
    return decode[0] + 1, prompt[-1] - 1


@dataclass(frozen=True)
class Fit:
    start: str
    end: str
    seconds: int                 # bins
    steps: int
    steps_per_s: float
    prompt_share: float          # of the steps, those with prompt tokens
    decode_requests: float       # mean per step
    prompt_tokens: float         # mean per step with prompt tokens
    prompt_requests: float       # mean per step with prompt tokens
    t_prompt_ms: float | None    # fitted time of a step with prompt tokens
    t_decode_ms: float | None    # fitted time of a decode-only step
    residual_ms: float | None    # rms of (fitted busy time - 1 s) over the bins
    stalled_s: int               # seconds left out of the fit as stalls


def fit(steps: list[Step], start: int | None = None, end: int | None = None) -> Fit:
    """Fit the two step times over the seconds ``start..end`` (inclusive; default :func:`window`)."""
    if start is None or end is None:
        auto = window(steps)
        start = auto[0] if start is None else start
        end = auto[1] if end is None else end
    if end < start:
        raise ValueError(f"empty window {_hms(start)}-{_hms(end)}: give --start before --end")
    inside = [s for s in steps if start <= s.second <= end]
    if not inside:
        raise ValueError(f"no iteration line between {_hms(start)} and {_hms(end)}")
    bins = end - start + 1
    a = np.zeros((bins, 2))
    for s in inside:
        a[s.second - start, 0 if s.with_prompt else 1] += 1
    per_bin = a.sum(axis=1)
    busy = a[per_bin >= 0.25 * np.median(per_bin)]
    t: list[float | None] = [None, None]
    residual = None
    # both kinds must vary across the bins for the two times to be told apart
    if len(busy) >= 3 and np.linalg.matrix_rank(busy) == 2:
        sol, *_ = np.linalg.lstsq(busy, np.ones(len(busy)), rcond=None)
        t = [float(x) * 1e3 for x in sol]
        residual = float(np.sqrt(np.mean((busy @ sol - 1.0) ** 2))) * 1e3
    prompt = [s for s in inside if s.with_prompt]
    mean = lambda xs: float(np.mean(xs)) if xs else 0.0
    return Fit(_hms(start), _hms(end), bins, len(inside), len(inside) / bins, len(prompt) / len(inside),
               mean([s.generation_requests for s in inside]), mean([s.context_tokens for s in prompt]),
               mean([s.context_requests for s in prompt]), t[0], t[1], residual, bins - len(busy))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("log", type=Path, help="vLLM's server log, run with --enable-logging-iteration-details")
    ap.add_argument("--point", type=Path, help="a point's summary.json: only the steps of its measured run")
    ap.add_argument("--start", help="first second of the window, HH:MM:SS (the log's clock)")
    ap.add_argument("--end", help="last second of the window, HH:MM:SS")
    ap.add_argument("--json", type=Path, help="also write the fit here")
    args = ap.parse_args(argv)
    try:
        steps = parse(args.log.read_text(errors="replace"))
        if not steps:
            raise ValueError(f"{args.log}: no 'Iteration(N)' line: was vLLM started with "
                             "--enable-logging-iteration-details (engine.extra_args)?")
        if args.point:
            lo, hi = point_span(json.loads(args.point.read_text()))
            steps = [s for s in steps if lo <= s.second <= hi]
            if not steps:
                raise ValueError(f"{args.log}: no iteration line in {args.point}'s run, {_hms(lo)}-{_hms(hi)}: "
                                 "is it this server's point?")
        f = fit(steps, *(None if x is None else _seconds(x) for x in (args.start, args.end)))
    except (OSError, ValueError) as e:
        print(f"iteration_log: {e}", file=sys.stderr)
        return 2
    ms = lambda x: "-" if x is None else f"{x:.1f} ms"
    print(f"{args.log.name}: {f.start}-{f.end} ({f.seconds} s), {f.steps} steps, {f.steps_per_s:.1f} steps/s")
    print(f"  with prompt tokens: {100 * f.prompt_share:.0f}% of the steps, {f.prompt_tokens:.0f} prompt tokens "
          f"of {f.prompt_requests:.1f} requests each; {f.decode_requests:.1f} decoding requests per step")
    print(f"  fitted step time: {ms(f.t_prompt_ms)} with prompt tokens, {ms(f.t_decode_ms)} decode only "
          f"(rms residual {ms(f.residual_ms)} per 1 s bin"
          + (f"; {f.stalled_s} stalled s left out" if f.stalled_s else "") + ")")
    if args.json:
        args.json.write_text(json.dumps(asdict(f), indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
