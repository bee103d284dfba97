"""``python -m harness bench loadgen``: can the load generator offer the load it is asked to?

Starts :mod:`harness.engines.vllm.stub_server` in its own process (it answers every request at
once with ``chunks`` SSE chunks), then offers Poisson arrivals at ``rate`` requests/s and prints
the achieved rate, the schedule lag (p50/p99/max) and chunks parsed per second; then a closed loop
at ``closed_concurrency`` to show the ceiling. Wall-clock numbers of this machine.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
from omegaconf import DictConfig

from workloads import Arrival, Request


def run(cfg: DictConfig) -> int:
    from ..engines.vllm import loadgen, stub_server

    stub, url = stub_server.spawn("--chunks", str(cfg.chunks))
    out = {"cpus": os.cpu_count(), "rate": cfg.rate, "requests": cfg.requests, "chunks": cfg.chunks}
    try:
        n, rate = int(cfg.requests), float(cfg.rate)
        arr = Arrival(kind="poisson", rate=rate, seed=int(cfg.seed))
        offsets = arr.offsets(n)
        reqs = [Request(prompt_len=8, output_len=int(cfg.chunks), arrival_s=float(t)) for t in offsets]
        res = loadgen.run(url, "stub", reqs, arr, vocab=1000)
        chk = res.check
        chunks = sum(r.output_tokens for r in res.records)
        out["open_loop"] = {**chk, "duration_s": res.duration_s, "chunks_per_s": chunks / res.duration_s}
        print(f"open loop, Poisson {rate:g} req/s x {n} requests, {cfg.chunks} chunks each:")
        print(f"  achieved {chk.get('achieved_rate', 0):.1f} req/s (schedule's own rate "
              f"{chk.get('schedule_rate', 0):.1f}, error {100 * chk.get('rate_error', 0):+.2f}%), "
              f"{chunks / res.duration_s:,.0f} chunks/s, {chk['errors']} errors")
        print(f"  schedule lag p50 {1e3 * chk['lag_p50_s']:.2f} ms, p99 {1e3 * chk['lag_p99_s']:.2f} ms, "
              f"max {1e3 * chk['lag_max_s']:.2f} ms -> target (>= 500 req/s, p99 < 10 ms): "
              f"{'met' if chk['on_schedule'] and rate >= 500 and chk['errors'] == 0 else 'NOT met'}")
        c = int(cfg.closed_concurrency)
        reqs = [Request(prompt_len=8, output_len=int(cfg.chunks)) for _ in range(min(n, 5000))]
        res = loadgen.run(url, "stub", reqs, Arrival(kind="closed", max_concurrency=c),
                          vocab=1000)
        ok = [r for r in res.records if r.error is None]
        ttft = np.array([r.first_token_s - r.arrival_s for r in ok])
        out["closed_loop"] = {"concurrency": c, "requests_per_s": len(ok) / res.duration_s,
                              "errors": len(res.records) - len(ok), "ttft_p50_s": float(np.median(ttft))}
        print(f"closed loop, concurrency {c}: {len(ok) / res.duration_s:,.0f} req/s ceiling, "
              f"TTFT p50 {1e3 * np.median(ttft):.2f} ms, {len(res.records) - len(ok)} errors")
    finally:
        stub.stop()
    if cfg.out:
        Path(cfg.out).write_text(json.dumps(out, indent=2))
        print(f"wrote {cfg.out}")
    return 0
