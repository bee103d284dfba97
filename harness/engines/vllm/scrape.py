"""What the running vLLM says about itself: ``/metrics`` samples, counter diffs, startup lines.

- :func:`parse_metrics`: Prometheus text → ``{name: [(labels, value)]}`` (only ``vllm:`` series).
- :class:`Sampler`: polls ``/metrics`` at ``hz`` (>= 2) during a measured run: KV-cache usage,
  running and waiting requests over time.
- :func:`counter_diff`: the spec-decode and preemption counters' growth over the run, giving the
  acceptance length exactly as ``vllm bench serve`` computes it (1 + accepted / drafts).
- :func:`startup_facts`: the KV-cache size (tokens) and maximum concurrency vLLM logs at start.
"""

from __future__ import annotations

import asyncio
import re
import time
from typing import Any

Series = dict[str, list[tuple[dict[str, str], float]]]

_LINE = re.compile(r'^(vllm:[A-Za-z0-9_:]+)(\{(.*)\})?\s+(\S+)')
_LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"')

COUNTERS = ("vllm:num_preemptions_total", "vllm:spec_decode_num_drafts_total",
            "vllm:spec_decode_num_draft_tokens_total", "vllm:spec_decode_num_accepted_tokens_total",
            "vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total",
            "vllm:prompt_tokens_total", "vllm:generation_tokens_total")
PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"


def parse_metrics(text: str) -> Series:
    out: Series = {}
    for line in text.splitlines():
        if not line.startswith("vllm:"):
            continue
        m = _LINE.match(line)
        if not m:
            continue
        labels = dict(_LABEL.findall(m.group(3) or ""))
        try:
            value = float(m.group(4))
        except ValueError:
            continue
        out.setdefault(m.group(1), []).append((labels, value))
    return out


def total(series: Series, name: str) -> float | None:
    """Sum over label sets (engines, models); None when vLLM does not export it."""
    if name not in series:
        return None
    return sum(v for _, v in series[name])


def counters(series: Series) -> dict[str, Any]:
    out: dict[str, Any] = {name: total(series, name) for name in COUNTERS}
    per_pos: dict[int, float] = {}
    for labels, v in series.get(PER_POS, []):
        if "position" in labels:
            per_pos[int(labels["position"])] = per_pos.get(int(labels["position"]), 0.0) + v
    out[PER_POS] = [per_pos[k] for k in sorted(per_pos)]
    return out


def counter_diff(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """Counter growth over a run, and the spec-decode summary in the simulator's schema."""
    d: dict[str, Any] = {}
    for name in COUNTERS:
        a, b = after.get(name), before.get(name)
        d[name] = None if a is None else a - (b or 0.0)
    pa, pb = after.get(PER_POS) or [], before.get(PER_POS) or []
    per_pos = [a - (pb[i] if i < len(pb) else 0.0) for i, a in enumerate(pa)]
    drafts = d["vllm:spec_decode_num_drafts_total"]
    accepted = d["vllm:spec_decode_num_accepted_tokens_total"]
    d["spec_decode"] = {
        "num_drafts": drafts, "num_draft_tokens": d["vllm:spec_decode_num_draft_tokens_total"],
        "num_accepted_tokens": accepted, "num_accepted_tokens_per_pos": per_pos,
        "acceptance_length": (1 + accepted / drafts) if drafts else None,
        "acceptance_rate_per_pos": [p / drafts for p in per_pos] if drafts else None}
    return d


def cache_config(series: Series) -> dict[str, str]:
    """The labels of ``vllm:cache_config_info`` (num_gpu_blocks, block_size, enable_prefix_caching...)."""
    rows = series.get("vllm:cache_config_info") or []
    return dict(rows[0][0]) if rows else {}


class Sampler:
    """Polls ``/metrics`` at ``hz`` during a run (an asyncio task beside the load generator)."""

    def __init__(self, url: str, hz: float = 4.0):
        if hz < 2:
            raise ValueError(f"engine.metrics_hz={hz}: sample at least twice a second")
        self.url, self.period = url.rstrip("/") + "/metrics", 1.0 / hz
        self.t: list[float] = []
        self.kv: list[float] = []
        self.running: list[float] = []
        self.waiting: list[float] = []
        self.errors = 0
        self.t0 = time.perf_counter()

    async def loop(self) -> None:
        import aiohttp

        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as session:
            while True:
                start = time.perf_counter()
                try:
                    async with session.get(self.url) as r:
                        text = await r.text()
                    s = parse_metrics(text)
                    self.add(start - self.t0, total(s, "vllm:kv_cache_usage_perc"),
                             total(s, "vllm:num_requests_running"), total(s, "vllm:num_requests_waiting"))
                except Exception:  # a missed sample is counted, never fatal
                    self.errors += 1
                await asyncio.sleep(max(0.0, self.period - (time.perf_counter() - start)))

    def add(self, t: float, kv: float | None, running: float | None, waiting: float | None) -> None:
        """One sample (s since the sampler started; the pool's usage as a fraction; requests). A gauge the
        server did not export is None: kept as missing, never read as zero."""
        self.t.append(t)
        self.kv.append(kv)
        self.running.append(running)
        self.waiting.append(waiting)

    def summary(self, max_num_seqs: int, keep: int = 200) -> dict[str, Any]:
        """Telemetry in the simulator's schema (usage as a fraction of the pool, counts of requests) and the
        memory-bound evidence: whether in one sample requests waited while fewer than ``max_num_seqs`` ran, and
        the pool's usage in that same sample (``blocked_kv_peak``: the highest such usage; analysis compares it
        with thresholds.peak_kv_usage). Waiting with every seat taken is waiting for a batch slot, counted
        apart; with seats free it is waiting for blocks or the step's token budget (vLLM's gauges do not say
        which, so the usage in the same sample decides). Samples that lack a gauge count as missing."""
        n = len(self.t)
        step = max(1, n // keep)
        dt = [self.t[i + 1] - self.t[i] for i in range(n - 1)] + ([self.period] if n else [])
        whole = [i for i in range(n) if None not in (self.kv[i], self.running[i], self.waiting[i])]
        queued = [i for i in whole if self.waiting[i] > 0]
        free = [i for i in queued if self.running[i] < max_num_seqs]
        kv = [x for x in self.kv if x is not None]
        running = [x for x in self.running if x is not None]
        waiting = [x for x in self.waiting if x is not None]
        return {
            "kv_usage": [[round(self.t[i], 3), self.kv[i]] for i in range(0, n, step) if self.kv[i] is not None],
            # the same samples with the batch and the queue (the report's timelines); a missing gauge stays None
            "timeline": {"t_s": [round(self.t[i], 3) for i in range(0, n, step)],
                         "kv_usage": [self.kv[i] for i in range(0, n, step)],
                         "running": [self.running[i] for i in range(0, n, step)],
                         "waiting": [self.waiting[i] for i in range(0, n, step)]},
            "peak_kv_usage": max(kv, default=0.0),
            "max_running": int(max(running, default=0)),
            "mean_running": sum(running) / len(running) if running else 0.0,
            "max_waiting": int(max(waiting, default=0)),
            "waiting_for_memory_s": sum(dt[i] for i in free),      # seats free: blocks or the token budget
            "waiting_s": {"batch_slot": sum(dt[i] * self.waiting[i] for i in queued
                                            if self.running[i] >= max_num_seqs),
                          "free_seats": sum(dt[i] * self.waiting[i] for i in free)},
            "memory_evidence": ({"source": "metrics", "samples": len(whole), "blocked_samples": len(free),
                                 "blocked_kv_peak": max((self.kv[i] for i in free), default=None)}
                                if whole else None),
            "metrics_samples": n, "metrics_hz": 1.0 / self.period, "metrics_missed": self.errors,
            "metrics_incomplete": n - len(whole),
        }


_KV_TOKENS = re.compile(r"KV cache size:\s*([\d,]+)\s*tokens")
_MAX_CONC = re.compile(r"Maximum concurrency for ([\d,]+) tokens per request:\s*([\d.]+)x")
_BLOCKS = re.compile(r"num_gpu_blocks(?: is|=|:)\s*(\d+)")
# vLLM's capture progress bars: "Capturing CUDA graphs (decode, FULL)", "(mixed prefill-decode, PIECEWISE)".
_CAPTURE = re.compile(r"Capturing CUDA graphs \(([a-z -]+), ([A-Z_]+)\)")
_EAGER = re.compile(r"Cudagraph is disabled under eager mode|enforce_eager=True|cudagraph_mode=NONE|"
                    r"CUDAGraphMode\.NONE")
# vLLM 0.26's line before capture: "Profiling CUDA graph memory: PIECEWISE=49 (largest=512), FULL=49 (largest=512)".
_CAPTURE_SIZES = re.compile(r"Profiling CUDA graph memory: (.*)")
_CAPTURE_SIZE = re.compile(r"([A-Z_]+)=(\d+) \(largest=(\d+)\)")
# Flat JSON (no nested braces): tensor-parallel ranks write their lines at once, and two can land on one line.
_PATH = re.compile(r"COMMITBENCH_GDN_PATH (\{[^{}]*\})")
# vLLM's JIT monitor (0.26 and 0.32), one line per compile with --jit-monitor-verbose.
_JIT = re.compile(r"JIT compilation during inference: ([A-Za-z_]\w*)")


def graph_mode(log_text: str) -> str:
    """The CUDA-graph mode vLLM ran, from the graphs it captured (not the mode it was asked for):
    e.g. ``FULL (decode) + PIECEWISE (mixed prefill-decode)``, or ``none`` when it captured none."""
    seen: dict[str, str] = {}
    for batch, mode in _CAPTURE.findall(log_text):
        seen[batch.strip()] = mode
    if not seen:
        return "none (eager)" if _EAGER.search(log_text) else "none (no capture in the log)"
    order = sorted(seen, key=lambda b: b != "decode")
    return " + ".join(f"{seen[b]} ({b})" for b in order)


def graph_capture(log_text: str) -> dict[str, dict[str, int]] | None:
    """The CUDA graphs vLLM captured per mode, from its last start in the log: ``{"FULL": {"graphs": 49,
    "largest": 512}, ...}`` (largest in tokens per step: a step past it ran without that mode's graph), or None
    where the log has no such line (eager, CPU, a vLLM that does not print it)."""
    m = _CAPTURE_SIZES.findall(log_text)
    if not m:
        return None
    return {mode: {"graphs": int(n), "largest": int(big)} for mode, n, big in _CAPTURE_SIZE.findall(m[-1])} or None


def gdn_path(log_text: str) -> dict[str, Any] | None:
    """What the plugin says ran the GDN layers' speculative rows (its tagged line), if it says so."""
    import json

    m = _PATH.findall(log_text)
    if not m:
        return None
    try:
        return json.loads(m[-1])
    except ValueError:
        return None


def jit_compiles(log_text: str) -> dict[str, int]:
    """Kernels vLLM's JIT monitor saw compiled after the engine's own warm-up, by name, with counts:
    each is a compile (a second or more for a big Triton kernel) inside whatever request was running."""
    out: dict[str, int] = {}
    for name in _JIT.findall(log_text):
        out[name] = out.get(name, 0) + 1
    return out


def startup_facts(log_text: str) -> dict[str, Any]:
    """KV-cache tokens and max concurrency from vLLM's startup lines (the last start in the log)."""
    out: dict[str, Any] = {}
    if m := _KV_TOKENS.findall(log_text):
        out["kv_cache_tokens"] = int(m[-1].replace(",", ""))
    if m := _MAX_CONC.findall(log_text):
        out["max_concurrency_tokens_per_request"] = int(m[-1][0].replace(",", ""))
        out["max_concurrency_max_len"] = float(m[-1][1])
    if m := _BLOCKS.findall(log_text):
        out["num_blocks_logged"] = int(m[-1])
    out["graph_mode"] = graph_mode(log_text)
    out["graph_capture"] = graph_capture(log_text)
    return out
