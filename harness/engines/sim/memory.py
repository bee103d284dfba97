"""The KV pool as vLLM plans it: requested memory minus weights and the non-KV reserve, in pages.

``requested = gmu × GPU memory``; ``weights`` from the model spec (bf16, MTP layer included under
speculation); the non-KV reserve (activation peak, CUDA context, the drafter's buffers) is a
calibrated constant from ``conf/engine/sim.yaml``. What is left is cut into blocks by vLLM's own
page arithmetic (:mod:`harness.engines.kv_plan`), where a GDN page holds the strategy's stash as
the vLLM plugin lays it out (:class:`strategies.paged.StashLayout`, sized by the
``strategies`` memory accounting).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import strategies
from strategies import DraftTree

from ...model import ModelSpec
from ..base import GPUSpec
from ..kv_plan import KVPlan, plan


@dataclass(frozen=True)
class Pool:
    plan: KVPlan
    num_blocks: int
    available_bytes: int
    weight_bytes: int
    reserve_bytes: int
    spec_state_bytes: int      # GDN state one request holds beyond one committed state (bytes, all layers)

    def blocks_for(self, tokens: int) -> int:
        """Blocks a request with ``tokens`` of KV holds (attention blocks + GDN pages)."""
        return self.plan.blocks_per_request(tokens)


def stash_bytes(model: ModelSpec, strategy: str, tree: DraftTree | None, options: Mapping[str, Any] | None = None,
                tp: int = 1) -> int:
    """Bytes of the plugin's stash in one GDN page: the strategy's stash slots (its own memory accounting, with
    its run ``options``, e.g. ``buffer_len``) of float32 (pseudo-value, key, decay) plus a 16-byte header; 0 for
    store_all or no speculation."""
    if tree is None:
        return 0
    slots = strategies.configured(strategy, options).footprint(tree)[1]
    if slots == 0:        # snapshots only (store_all): vLLM's own pages, no stash
        return 0
    g = model.gdn_shape()
    per_token = (g.num_value_heads * g.value_head_dim + g.num_key_heads * g.key_head_dim + g.num_value_heads) // tp
    return slots * per_token * 4 + 16


def reserve_bytes(cfg: Mapping[str, Any], requested: int, speculative: bool) -> int:
    """Non-KV, non-weight memory vLLM keeps (fitted, see conf/engine/sim.yaml)."""
    r = cfg["non_kv_memory"]
    return int(r["base_bytes"] + r["fraction_of_requested"] * requested + (r["spec_bytes"] if speculative else 0))


def build_pool(model: ModelSpec, gpu: GPUSpec, strategy: str, tree: DraftTree | None, gmu: float,
               cfg: Mapping[str, Any], options: Mapping[str, Any] | None = None, tp: int = 1,
               kv_cache_bytes: int | None = None) -> Pool:
    """``tree``: the verified draft (root included), None without speculation; ``options``: the strategy's run
    options (conf/strategies/; None: its defaults). ``kv_cache_bytes``: the pool's size outright, as vLLM's
    ``kv_cache_memory_bytes`` sets it (gmu then unused)."""
    k = 0 if tree is None else tree.draft_depth           # the conv window widens by one path's drafts
    # GDN pages beyond the committed state's: store_all's snapshots, one per draft token
    pages = 0 if tree is None else strategies.configured(strategy, options).footprint(tree)[0] - 1
    stash = stash_bytes(model, strategy, tree, options, tp)
    at = model.attention
    p = plan(model.gdn_shape(), attention_layers=at["num_layers"] + (model.mtp["num_layers"] if k else 0),
             kv_heads=at["num_kv_heads"], head_dim=at["head_dim"], num_spec=k, stash_bytes=stash,
             speculative_pages=pages, state_dtype=model.state_dtype, block_alignment=gpu.block_alignment, tp=tp)
    requested = int(gmu * gpu.memory_bytes)
    weights = model.weight_bytes(mtp=bool(k)) // tp
    reserve = reserve_bytes(cfg, requested, bool(k))
    available = requested - weights - reserve if kv_cache_bytes is None else int(kv_cache_bytes)
    if available <= 0:
        raise ValueError(f"gmu={gmu}: {gmu:.2f} x {gpu.memory_bytes / 2**30:.0f} GiB ({gpu.name}) leaves no KV "
                         f"memory after {weights / 2**30:.1f} GiB of {model.display_name} weights and "
                         f"{reserve / 2**30:.1f} GiB reserve; raise gmu or use a bigger GPU")
    layers = model.gdn["num_layers"]
    state = model.gdn_shape().state_bytes(model.state_dtype) // tp
    return Pool(plan=p, num_blocks=p.num_blocks(available), available_bytes=available, weight_bytes=weights,
                reserve_bytes=reserve, spec_state_bytes=layers * (pages * state + stash))
