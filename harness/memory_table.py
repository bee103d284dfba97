"""``python -m harness memory``: speculative GDN state per request, per strategy and draft shape."""

from __future__ import annotations

import json
from typing import Any

from omegaconf import DictConfig

import strategies
from strategies import MiB

from . import strategy_configs
from .config import load_model, parse_draft


def _variants(cfg: DictConfig) -> list[tuple[str, str, strategies.Strategy]]:
    """(strategy, label, instance) per row: every strategy with its configured options, and store_delta once per
    codec of ``delta_codecs`` (its configured codec first)."""
    out = []
    for name in strategies.names():
        strat = strategy_configs.configured(cfg, name)
        out.append((name, name, strat))
        if name == "store_delta":
            for codec in cfg.delta_codecs:
                if codec != strat.codec:
                    out.append((name, f"store_delta:{codec}", strategies.configured(name, strategy_configs.of(cfg, name), codec=codec)))
    return out


def memory_rows(cfg: DictConfig) -> list[dict[str, Any]]:
    """One row per (draft, strategy, state dtype): bytes per request over every GDN layer, reserved (what the
    engine's planner must hold) and held (a selective strategy's expected checkpoints, a compressed one's bytes)."""
    model = load_model(cfg.model)
    shape = model.gdn_shape()
    rows = []
    for spec in cfg.drafts:
        tree = parse_draft(spec, root=bool(cfg.root))
        for name, label, strat in _variants(cfg):
            if not strat.supports_trees and not tree.is_chain:
                continue
            for dtype in cfg.state_dtypes:
                mem = strat.memory(shape, tree, state_dtype=dtype, conv_dtype=cfg.conv_dtype)
                held = strat.held_memory(shape, tree, state_dtype=dtype, conv_dtype=cfg.conv_dtype)
                rows.append({"model": model.name, "draft_label": tree.label, "state_dtype": str(dtype),
                             **mem.as_dict(), "strategy": label, "held_state_pages": held.state_pages,
                             "held_speculative_bytes": held.speculative_bytes,
                             "held_checkpoints": held.speculative_bytes / held.num_layers / held.one_state_bytes})
    return rows


def writeup_rows(cfg: DictConfig, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The fork/checkpoint write-up's table beside the measured rows (bf16 states, ``writeup`` in the config):
    per draft it lists, its checkpoint count and MB, the same count at its own arithmetic (16 heads), and each
    strategy's speculative state held on this model."""
    w = cfg.writeup
    model = load_model(cfg.model)
    if model.name != w.model:
        return []
    g = model.gdn_shape()
    ours = g.state_bytes("bfloat16") * g.num_layers                      # one checkpoint, every GDN layer
    theirs = g.num_layers * w.key_heads * g.key_head_dim * g.value_head_dim * 2
    out = []
    for draft, claim in w.drafts.items():
        for r in rows:
            if r["draft_label"].removesuffix("+root") != draft or r["state_dtype"] != "bfloat16":
                continue
            store = next(x for x in rows if x["draft_label"] == r["draft_label"] and x["strategy"] == "store_all"
                         and x["state_dtype"] == "bfloat16")
            count = store["state_pages"] - 1
            out.append({"draft": draft, "strategy": r["strategy"], "writeup_checkpoints": str(claim.checkpoints),
                        "writeup_mb": float(claim.mb), "checkpoints": count,
                        "writeup_arithmetic_mib": count * theirs / MiB, "store_all_mib": count * ours / MiB,
                        "held_checkpoints": r["held_checkpoints"],
                        "held_mib": r["held_speculative_bytes"] / MiB})
    return out


def run(cfg: DictConfig) -> int:
    rows = memory_rows(cfg)
    if cfg.format == "json":
        print(json.dumps(rows, indent=2))
        return 0
    if cfg.format != "table":
        raise ValueError(f"format={cfg.format}: must be table or json")
    from .console import console as make_console, table as make_table

    model = load_model(cfg.model)
    shape = model.gdn_shape()
    console = make_console()
    console.print(f"[bold]{model.display_name}[/]: {shape.num_layers} GDN layers, HV={shape.num_value_heads} "
                  f"H={shape.num_key_heads} K={shape.key_head_dim} V={shape.value_head_dim}; "
                  f"vLLM holds the state in {model.state_dtype}")
    table = make_table("GDN state per request, all GDN layers (MiB): reserved by the planner; held spec. = what the "
                       "strategy holds beyond one state where that is less",
                       ["draft", "strategy", "dtype", "pages", "recurrent", "stash", "conv", "spec.", "total",
                        "held spec."], left=3)
    last_draft = None
    for r in rows:
        draft = r["draft_label"] if r["draft_label"] != last_draft else ""
        last_draft = r["draft_label"]
        L = r["num_layers"]
        dtype = {"bfloat16": "bf16", "float32": "fp32", "float16": "fp16", "float64": "fp64"}.get(
            r["state_dtype"], r["state_dtype"])
        table.add_row(draft, r["strategy"], dtype, str(r["state_pages"]),
                      f"{r['recurrent_total_bytes'] / MiB:.1f}", f"{L * r['stash_bytes_per_layer'] / MiB:.2f}",
                      f"{L * r['conv_bytes_per_layer'] / MiB:.2f}", f"{r['speculative_bytes'] / MiB:.1f}",
                      f"{r['total_bytes'] / MiB:.1f}",
                      "" if r["held_speculative_bytes"] == r["speculative_bytes"]
                      else f"{r['held_speculative_bytes'] / MiB:.1f}")
    console.print(table)
    w = writeup_rows(cfg, rows)
    if w:
        wt = make_table(f"The fork/checkpoint write-up's table beside {model.display_name}'s (bf16 states): "
                        "speculative checkpoints per request", ["draft", "strategy", "write-up", "write-up MB",
                                                                 "checkpoints", f"x {cfg.writeup.key_heads} heads MiB",
                                                                 f"x {shape.num_value_heads} heads MiB",
                                                                 "held (states)", "held MiB"], left=2)
        last = None
        for r in w:
            new = r["draft"] != last
            last = r["draft"]
            wt.add_row(r["draft"] if new else "", r["strategy"], r["writeup_checkpoints"] if new else "",
                       f"{r['writeup_mb']:.0f}" if new else "", str(r["checkpoints"]) if new else "",
                       f"{r['writeup_arithmetic_mib']:.0f}" if new else "", f"{r['store_all_mib']:.0f}" if new else "",
                       f"{r['held_checkpoints']:.2f}", f"{r['held_mib']:.1f}")
        console.print(wt)
        console.print(cfg.writeup.note)
    rings = ", ".join(f"{n}={o['buffer_len']}" for n, o in strategy_configs.of_all(cfg).items() if o.get("buffer_len"))
    console.print(f"+root: the engine's last sampled token is node 0 (N = 1 + drafts). recurrent: pages × one "
                  f"state; stash: pseudo-values, keys, decays of the N nodes (treewy) and/or a ring buffer "
                  f"(tokens: {rings}), in the state dtype; conv: {cfg.conv_dtype}, "
                  "widened by one path's drafts; spec.: all but one committed state (conv excluded).")
    return 0
