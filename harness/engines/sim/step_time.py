"""Step-time model: a roofline over the bytes and FLOPs of one engine step, plus a fixed overhead.

Per step: the weights read once (MoE: the expected number of distinct experts the step's tokens
touch), every decode request's KV cache, the GDN state traffic of the commit strategy, the MTP
drafter's passes; FLOPs of the matmuls, attention and the delta rule. Time = overhead +
max(bytes / bandwidth, FLOPs / rate). All constants come from ``conf/engine/sim.yaml``.

GDN state bytes per decode request and GDN layer (S: one state):
``store_all`` reads 1 and writes one snapshot per verified node (1 + N); ``treewy`` reads the
committed state and writes the rebuilt one (2) plus its stash; ``replay`` / ``treewy_deferred``
read the checkpoint and write it only when the buffer flushes (1 + tokens per step / buffer).

A fitted calibration (``conf/calibration/<name>.yaml``, ``python -m harness calibrate``) refines this: a step that
carries prompt tokens has its own fixed cost (``overhead.<mode>.mixed``: under vLLM's default graph mode decode-only
steps replay a FULL graph and mixed ones run PIECEWISE), each byte term has a fitted scale (``scales``), and a
strategy's GDN op is timed by its measured per-layer profile (``gdn_profile``: seconds at each batch, from ``bench
kernels``' layer section, times a fitted ``gdn_scale``) instead of by the bytes it moves (where it has no profile
for the draft shape: its bytes, times a fitted ``gdn_bytes_scale``). Without them (the
estimates) the model is the plain roofline above.
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
    mixed_overhead_s: float | None = None   # per step carrying prompt tokens (None: overhead_s)
    gdn_batch: tuple[float, ...] = ()       # profiled batches (decode requests) of the GDN op, ascending
    gdn_seconds: tuple[float, ...] = ()     # all GDN layers' op time at each profiled batch (s); () : by bytes

    def time(self, n_decode, ctx_decode, prefill_tokens, prefill_reqs=0, prefill_attn=0.0):
        """Seconds for steps with ``n_decode`` decode requests holding ``ctx_decode`` KV tokens in total,
        ``prefill_tokens`` prompt tokens in ``prefill_reqs`` chunks (``prefill_attn``: Σ chunk x
        context, for their attention). Works elementwise on numpy arrays."""
        n = np.asarray(n_decode, dtype=float)
        prefill_tokens = np.asarray(prefill_tokens, dtype=float)
        tokens = n * self.nodes + prefill_tokens
        touched = self._experts(tokens)
        bytes_ = (self.dense_bytes + touched * self.expert_bytes + self.kv_bytes_per_token * ctx_decode
                  + self.gdn_bytes_per_request * n + self.gdn_bytes_per_prefill * prefill_reqs)
        attn = ctx_decode * self.nodes + prefill_attn
        flops = self.flops_per_token * tokens + self.attn_flops_per_ctx_token * attn
        if self.draft_passes:
            bytes_ = bytes_ + self.draft_passes * (self.drafter_bytes + self._experts(n) * self.drafter_expert_bytes)
            flops = flops + self.draft_passes * self.drafter_flops_per_token * n
        fixed = self.overhead_s if self.mixed_overhead_s is None else \
            np.where(prefill_tokens > 0, self.mixed_overhead_s, self.overhead_s)
        return fixed + np.maximum(bytes_ / self.bandwidth, flops / self.flops) + self.gdn_op_time(n)

    def gdn_op_time(self, n):
        """Seconds of the profiled GDN op for ``n`` decode requests: the profile's time per request interpolated
        between its batches (held at the ends), times n; 0 without a profile (its bytes are in the roofline)."""
        if not self.gdn_batch:
            return 0.0
        b = np.asarray(self.gdn_batch)
        per_request = np.interp(n, b, np.asarray(self.gdn_seconds) / b)
        return np.where(n > 0, per_request * n, 0.0)

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
        raise ValueError(f"engine.mode={mode!r}: the calibration ({str(cfg.get('calibration', '?'))[:40]}...) has "
                         f"no step costs for it, only {', '.join(cfg['overhead'])} (conf/calibration/)") from None
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
    sc = {"weights": 1.0, "kv": 1.0, "flops": 1.0, "drafter": 1.0, **(cfg.get("scales") or {})}
    draft_pass = float(over["per_draft_pass"]) * passes
    batch, seconds = gdn_profile(cfg, mode, strategy, tree, g.num_layers, tp)
    # the bytes' own fitted scale where no profile applies (gdn_scale scales a profile: the two are not one number)
    bytes_scale = float((cfg.get("gdn_bytes_scale") or {}).get(strategy, 1.0)) if tree is not None else 1.0
    return StepModel(
        overhead_s=float(over["base"]) + draft_pass,
        mixed_overhead_s=float(over["mixed"]) + draft_pass if "mixed" in over else None,
        bandwidth=gpu.bandwidth * float(eff["bandwidth"]) * tp,
        flops=gpu.bf16_flops * float(eff["flops"]) * tp / float(sc["flops"]),
        dense_bytes=dense * wb * float(sc["weights"]),
        expert_bytes=expert_bytes * float(sc["weights"]),
        num_experts=num_e,
        experts_per_token=k_e,
        kv_bytes_per_token=float(model.kv_bytes_per_token()) * float(sc["kv"]),
        gdn_bytes_per_request=0.0 if batch else
        g.num_layers * gdn_traffic(strategy, tree, state, token_stash, mean_tokens, options) * bytes_scale,
        gdn_bytes_per_prefill=2.0 * g.num_layers * state,
        flops_per_token=2.0 * model.num_params(active=True) + gdn_flops,
        attn_flops_per_ctx_token=4.0 * at["num_heads"] * at["head_dim"] * at["num_layers"],
        drafter_bytes=(mtp_dense + model.vocab_size * h) * wb * float(sc["drafter"]),
        drafter_expert_bytes=mtp_expert_bytes * float(sc["drafter"]),
        drafter_flops_per_token=2.0 * (model.num_params(active=True, mtp=True) - model.num_params(active=True)
                                       + model.vocab_size * h),
        draft_passes=passes,
        nodes=1 if tree is None else tree.num_nodes,
        gdn_batch=batch,
        gdn_seconds=seconds,
    )


def gdn_profile(cfg: Mapping[str, Any], mode: str, strategy: str, tree: DraftTree | None, num_layers: int,
                tp: int = 1) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """The calibration's measured GDN op for ``strategy`` in ``mode`` (``gdn_profile.<mode>.<strategy>``: per-layer
    seconds at each batch, one GPU, for one draft shape), as (batches, seconds for all ``num_layers`` layers, times
    the fitted ``gdn_scale.<strategy>``); ``((), ())`` where there is none (no speculation, no profile, or one of
    another draft shape: bytes instead). Under tensor parallelism each GPU runs 1/tp of the heads: n requests take
    what n / tp took on the profile."""
    prof = ((cfg.get("gdn_profile") or {}).get(mode) or {}).get(strategy) if tree is not None else None
    if not prof or prof.get("draft") != tree.label.removesuffix("+root"):
        return (), ()
    batch = [float(b) for b in prof["batch"]]
    per_layer = [float(x) for x in prof["per_layer_s"]]
    if len(batch) != len(per_layer) or len(batch) < 2 or sorted(batch) != batch:
        raise ValueError(f"calibration gdn_profile.{mode}.{strategy}: batch and per_layer_s must be two ascending "
                         "lists of one length (>= 2)")
    scale = float((cfg.get("gdn_scale") or {}).get(strategy, 1.0))
    return tuple(b * tp for b in batch), tuple(x * num_layers * scale for x in per_layer)
