"""The streaming load generator: requests to an OpenAI-compatible ``/v1/completions``, timed per chunk.

What ``vllm bench serve`` measures, from the client side: each request's TTFT, inter-token
latencies (one per streamed chunk after the first) and end-to-end time, on ``time.perf_counter``
(monotonic) relative to the start of the run. Two ways to offer load:

- **closed loop** (``Arrival(kind="closed", max_concurrency=C)``): at most C requests in flight,
  the next one sent as soon as one finishes;
- **open loop**: every request at its scheduled offset (``Request.arrival_s``: Poisson, gamma or
  a replayed trace, drawn by :mod:`workloads`), whatever the server's state.

Errors are recorded on the request (HTTP status and body, connection errors, a stream that ends
without ``[DONE]``), never dropped. The run checks itself: the *schedule lag* (how late each
request left against its schedule) and the *achieved rate* against the schedule's own rate are
reported, since a generator that cannot keep up silently under-offers load.

Prompts are token ids (``prompt_len`` of them, drawn from the request's own seed), so the server
neither tokenizes nor can share a prefix between requests.
"""

from __future__ import annotations

import asyncio
import gc
import json
import time
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Sequence

import numpy as np

from workloads import Arrival, Request

from ..base import RequestRecord


@dataclass
class LoadResult:
    """Per-request records (seconds from the run's start), every inter-chunk gap, and the self-check."""

    records: list[RequestRecord]
    itl_s: np.ndarray
    lag_s: np.ndarray                    # send time - scheduled time per request (open loop; zeros closed)
    duration_s: float
    check: dict[str, Any] = field(default_factory=dict)
    aborted: str | None = None           # the watchdog's reason when the run was stopped early
    started_wall: float | None = None    # time.time() at the run's start: where other clocks place it


def prompt_ids(req: Request, index: int, vocab: int, seed: int = 0) -> list[int]:
    """``prompt_len`` token ids: the request's own if it has them, else uniform in [10, vocab)."""
    if req.prompt_token_ids is not None and len(req.prompt_token_ids) == req.prompt_len:
        return [int(t) % vocab for t in req.prompt_token_ids]
    rng = np.random.default_rng((seed, index))
    return rng.integers(10, max(vocab, 11), req.prompt_len).tolist()


def _body(model: str, prompt: list[int], req: Request) -> bytes:
    return json.dumps({
        "model": model, "prompt": prompt, "max_tokens": req.output_len, "min_tokens": req.output_len
        if req.ignore_eos else 0, "ignore_eos": req.ignore_eos, "temperature": 0.0, "stream": True,
        "stream_options": {"include_usage": True}}).encode()


async def _one(session, url: str, body: bytes, rec: RequestRecord, t0: float, gaps: list[float],
               timeout_s: float) -> None:
    import aiohttp

    last = None
    chunks = 0
    done = False
    try:
        async with session.post(url, data=body, headers={"Content-Type": "application/json"},
                                timeout=aiohttp.ClientTimeout(total=None, sock_read=timeout_s)) as resp:
            if resp.status != 200:
                text = (await resp.text())[:300]
                rec.error = f"HTTP {resp.status}: {text}"
                return
            async for raw in resp.content:
                if not raw.startswith(b"data:"):
                    continue
                data = raw[5:].strip()
                if data == b"[DONE]":
                    done = True
                    break
                now = time.perf_counter()
                msg = json.loads(data)
                if msg.get("error"):
                    rec.error = f"stream error: {str(msg['error'])[:300]}"
                    return
                choices = msg.get("choices") or []
                if choices and (choices[0].get("text") or choices[0].get("token_ids")):
                    chunks += 1
                    if last is None:
                        rec.first_token_s = now - t0
                    else:
                        gaps.append(now - last)
                    last = now
                usage = msg.get("usage")
                if usage:
                    rec.output_tokens = int(usage.get("completion_tokens") or 0)
    except asyncio.CancelledError:
        rec.error = "cancelled: the run was stopped before this request finished"
        raise
    except asyncio.TimeoutError:
        rec.error = f"timeout: no data for {timeout_s:g} s (engine.request_timeout_s)"
        return
    except Exception as e:   # connection refused/reset, bad JSON: the request's error, not the run's
        rec.error = f"{type(e).__name__}: {e}"[:300]
        return
    if not done:
        rec.error = f"stream ended without [DONE] after {chunks} chunks (server died or reset the connection?)"
        return
    if rec.output_tokens == 0:
        rec.output_tokens = chunks   # no usage chunk: count chunks (a lower bound under speculation)
    rec.finish_s = time.perf_counter() - t0


async def run_async(base_url: str, model: str, requests: Sequence[Request], arrival: Arrival, *, vocab: int,
                    seed: int = 0, request_timeout_s: float = 600.0, max_connections: int = 0,
                    during: Callable[[], Awaitable[None]] | None = None,
                    watchdog: Callable[[], Awaitable[str | None]] | None = None, progress=None) -> LoadResult:
    """Offer ``requests`` to ``base_url`` under ``arrival``.

    ``during`` runs alongside (telemetry). ``watchdog``, if given, runs alongside too; when it returns
    a reason (the server died or stopped answering), the run stops at once: requests in flight are
    recorded as cancelled and the rest as not sent, with that reason (``LoadResult.aborted``).
    """
    import aiohttp

    url = base_url.rstrip("/") + "/v1/completions"
    n = len(requests)
    bodies = [_body(model, prompt_ids(r, i, vocab, seed), r) for i, r in enumerate(requests)]
    recs = [RequestRecord(id=i, arrival_s=0.0, prompt_len=r.prompt_len, output_len=r.output_len)
            for i, r in enumerate(requests)]
    gaps: list[float] = []
    lag, sent, started = np.zeros(n), np.zeros(n), np.zeros(n, dtype=bool)
    sched = _schedule(requests, arrival)
    # Objects built so far (bodies, records) never die during the run: keep the collector off them,
    # which removes the 100+ ms full collections that otherwise show up as schedule lag.
    gc.collect()
    gc.freeze()
    try:
        conn = aiohttp.TCPConnector(limit=max_connections, force_close=False, ttl_dns_cache=None)
        async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=None)) as session:
            side = asyncio.ensure_future(during()) if during else None
            t0 = time.perf_counter()
            wall0 = time.time()

            async def go(i: int, due: float) -> None:
                now = time.perf_counter()
                started[i] = True
                sent[i] = now - t0
                lag[i] = max(0.0, now - t0 - due)
                recs[i].arrival_s = sent[i] if sched is None else due
                await _one(session, url, bodies[i], recs[i], t0, gaps, request_timeout_s)
                if progress:
                    progress()

            main = asyncio.ensure_future(_offer(n, arrival, sched, t0, go))
            aborted = await _until_done_or_stopped(main, watchdog, side)
            duration = time.perf_counter() - t0
    finally:
        gc.unfreeze()
    if aborted:
        _mark_aborted(recs, started, aborted)
    return LoadResult(records=recs, itl_s=np.array(gaps), lag_s=lag, duration_s=duration,
                      check=self_check(arrival, sched, sent, lag, recs), aborted=aborted, started_wall=wall0)


def _schedule(requests: Sequence[Request], arrival: Arrival) -> np.ndarray | None:
    """Each request's due time (s from the run's start, the earliest at 0) under an open-loop arrival; None
    under closed-loop concurrency, where a request is due when a slot frees."""
    if arrival.kind == "closed":
        return None
    sched = np.array([r.arrival_s if r.arrival_s is not None else np.nan for r in requests], dtype=float)
    if np.isnan(sched).any():
        raise ValueError(f"arrival.kind={arrival.kind}: every request needs arrival_s (build the workload "
                         "with this arrival so it draws the schedule)")
    return sched - (sched.min() if len(sched) else 0.0)


async def _offer(n: int, arrival: Arrival, sched: np.ndarray | None, t0: float,
                 go: Callable[[int, float], Awaitable[None]]) -> None:
    """Start ``go(i, due)`` for every request: closed loop, as soon as one of ``arrival.max_concurrency`` slots
    frees (due: now); open loop, at its time in ``sched`` (s from ``t0``). Returns when all have finished; a
    cancellation cancels the requests in flight."""
    tasks = []
    try:
        if sched is None:
            sem = asyncio.Semaphore(int(arrival.max_concurrency))

            async def gated(i: int) -> None:
                try:
                    await go(i, time.perf_counter() - t0)
                finally:
                    sem.release()

            for i in range(n):
                await sem.acquire()
                tasks.append(asyncio.ensure_future(gated(i)))
        else:
            for i in np.argsort(sched, kind="stable"):
                wait = sched[i] - (time.perf_counter() - t0)
                if wait > 0:
                    await asyncio.sleep(wait)
                tasks.append(asyncio.ensure_future(go(int(i), float(sched[i]))))
        await asyncio.gather(*tasks)
    except asyncio.CancelledError:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


async def _until_done_or_stopped(main: asyncio.Future, watchdog: Callable[[], Awaitable[str | None]] | None,
                                 side: asyncio.Future | None) -> str | None:
    """Await the offer ``main``; with a ``watchdog`` beside it, stop ``main`` at once when the watchdog returns a
    reason (returned). The watchdog and the ``side`` task (telemetry) are cancelled when the offer ends."""
    watch = asyncio.ensure_future(watchdog()) if watchdog else None
    aborted = None
    try:
        if watch is None:
            await main
        else:
            await asyncio.wait({main, watch}, return_when=asyncio.FIRST_COMPLETED)
            if watch.done() and not main.done() and watch.result():
                aborted = watch.result()
                main.cancel()
                await asyncio.gather(main, return_exceptions=True)
            else:
                await main
    finally:
        for task in (watch, side):
            if task is not None and not task.done():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
    return aborted


def _mark_aborted(recs: list[RequestRecord], started: np.ndarray, aborted: str) -> None:
    """Records of a run the watchdog stopped: never sent, or cancelled in flight, for ``aborted``'s reason."""
    for i, r in enumerate(recs):
        if not started[i]:
            r.error = f"not sent: {aborted}"
        elif r.error and r.error.startswith("cancelled"):
            r.error = f"cancelled: {aborted}"


def run(*args, **kwargs) -> LoadResult:
    """Synchronous :func:`run_async` (uvloop when installed: it is what keeps lag low at high rates)."""
    try:
        import uvloop

        return uvloop.run(run_async(*args, **kwargs))
    except ImportError:
        return asyncio.run(run_async(*args, **kwargs))


def self_check(arrival: Arrival, sched: np.ndarray | None, sent: np.ndarray, lag: np.ndarray,
               recs: Sequence[RequestRecord]) -> dict[str, Any]:
    """Did the generator offer the load it was asked to? Rates are requests/s; lags seconds."""
    n = len(sent)
    out: dict[str, Any] = {"kind": arrival.kind, "requests": n,
                           "errors": sum(r.error is not None for r in recs)}
    if n > 1 and sent.max() > sent.min():
        out["achieved_rate"] = (n - 1) / float(sent.max() - sent.min())
    if sched is None:
        out["max_concurrency"] = arrival.max_concurrency
        return out
    if n > 1 and sched.max() > sched.min():
        out["schedule_rate"] = (n - 1) / float(sched.max() - sched.min())
    out["target_rate"] = arrival.rate
    out.update(lag_p50_s=float(np.percentile(lag, 50)) if n else 0.0,
               lag_p99_s=float(np.percentile(lag, 99)) if n else 0.0, lag_max_s=float(lag.max()) if n else 0.0)
    ok = out["lag_p99_s"] < 0.010
    if "achieved_rate" in out and "schedule_rate" in out:
        out["rate_error"] = out["achieved_rate"] / out["schedule_rate"] - 1
        ok = ok and abs(out["rate_error"]) < 0.05
    out["on_schedule"] = bool(ok)
    return out
