"""The embedded engine: a discrete-event model of vLLM v1 serving a GDN hybrid under a commit strategy.

Scheduler (as vLLM v1 does it): continuous batching under ``max_num_seqs`` and
``max_num_batched_tokens``; running requests first (decodes verify the draft, prefills go on in
chunks), then waiting ones FCFS while the token budget lasts and the pool has their blocks; a
running request that cannot grow preempts the newest running ones (recompute); under speculation
each step reserves lookahead slots for the next drafts. Memory: :mod:`.memory`. Step time:
:mod:`.step_time`. Acceptance: :mod:`.acceptance`.

Speed: when every running request is decoding and nothing can be admitted, the next event
(a completion, the pool running out, an arrival) is found for many steps at once with numpy
(acceptance drawn for the whole stretch), so a point costs a few thousand vectorised iterations.
"""

from __future__ import annotations

from collections import deque
from typing import Any, Mapping

import numpy as np

from ...telemetry import PERCENTILES
from ..base import Point, PointResult, RequestRecord, register_engine
from ..acceptance_rates import Acceptance, rates_for
from .memory import build_pool
from .stale import stale
from .step_time import build_step_model

NAN = float("nan")


@register_engine("sim")
class SimEngine:
    def __init__(self, cfg: Mapping[str, Any], log_dir: Any = None):   # no server: nothing to log
        self.cfg = dict(cfg)

    def run(self, point: Point) -> PointResult:
        return PointSimulation(point, self.cfg).go()


class PointSimulation:
    """One point simulated step by step: arrivals, vLLM-style scheduling (chunked prefill, FCFS admission,
    preemption of the newest when the pool is short), each step timed by the calibrated step model, and the
    point's per-request records and telemetry at the end (:meth:`go`). Times in seconds."""

    def __init__(self, point: Point, cfg: Mapping[str, Any]):
        self.p = point
        self.cfg = cfg
        tree = point.tree
        opts = point.strategy_options              # e.g. the deferred strategies' buffer_len (conf/strategies/)
        tp = int(cfg["tensor_parallel_size"])     # per-GPU pool and weights; the step spans tp GPUs
        self.pool = build_pool(point.model, point.gpu, point.strategy, tree, point.gmu, cfg, opts, tp=tp,
                               kv_cache_bytes=point.kv_cache_bytes)
        plan = self.pool.plan
        self.bs, self.attn_groups = plan.block_size, plan.attention_groups
        self.pages = plan.gdn_groups * plan.gdn_pages
        self.num_blocks = self.pool.num_blocks
        self.spec = tree is not None
        self.k = tree.num_drafts if tree is not None else 0
        self.depth = tree.draft_depth if tree is not None else 0
        self.lookahead = self.depth
        self.acc = Acceptance(rates_for(tree, cfg["acceptance"]) if tree is not None else np.zeros(0), point.seed)
        self.step = build_step_model(point.model, point.gpu, point.strategy, tree, self.acc.mean_length, cfg,
                                     opts, tp=tp)
        self.horizon = int(cfg["horizon_steps"])
        n = len(point.requests)
        self.prompt = np.array([r.prompt_len for r in point.requests], dtype=np.int64)
        self.out = np.array([r.output_len for r in point.requests], dtype=np.int64)
        self.arrival = np.full(n, NAN)
        self.first = np.full(n, NAN)
        self.finish = np.full(n, NAN)
        self.got = np.zeros(n, dtype=np.int64)          # output tokens produced
        self.preempted = np.zeros(n, dtype=np.int64)
        self.error: dict[int, str] = {}
        # Running set, structure of arrays, oldest admission first.
        self.rid = np.zeros(0, dtype=np.int64)
        self.kv = np.zeros(0, dtype=np.int64)           # tokens in the KV cache
        self.left = np.zeros(0, dtype=np.int64)         # tokens still to prefill (prompt, or all on resume)
        self.held = np.zeros(0, dtype=np.int64)         # blocks held
        self.waiting: deque[int] = deque()
        self.t = 0.0
        self.next_id = 0
        # Telemetry.
        self.samples_t: list[np.ndarray] = []
        self.samples_used: list[np.ndarray] = []
        self.samples_running: list[np.ndarray] = []
        self.samples_waiting: list[np.ndarray] = []
        self.itl_d: list[np.ndarray] = []
        self.itl_w: list[np.ndarray] = []
        self.steps = 0
        self.preemptions = 0
        # why the queue waited, from the scheduler's own decisions: for blocks (memory), for a batch slot
        # (max_num_seqs), for the step's token budget (prefill); request-seconds, and the steps at which the
        # head of the queue was refused for blocks (the memory-bound evidence)
        self.wait_s = {"memory": 0.0, "batch_slot": 0.0, "prefill_budget": 0.0}
        self.waited_mem: set[int] = set()
        self.memory_refusals = 0
        self.drafts = 0
        self.accepted_per_pos = np.zeros(self.depth, dtype=np.int64)
        # The step model's inputs and output of every step, when someone asks (harness.calibrate re-times a
        # schedule under other constants): rows of (n_decode, ctx_decode, prefill_tokens, prefill_reqs,
        # prefill_attn, seconds) arrays
        self.trace: list[tuple[np.ndarray, ...]] | None = None

    # -- arrivals ------------------------------------------------------------------
    def _arrive_until(self, t: float) -> None:
        a = self.p.arrival
        n = len(self.p.requests)
        if a.open_loop:
            while self.next_id < n and self.p.requests[self.next_id].arrival_s <= t:
                self._enqueue(self.next_id, self.p.requests[self.next_id].arrival_s)
                self.next_id += 1
        else:
            in_flight = len(self.rid) + len(self.waiting)
            while self.next_id < n and in_flight < a.max_concurrency:
                self._enqueue(self.next_id, t)
                self.next_id += 1
                in_flight += 1

    def _enqueue(self, rid: int, t: float) -> None:
        need = self.prompt[rid] + self.out[rid]
        if need > self.p.max_model_len:
            self.arrival[rid] = self.finish[rid] = t
            self.error[rid] = (f"prompt ({self.prompt[rid]}) + output ({self.out[rid]}) tokens exceed "
                               f"max_model_len={self.p.max_model_len}")
            return
        self.arrival[rid] = t
        self.waiting.append(rid)

    def _next_arrival_time(self) -> float:
        if self.p.arrival.open_loop and self.next_id < len(self.p.requests):
            return float(self.p.requests[self.next_id].arrival_s)
        return float("inf")

    # -- blocks --------------------------------------------------------------------
    def _blocks(self, tokens):
        return self.attn_groups * -(-np.asarray(tokens) // self.bs) + self.pages

    @property
    def used(self) -> int:
        return int(self.held.sum())

    # -- the loop ------------------------------------------------------------------
    def go(self) -> PointResult:
        n = len(self.p.requests)
        guard = 0
        while True:
            self._arrive_until(self.t)
            if len(self.rid) == 0 and not self.waiting:
                if self.next_id >= n:
                    break
                self.t = max(self.t, self._next_arrival_time())
                continue
            guard += 1
            if guard > 50 * n * (int(self.out.max()) + 8):
                raise RuntimeError("sim: no progress; a request can never fit the KV pool "
                                   f"({self.num_blocks} blocks)")
            if len(self.rid) and (self.left == 0).all() and not self._admissible():
                if self._stretch():
                    continue
            self._single_step()
        return self._result()

    def _admissible(self) -> bool:
        """Could the head of the queue start this step (seats, and blocks for its first chunk)?"""
        if not self.waiting or len(self.rid) >= self.p.max_num_seqs:
            return False
        rid = self.waiting[0]
        chunk = min(self._to_prefill(rid), self.p.max_num_batched_tokens - len(self.rid) * (1 + self.k))
        if chunk <= 0:
            return False
        return self.used + int(self._blocks(chunk)) <= self.num_blocks

    def _queue_reason(self) -> str:
        """Why the head of the queue is not running now: no batch slot (max_num_seqs running), no room in the
        step's token budget for its first chunk, or no blocks for it (memory)."""
        if len(self.rid) >= self.p.max_num_seqs:
            return "batch_slot"
        rid = self.waiting[0]
        chunk = min(self._to_prefill(rid), self.p.max_num_batched_tokens - len(self.rid) * (1 + self.k))
        if chunk <= 0:
            return "prefill_budget"
        return "memory" if self.used + int(self._blocks(chunk)) > self.num_blocks else "prefill_budget"

    def _count_wait(self, reason: str, dt: float, steps: int = 1) -> None:
        self.wait_s[reason] += dt * len(self.waiting)
        if reason == "memory":
            self.memory_refusals += steps
            self.waited_mem.update(self.waiting)

    def _to_prefill(self, rid: int) -> int:
        return int(self.prompt[rid] + self.got[rid])  # a preempted request recomputes its output too

    def _single_step(self) -> None:
        """One engine step: schedule it as vLLM's scheduler would, time it with the step model, apply it."""
        decode, new, chunk, blocked_by_memory = self._schedule()
        if not len(self.rid):
            # Nothing can run: the head of the queue needs more blocks than the whole pool.
            rid = self.waiting.popleft()
            self.finish[rid] = self.t
            self.error[rid] = (f"needs {int(self._blocks(self._to_prefill(rid)))} blocks; the pool has "
                               f"{self.num_blocks}")
            return
        n_dec = int(decode.sum())
        ctx = float(self.kv[decode].sum())
        pre = chunk > 0
        inputs = (n_dec, ctx, float(chunk.sum()), int(pre.sum()),
                  float((chunk[pre] * (self.kv[pre] + chunk[pre] / 2)).sum()))
        dt = float(self.step.time(*inputs))
        if self.trace is not None:
            self.trace.append(tuple(np.array([x], dtype=float) for x in (*inputs, dt)))
        if self.waiting:
            # _schedule admitted FCFS until a request did not fit (blocks), the seats or the token budget ran out
            self._count_wait("memory" if blocked_by_memory else
                             "batch_slot" if len(self.rid) >= self.p.max_num_seqs else "prefill_budget", dt)
        self.t += dt
        self.steps += 1
        self._apply(decode, chunk, n_dec, dt)

    def _schedule(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, bool]:
        """The step's batch over the running set after preemption and admission: per running request, whether
        it decodes, its decode tokens (1 + k) and its prefill chunk (tokens); and whether a waiting request was
        left out for want of blocks. Running requests keep their decodes and chunks first (oldest first), the
        newest are preempted until the rest fit, then waiting requests are admitted FCFS."""
        p = self.p
        budget = p.max_num_batched_tokens
        decode = self.left == 0
        new = np.where(decode, 1 + self.k, 0)
        budget -= int(new.sum())
        # Prefill chunks of running requests, oldest first.
        chunk = np.zeros(len(self.rid), dtype=np.int64)
        for i in np.flatnonzero(~decode):
            c = min(int(self.left[i]), max(budget, 0))
            chunk[i] = c
            budget -= c
        need_tokens = self.kv + new + chunk + np.where(decode | (chunk == self.left), self.lookahead, 0)
        need = np.maximum(self._blocks(need_tokens), self.held)
        # Preempt the newest until the rest can grow.
        while len(self.rid) and int(need.sum()) > self.num_blocks:
            self._preempt_last()
            need, new, chunk = need[:-1], new[:-1], chunk[:-1]
            decode = decode[:-1]
        self.held = need.astype(np.int64)
        budget = p.max_num_batched_tokens - int(new.sum() + chunk.sum())
        # Admit waiting requests FCFS.
        blocked_by_memory = False
        while self.waiting and len(self.rid) < p.max_num_seqs and budget > 0:
            rid = self.waiting[0]
            todo = self._to_prefill(rid)
            c = min(todo, budget)
            blocks = int(self._blocks(c + (self.lookahead if c == todo else 0)))
            if self.used + blocks > self.num_blocks:
                blocked_by_memory = True
                break
            self.waiting.popleft()
            self.rid = np.append(self.rid, rid)
            self.kv = np.append(self.kv, 0)
            self.left = np.append(self.left, todo)
            self.held = np.append(self.held, blocks)
            new = np.append(new, 0)
            chunk = np.append(chunk, c)
            decode = np.append(decode, False)
            budget -= c
        return decode, new, chunk, blocked_by_memory

    def _apply(self, decode: np.ndarray, chunk: np.ndarray, n_dec: int, dt: float) -> None:
        """The step's outcomes, at ``self.t`` (its end): accepted tokens of the decodes, prefill progress (a
        finished prompt yields its first token), first-token and finish times, and the step's telemetry."""
        produced = np.zeros(len(self.rid), dtype=np.int64)
        if n_dec:
            if self.spec:
                a = self.acc.accepted(n_dec)
                self._count_acceptance(a[None, :])
                produced[decode] = 1 + a
            else:
                produced[decode] = 1
        pre = chunk > 0
        self.kv += chunk
        self.left -= chunk
        done_prefill = pre & (self.left == 0)
        produced[done_prefill] = 1
        rids = self.rid
        cap = self.out[rids] - self.got[rids]
        produced = np.minimum(produced, cap)
        self.kv += np.where(decode, produced, 0)
        first = (self.got[rids] == 0) & (produced > 0)
        self.first[rids[first]] = self.t
        self.got[rids] += produced
        self._record(np.array([self.t]), np.array([self.used]), np.array([len(self.rid)]), len(self.waiting))
        if n_dec:
            self.itl_d.append(np.array([dt]))
            self.itl_w.append(np.array([n_dec]))
        self._finish(self.got[rids] >= self.out[rids], np.full(len(rids), self.t))

    def _preempt_last(self) -> None:
        rid = int(self.rid[-1])
        self.rid, self.kv, self.left, self.held = self.rid[:-1], self.kv[:-1], self.left[:-1], self.held[:-1]
        self.preempted[rid] += 1
        self.preemptions += 1
        self.waiting.appendleft(rid)

    def _stretch(self) -> bool:
        """Many decode steps at once, up to the next event. False: do a single step instead."""
        n, S = len(self.rid), self.horizon
        if self.spec:
            a = self.acc.accepted((n, S))
            prod = 1 + a
        else:
            a = None
            prod = np.ones((n, S), dtype=np.int64)
        rem = self.out[self.rid] - self.got[self.rid]
        cum = np.cumsum(prod, axis=1)
        done = cum >= rem[:, None]
        fin = np.where(done.any(1), done.argmax(1), S)            # step at which each request finishes
        before = np.concatenate([np.zeros((n, 1), dtype=np.int64), cum[:, :-1]], axis=1)
        kv = self.kv[:, None] + np.minimum(before, rem[:, None])  # KV tokens before each step
        active = np.arange(S)[None, :] <= fin[:, None]
        need = np.where(active, self._blocks(kv + 1 + self.k + self.lookahead), 0)
        need = np.maximum(need, np.where(active, self.held[:, None], 0))
        over = need.sum(0) > self.num_blocks
        e_mem = int(over.argmax()) if over.any() else S
        if e_mem == 0:
            return False
        n_active = active.sum(0)
        ctx = np.where(active, kv, 0).sum(0)
        dt = self.step.time(n_active, ctx, 0.0)
        t_end = self.t + np.cumsum(dt)
        e = min(int(fin.min()) + 1, e_mem, S)
        t_arr = self._next_arrival_time()
        if t_arr < float(t_end[e - 1]):
            e = min(e, int(np.searchsorted(t_end, t_arr)) + 1)
        # Apply steps 0..e-1.
        made = np.minimum(cum[:, e - 1], rem)
        rids = self.rid
        if self.spec:
            self._count_acceptance(np.where(active[:, :e], a[:, :e], -1).T)
        self.kv = self.kv + made
        self.got[rids] += made
        self.held = np.where(fin < e, self.held, need[:, e - 1])
        self.steps += e
        if self.trace is not None:
            zero = np.zeros(e)
            self.trace.append((n_active[:e].astype(float), ctx[:e].astype(float), zero, zero, zero, dt[:e]))
        if self.waiting:       # the head of the queue could not start (_admissible) and nothing changes until e
            self._count_wait(self._queue_reason(), float(dt[:e].sum()), steps=e)
        self._record(t_end[:e], need[:, :e].sum(0), n_active[:e], len(self.waiting))   # no admission until e
        self.itl_d.append(dt[:e])
        self.itl_w.append(n_active[:e])
        finished = fin < e
        self._finish(finished, t_end[np.minimum(fin, e - 1)])
        self.t = float(t_end[e - 1])
        return True

    def _count_acceptance(self, a: np.ndarray) -> None:
        """a [steps, rows]: accepted drafts per decode row (-1: row not in that step)."""
        live = a >= 0
        self.drafts += int(live.sum())
        for d in range(self.depth):
            self.accepted_per_pos[d] += int((a > d).sum())

    def _finish(self, mask: np.ndarray, when: np.ndarray) -> None:
        if not mask.any():
            return
        self.finish[self.rid[mask]] = when[mask]
        keep = ~mask
        self.rid, self.kv, self.left, self.held = self.rid[keep], self.kv[keep], self.left[keep], self.held[keep]

    def _record(self, t, used, running, waiting: int) -> None:
        """Samples at step ends: time (s), blocks used, running requests; ``waiting``: the queue's length, the
        same for every step of the horizon (nothing is admitted until it ends)."""
        self.samples_t.append(np.asarray(t, dtype=float))
        self.samples_used.append(np.asarray(used, dtype=float))
        self.samples_running.append(np.asarray(running, dtype=float))
        self.samples_waiting.append(np.full(len(self.samples_t[-1]), float(waiting)))

    # -- result --------------------------------------------------------------------
    def _result(self) -> PointResult:
        reqs = []
        for i in range(len(self.p.requests)):
            reqs.append(RequestRecord(
                id=i, arrival_s=float(self.arrival[i]), prompt_len=int(self.prompt[i]), output_len=int(self.out[i]),
                first_token_s=None if np.isnan(self.first[i]) else float(self.first[i]),
                finish_s=None if np.isnan(self.finish[i]) else float(self.finish[i]),
                output_tokens=int(self.got[i]), preemptions=int(self.preempted[i]), error=self.error.get(i)))
        t = np.concatenate(self.samples_t) if self.samples_t else np.zeros(0)
        used = np.concatenate(self.samples_used) if self.samples_used else np.zeros(0)
        running = np.concatenate(self.samples_running) if self.samples_running else np.zeros(0)
        waiting = np.concatenate(self.samples_waiting) if self.samples_waiting else np.zeros(0)
        usage = used / self.num_blocks
        keep = _downsample(len(t), int(self.cfg["kv_usage_samples"]), usage)
        d = np.concatenate(self.itl_d) if self.itl_d else np.zeros(0)
        w = np.concatenate(self.itl_w) if self.itl_w else np.zeros(0)
        plan = self.pool.plan
        draft_tokens = self.drafts * self.k
        accepted = int(self.accepted_per_pos.sum())
        mean_len = sum(r.prompt_len + r.output_len for r in self.p.requests) / max(len(self.p.requests), 1)
        telemetry = {
            "engine": "sim",
            "num_blocks": self.num_blocks,
            "block_size": plan.block_size,
            "blocks_per_request_max_len": plan.blocks_per_request(self.p.max_model_len),
            "max_concurrency_max_len": plan.max_concurrency(self.num_blocks, self.p.max_model_len),
            "max_concurrency_mean_request": self.num_blocks / plan.blocks_per_request(int(round(mean_len))),
            "kv_usage": [[float(t[i]), float(usage[i])] for i in keep],
            # the same samples with the batch and the queue (the report's timelines)
            "timeline": {"t_s": [float(t[i]) for i in keep], "kv_usage": [float(usage[i]) for i in keep],
                         "running": [int(running[i]) for i in keep], "waiting": [int(waiting[i]) for i in keep]},
            "peak_kv_usage": float(usage.max()) if len(usage) else 0.0,
            "max_running": int(running.max()) if len(running) else 0,
            "mean_running": float(running.mean()) if len(running) else 0.0,
            "steps": self.steps,
            "preemptions": self.preemptions,
            "waiting_for_memory_s": self.wait_s["memory"],
            "requests_waited_for_memory": len(self.waited_mem),
            "waiting_s": dict(self.wait_s),
            # the simulator's own admission decisions: steps at which a waiting request was refused for blocks
            "memory_evidence": {"source": "admission", "refusals": self.memory_refusals},
            "spec_decode": {"num_drafts": self.drafts, "num_draft_tokens": draft_tokens,
                            "num_accepted_tokens": accepted,
                            "num_accepted_tokens_per_pos": self.accepted_per_pos.tolist(),
                            "acceptance_length": (1 + accepted / self.drafts) if self.drafts else None},
            "spec_state_bytes": self.pool.spec_state_bytes,
            "itl_s": _weighted_quantiles(d, w),
            "pool": {"available_bytes": self.pool.available_bytes, "weight_bytes": self.pool.weight_bytes,
                     "reserve_bytes": self.pool.reserve_bytes, "gdn_page_bytes": plan.gdn_page_bytes,
                     "page_bytes": plan.page_bytes},
            "duration_s": self.t,
            # a calibration fitted to another version of this strategy's op (harness.engines.sim.stale)
            "calibration_stale": stale(self.cfg, self.p.strategy, self.spec),
        }
        return PointResult(engine="sim", requests=reqs, telemetry=telemetry)


def _downsample(n: int, k: int, usage: np.ndarray) -> list[int]:
    """About k evenly spaced sample indices, always keeping the peak."""
    if n <= k:
        return list(range(n))
    idx = set(np.linspace(0, n - 1, k).astype(int).tolist())
    idx.add(int(usage.argmax()))
    return sorted(idx)


def _weighted_quantiles(d: np.ndarray, w: np.ndarray) -> dict[str, float | None]:
    """Step durations weighted by the requests in them: the inter-token (chunk) latency distribution."""
    if len(d) == 0 or w.sum() == 0:
        return {"mean": None, **{f"p{p}": None for p in PERCENTILES}}
    order = np.argsort(d)
    cw = np.cumsum(w[order]) / w.sum()
    q = {f"p{p}": float(d[order][min(np.searchsorted(cw, p / 100), len(d) - 1)]) for p in PERCENTILES}
    return {"mean": float((d * w).sum() / w.sum()), **q}
