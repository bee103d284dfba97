"""``python -m harness bench strategies``: the torch strategies' verify+commit cost on the CPU.

Per draft shape, every strategy runs the same steps (same inputs, same seeded
acceptance) on one GDN layer of the model's head shape. Strategies are
interleaved repeat by repeat so that drift on the machine hits all of them
alike; the median time per step is reported relative to ``store_all``. This is
the baseline later GPU kernels are compared with, not a GPU prediction.
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig

import strategies
from strategies import DraftTree, GDNShape, MiB, as_dtype

from .. import strategy_configs
from ..config import load_model, parse_draft
from ..provenance import provenance


def step_inputs(gen: torch.Generator, B: int, tree: DraftTree, shape: GDNShape, dtype: torch.dtype):
    """Random q, k (L2-normalised), v, g (log decay in [-2, 0)), beta for one step."""
    N, H, HV = tree.num_nodes, shape.num_key_heads, shape.num_value_heads
    K, V = shape.key_head_dim, shape.value_head_dim
    q = torch.nn.functional.normalize(torch.randn(B, N, H, K, generator=gen, dtype=torch.float64), dim=-1)
    k = torch.nn.functional.normalize(torch.randn(B, N, H, K, generator=gen, dtype=torch.float64), dim=-1)
    v = torch.randn(B, N, HV, V, generator=gen, dtype=torch.float64)
    g = -2 * torch.rand(B, N, HV, generator=gen, dtype=torch.float64)
    beta = torch.rand(B, N, HV, generator=gen, dtype=torch.float64)
    return tuple(t.to(dtype) for t in (q, k, v, g, beta))


def sample_accepted(gen: torch.Generator, tree: DraftTree, B: int, rate: float) -> torch.Tensor:
    """Last accepted node per request: walk down, taking a random child with probability ``rate``."""
    out = []
    for _ in range(B):
        node = 0 if tree.has_root else -1
        while True:
            kids = tree.children(node)
            if not kids or float(torch.rand((), generator=gen)) >= rate:
                break
            node = kids[int(torch.randint(len(kids), (), generator=gen))]
        out.append(node)
    return torch.tensor(out, dtype=torch.long)


def _timed_run(strat, state, steps, tree) -> tuple[float, int]:
    """Seconds for the whole run of steps, and the flushes it did."""
    t0 = time.perf_counter()
    carry = strat.start(state)
    for inputs, accepted, conf in steps:
        carry = strat.commit(carry, strat.verify(carry, *inputs, tree, confidence=conf), accepted)
    strat.materialize(carry)
    elapsed = time.perf_counter() - t0
    flushes = int(carry.flushes.sum()) if hasattr(carry, "flushes") else 0
    return elapsed, flushes


def bench_draft(cfg: DictConfig, spec: Any, shape: GDNShape, state_dtype: str) -> list[dict[str, Any]]:
    tree = parse_draft(spec, root=bool(cfg.root))
    dtype = as_dtype(cfg.dtype)
    gen = torch.Generator().manual_seed(int(cfg.seed))
    B = int(cfg.batch)
    state = torch.randn(B, shape.num_value_heads, shape.key_head_dim, shape.value_head_dim,
                        generator=gen, dtype=torch.float64).to(dtype) * 0.1
    steps = [(step_inputs(gen, B, tree, shape, dtype), sample_accepted(gen, tree, B, float(cfg.accept_rate)), None)
             for _ in range(int(cfg.steps))]
    selective = strategy_configs.configured(cfg, "store_selective") if "store_selective" in strategies.names() \
        else None
    # draft confidences as the configured profile measured them (the trained MTP's), drawn apart from the accepted
    # nodes above (every strategy runs the same steps): store_selective's recoveries here are not the profile's
    if selective is not None:
        profile = selective._profile()
        steps = [(i, a, profile.sample(tree, B, gen)) for i, a, _ in steps]
    runs: dict[str, Any] = {}
    for name in strategies.names():
        strat = strategy_configs.configured(cfg, name).fitting(tree)   # a buffer one step would overflow: grown
        opts = {k: getattr(strat, k) for k in strat.options}
        if strat.supports_trees or tree.is_chain:
            runs[name] = (strat, opts)
    times: dict[str, list[float]] = {n: [] for n in runs}
    flushes: dict[str, int] = {}
    with torch.inference_mode():
        for _ in range(int(cfg.warmup)):
            for strat, _ in runs.values():
                _timed_run(strat, state, steps, tree)
        for _ in range(int(cfg.repeats)):
            for name, (strat, _) in runs.items():
                t, flushes[name] = _timed_run(strat, state, steps, tree)
                times[name].append(t / len(steps))
    base = statistics.median(times["store_all"])
    rows = []
    for name, (strat, opts) in runs.items():
        med = statistics.median(times[name])
        mem = strat.memory(shape, tree, state_dtype=state_dtype)
        rows.append({
            "draft": f"{tree.label} (N={tree.num_nodes})", "nodes": tree.num_nodes, "strategy": name, **opts,
            "step_seconds_median": med, "step_seconds_all": times[name], "vs_store_all": med / base,
            "flushes_per_step": flushes[name] / (B * len(steps)),
            "speculative_bytes": mem.speculative_bytes, "total_bytes": mem.total_bytes,
        })
    return rows


def run(cfg: DictConfig) -> int:
    from ..console import console as make_console, table as make_table

    if int(cfg.threads) > 0:
        torch.set_num_threads(int(cfg.threads))
    model = load_model(cfg.model)
    shape = model.gdn_shape()
    console = make_console()
    console.print(f"[bold]bench strategies[/]: torch reference on the CPU ({torch.get_num_threads()} threads), "
                  f"{cfg.dtype}, batch {cfg.batch}, one GDN layer of {model.display_name} "
                  f"(H={shape.num_key_heads} HV={shape.num_value_heads} K={shape.key_head_dim} "
                  f"V={shape.value_head_dim}), {cfg.steps} steps x {cfg.repeats} repeats, median")
    rows: list[dict[str, Any]] = []
    started = time.perf_counter()
    for i, spec in enumerate(cfg.drafts, 1):
        t0 = time.perf_counter()
        part = bench_draft(cfg, spec, shape, model.state_dtype)
        rows += part
        console.print(f"  [{i}/{len(cfg.drafts)}] {part[0]['draft']}: {time.perf_counter() - t0:.1f} s "
                      f"(elapsed {time.perf_counter() - started:.0f} s)")
    table = make_table(f"verify+commit per step vs store_all; speculative state per request "
                       f"(all {shape.num_layers} GDN layers, {model.state_dtype})",
                       ["draft", "strategy", "ms/step", "x store_all", "flushes/step", "spec. state MiB"], left=2)
    last = None
    for r in rows:
        label = r["draft"] if r["draft"] != last else ""
        last = r["draft"]
        name = r["strategy"] + (f" (L={r['buffer_len']})" if "buffer_len" in r else "")
        table.add_row(label, name, f"{1e3 * r['step_seconds_median']:.2f}", f"{r['vs_store_all']:.2f}",
                      f"{r['flushes_per_step']:.2f}", f"{r['speculative_bytes'] / MiB:.1f}")
    console.print(table)
    console.print("ms/step is this machine's wall time (context only); the ratio is the result.")
    if cfg.out:
        out = Path(str(cfg.out))
        out.parent.mkdir(parents=True, exist_ok=True)
        from omegaconf import OmegaConf
        payload = {"engine": "torch-cpu-reference", "config": OmegaConf.to_container(cfg, resolve=True),
                   "provenance": provenance(), "rows": rows}
        out.write_text(json.dumps(payload, indent=2))
        console.print(f"wrote {out}")
    return 0
