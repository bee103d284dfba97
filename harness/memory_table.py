"""``python -m harness memory``: speculative GDN state per request, per strategy and draft shape."""

from __future__ import annotations

import json
from typing import Any

from omegaconf import DictConfig

import strategies
from strategies import MiB

from . import strategy_configs
from .config import load_model, parse_draft


def memory_rows(cfg: DictConfig) -> list[dict[str, Any]]:
    """One row per (draft, strategy, state dtype): bytes per request over every GDN layer."""
    model = load_model(cfg.model)
    shape = model.gdn_shape()
    rows = []
    for spec in cfg.drafts:
        tree = parse_draft(spec, root=bool(cfg.root))
        for name in strategies.names():
            strat = strategy_configs.configured(cfg, name)
            if not strat.supports_trees and not tree.is_chain:
                continue
            for dtype in cfg.state_dtypes:
                mem = strat.memory(shape, tree, state_dtype=dtype, conv_dtype=cfg.conv_dtype)
                rows.append({"model": model.name, "draft_label": tree.label, "state_dtype": str(dtype),
                             **mem.as_dict()})
    return rows


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
    table = make_table("GDN state per request, all GDN layers (MiB)",
                       ["draft", "strategy", "dtype", "pages", "recurrent", "stash", "conv", "spec.", "total"],
                       left=3)
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
                      f"{r['total_bytes'] / MiB:.1f}")
    console.print(table)
    rings = ", ".join(f"{n}={o['buffer_len']}" for n, o in strategy_configs.of_all(cfg).items() if o.get("buffer_len"))
    console.print(f"+root: the engine's last sampled token is node 0 (N = 1 + drafts). recurrent: pages × one "
                  f"state; stash: pseudo-values, keys, decays of the N nodes (treewy) and/or a ring buffer "
                  f"(tokens: {rings}), in the state dtype; conv: {cfg.conv_dtype}, "
                  "widened by one path's drafts; spec.: all but one committed state (conv excluded).")
    return 0
