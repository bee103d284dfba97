"""Step-time model: a roofline over the bytes and FLOPs of one engine step, plus a fixed overhead.

Per step: the weights read once (MoE: the expected number of distinct experts the step's tokens
touch), every decode request's KV cache, the GDN state traffic of the commit strategy, the MTP
drafter's passes; FLOPs of the matmuls, attention and the delta rule. Time = overhead +
max(bytes / bandwidth, FLOPs / rate). All constants come from ``conf/engine/sim.yaml``.

GDN state bytes per decode request and GDN layer (S: one state):
``store_all`` reads 1 and writes one snapshot per verified node (1 + N); ``treewy`` reads the
committed state and writes the rebuilt one (2) plus its stash; ``replay`` / ``treewy_deferred``
read the checkpoint and write it only when the buffer flushes (1 + tokens per step / buffer).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

import strategies
from strategies import DraftTree

from ...model import ModelSpec
from ..base import GPUSpec


@dataclass
class StepModel:
    overhead_s: float               # per step, drafter passes included
    bandwidth: float                # B/s
    flops: float                    # FLOP/s
    dense_bytes: float              # weights read every step regardless of batch
    expert_bytes: float             # one routed expert, all MoE layers
    num_experts: int
    experts_per_token: int
    kv_bytes_per_token: float       # all attention layers, K and V
    gdn_bytes_per_request: float    # decode step, all GDN layers, strategy's traffic
    gdn_bytes_per_prefill: float    # a prefill chunk reads and writes the state once
    flops_per_token: float          # matmuls + delta rule
    attn_flops_per_ctx_token: float # per query token per KV token, all attention layers
    drafter_bytes: float            # per draft pass: MTP layer's dense weights + LM head
    drafter_expert_bytes: float     # per routed expert of the MTP layer
    drafter_flops_per_token: float
    draft_passes: int               # k (sequential MTP passes per step)
    nodes: int                      # tokens verified per decode request (1 without speculation)

    def time(self, n_decode, ctx_decode, prefill_tokens, prefill_reqs=0, prefill_attn=0.0):
        """Seconds for steps with ``n_decode`` decode requests holding ``ctx_decode`` KV tokens in total,
        ``prefill_tokens`` prompt tokens in ``prefill_reqs`` chunks (``prefill_attn``: Σ chunk x
        context, for their attention). Works elementwise on numpy arrays."""
        n = np.asarray(n_decode, dtype=float)
        tokens = n * self.nodes + prefill_tokens
        touched = self._experts(tokens)
        bytes_ = (self.dense_bytes + touched * self.expert_bytes + self.kv_bytes_per_token * ctx_decode
                  + self.gdn_bytes_per_request * n + self.gdn_bytes_per_prefill * prefill_reqs)
        attn = ctx_decode * self.nodes + prefill_attn
        flops = self.flops_per_token * tokens + self.attn_flops_per_ctx_token * attn
        if self.draft_passes:
            bytes_ = bytes_ + self.draft_passes * (self.drafter_bytes + self._experts(n) * self.drafter_expert_bytes)
            flops = flops + self.draft_passes * self.drafter_flops_per_token * n
        return self.overhead_s + np.maximum(bytes_ / self.bandwidth, flops / self.flops)

    def _experts(self, tokens):
        if self.num_experts == 0:
            return 0.0
        e, k = self.num_experts, self.experts_per_token
        return e * (1.0 - (1.0 - k / e) ** np.asarray(tokens, dtype=float))


def gdn_traffic(strategy: str, tree: DraftTree | None, state: float, token_stash: float, mean_tokens: float,
                options: Mapping[str, Any] | None = None) -> float:
    """Bytes of GDN state one decode request moves per layer per step (see the module docstring): the
    strategy's own count (``Strategy.step_traffic``, with its run ``options``); without speculation one state
    read and one written."""
    if tree is None:
        return 2 * state
    return strategies.configured(strategy, options).step_traffic(tree, state, token_stash, mean_tokens)


def build_step_model(model: ModelSpec, gpu: GPUSpec, strategy: str, tree: DraftTree | None,
                     mean_tokens: float, cfg: Mapping[str, Any], options: Mapping[str, Any] | None = None,
                     tp: int = 1) -> StepModel:
    mode = cfg["mode"]
    try:
        over = cfg["overhead"][mode]
    except KeyError:
        raise ValueError(f"engine.mode={mode!r}: no overhead constants for it in conf/engine/sim.yaml") from None
    passes = 0 if tree is None else tree.draft_depth
    eff = cfg["efficiency"]
    h, m = model.hidden_size, model.mlp
    wb = 2.0  # bf16 weights
    total = model.num_params(mtp=False)
    if m["kind"] == "moe":
        layers = model.num_layers
        expert = 3 * h * m["expert_intermediate_size"]
        routed = layers * m["num_experts"] * expert
        dense = total - routed - model.vocab_size * h  # the embedding table is gathered, not read
        num_e, k_e = m["num_experts"], m["experts_per_token"]
        expert_bytes = layers * expert * wb
        mtp_expert_bytes = model.mtp["num_layers"] * expert * wb
        mtp_dense = model.num_params(mtp=True) - total - model.mtp["num_layers"] * m["num_experts"] * expert
    else:
        dense = total - model.vocab_size * h
        num_e = k_e = 0
        expert_bytes = mtp_expert_bytes = 0.0
        mtp_dense = model.num_params(mtp=True) - total
    g = model.gdn_shape()
    state = g.state_bytes(model.state_dtype)
    token_stash = g.token_stash_bytes("float32")
    at = model.attention
    gdn_flops = 4 * g.num_value_heads * g.key_head_dim * g.value_head_dim * g.num_layers
    return StepModel(
        overhead_s=float(over["base"]) + float(over["per_draft_pass"]) * passes,
        bandwidth=gpu.bandwidth * float(eff["bandwidth"]) * tp,
        flops=gpu.bf16_flops * float(eff["flops"]) * tp,
        dense_bytes=dense * wb,
        expert_bytes=expert_bytes,
        num_experts=num_e,
        experts_per_token=k_e,
        kv_bytes_per_token=float(model.kv_bytes_per_token()),
        gdn_bytes_per_request=g.num_layers * gdn_traffic(strategy, tree, state, token_stash, mean_tokens, options),
        gdn_bytes_per_prefill=2.0 * g.num_layers * state,
        flops_per_token=2.0 * model.num_params(active=True) + gdn_flops,
        attn_flops_per_ctx_token=4.0 * at["num_heads"] * at["head_dim"] * at["num_layers"],
        drafter_bytes=(mtp_dense + model.vocab_size * h) * wb,
        drafter_expert_bytes=mtp_expert_bytes,
        drafter_flops_per_token=2.0 * (model.num_params(active=True, mtp=True) - model.num_params(active=True)
                                       + model.vocab_size * h),
        draft_passes=passes,
        nodes=1 if tree is None else tree.num_nodes,
    )
