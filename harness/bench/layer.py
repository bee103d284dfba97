"""One GDN layer's speculative branch as vLLM 0.26 runs it: vLLM's own store_all kernel against each
strategy's op exactly as the plugin runs it, on vLLM's page layout (a section of ``bench kernels``).

vLLM's row is ``fused_sigmoid_gating_delta_rule_update`` called the way
``QwenGatedDeltaNetAttention._forward_core`` calls it for the speculative rows: raw bf16 q/k/v
(L2 norm in the kernel), the gating inputs a/b/A_log/dt_bias, the pool ``initial_state`` (V-major
pages ``[P, HV, V, K]``), ``ssm_state_indices [B, k + 1]`` (one page per processed token) and
``num_accepted_tokens``. A strategy's row is :func:`harness.engines.vllm.plugin.spec_update`, the
function the plugin puts in place of that kernel, with the same arguments and the plugin's own page
layout (one page per request, the stash and header in it): the whole per-layer op, glue included.

Times: CUDA events around each eager call (what the op costs where vLLM runs it outside CUDA graphs,
host syncs and launch gaps included) and, where the op can be captured, CUDA-graph replays (the
GPU time alone). Bytes: a model of the unique bytes each op moves (:func:`layer_traffic`), divided by
the copy bandwidth measured in the same run.
"""

from __future__ import annotations

import importlib
import statistics
from types import SimpleNamespace
from collections.abc import Callable
from typing import Any

import torch

from strategies import DraftTree, GDNShape

#: Where vLLM keeps the kernel (0.26: third_party; older releases: model_executor/layers/fla).
VLLM_KERNEL_MODULES = ("vllm.third_party.flash_linear_attention.ops.fused_sigmoid_gating",
                       "vllm.model_executor.layers.fla.ops.fused_sigmoid_gating")
KERNEL_NAME = "fused_sigmoid_gating_delta_rule_update"


def vllm_kernel() -> tuple[Callable | None, dict[str, Any]]:
    """vLLM's store_all speculative kernel, and where it came from (or why it is missing)."""
    why = []
    try:
        from vllm.triton_utils import HAS_TRITON
    except ImportError as e:
        return None, {"missing": f"vllm: {type(e).__name__}: {e}"}
    if not HAS_TRITON:   # vLLM swaps Triton for placeholders where it finds no GPU driver (CPU builds)
        return None, {"missing": "vLLM runs without Triton here (no GPU driver): its kernels are placeholders"}
    for mod in VLLM_KERNEL_MODULES:
        try:
            fn = getattr(importlib.import_module(mod), KERNEL_NAME)
        except (ImportError, AttributeError) as e:
            why.append(f"{mod}: {type(e).__name__}: {e}")
            continue
        import vllm

        return fn, {"module": mod, "vllm": getattr(vllm, "__version__", None)}
    return None, {"missing": "; ".join(why)}


def _views(raw: torch.Tensor, parts: list[tuple[tuple[int, ...], torch.dtype]], P: int) -> list[torch.Tensor]:
    """vLLM's page layout (``_reshape_kv_cache_tensors``): one buffer of P pages, each part of a page a
    strided view ``[P, *shape]`` at its byte offset, page stride = the whole page."""
    page = raw.shape[1]
    out, offset = [], 0
    for shape, dtype in parts:
        size = dtype.itemsize
        n = 1
        for d in shape:
            n *= d
        flat = raw.view(-1).view(dtype)
        strides = [page // size]
        acc = 1
        for d in reversed(shape):
            strides.insert(1, acc)
            acc *= d
        out.append(torch.as_strided(flat, (P, *shape), tuple(strides), offset // size))
        offset += n * size
    return out


def make_pages(P: int, shape: GDNShape, num_spec: int, layout, device) -> list[torch.Tensor]:
    """(conv, ssm ``[P, HV, V, K]`` fp32, and with a strategy's layout its stash and header) as views
    of one page buffer, zeroed. The conv part only takes its place in the page."""
    H, HV, K, V = shape.num_key_heads, shape.num_value_heads, shape.key_head_dim, shape.value_head_dim
    conv_dim = 2 * H * K + HV * V
    parts = [((conv_dim, shape.conv_kernel - 1 + num_spec), torch.bfloat16), ((HV, V, K), torch.float32)]
    if layout is not None:
        (stash_shape, header_shape), (stash_dt, header_dt) = layout.shapes(), layout.dtypes()
        parts += [(stash_shape, stash_dt), (header_shape, header_dt)]
    page = sum(dt.itemsize * _prod(s) for s, dt in parts)
    page = -(-page // 256) * 256                                # keep every page 256-byte aligned
    raw = torch.zeros(P, page, dtype=torch.uint8, device=device)
    return _views(raw, parts, P)


def _prod(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def vllm_inputs(gen: torch.Generator, B: int, num_spec: int, shape: GDNShape, accepted: torch.Tensor, device):
    """The speculative rows' kwargs of vLLM's call, B requests of 1 + k tokens each (pages filled later)."""
    H, HV, K, V = shape.num_key_heads, shape.num_value_heads, shape.key_head_dim, shape.value_head_dim
    N = num_spec + 1
    T = B * N

    def r(*s, scale=1.0):
        return (scale * torch.randn(*s, generator=gen)).to(device, torch.bfloat16)

    return {
        "A_log": torch.log(1 + 15 * torch.rand(HV, generator=gen)).to(device),    # decays as trained GDNs have
        "a": r(T, HV), "b": r(T, HV), "dt_bias": r(HV),
        "q": r(1, T, H, K), "k": r(1, T, H, K), "v": r(1, T, HV, V),
        "inplace_final_state": True, "use_qk_l2norm_in_kernel": True,
        "cu_seqlens": torch.arange(0, T + 1, N, dtype=torch.int32, device=device),
        "num_accepted_tokens": (accepted + 1).to(device, torch.int32),
    }


def layer_traffic(name: str, B: int, N: int, shape: GDNShape, path: float, ring: float = 0.0,
                  flushes: float = 0.0) -> float:
    """Unique bytes one step of one layer moves for B requests of N tokens (``path``: accepted tokens
    of the previous verify per request; ``ring``: buffered tokens replayed; ``flushes``: checkpoint
    rewrites per request and step). Every op reads q, k, v (bf16), a, b and writes bf16 outputs.
    vLLM's store_all reads the committed state and writes one per token; treewy reads the state and
    the previous stash's accepted path (ṽ, k, G: fp32), writes the rebuilt state and the new stash;
    the deferred strategies read the checkpoint and the ring, write the new stash, and rewrite the
    checkpoint at a flush."""
    H, HV, K, V = shape.num_key_heads, shape.num_value_heads, shape.key_head_dim, shape.value_head_dim
    S = HV * K * V * 4
    slot = (HV * V + H * K + HV) * 4
    io = N * ((2 * H * K + HV * V + 2 * HV) * 2 + HV * V * 2)
    if name == "vllm_store_all":
        per = S + N * S
    elif name == "treewy":
        per = 2 * S + path * slot + N * slot
    else:
        per = S + (ring + path) * slot + N * slot + flushes * S
    return B * (per + io)


def timed(fn: Callable[[], Any], warmup: int, repeats: int, graph: bool) -> dict[str, float]:
    """Median and mean seconds of one call (the deferred strategies' flushes make the two differ)."""
    from .kernels import gpu_samples

    times = gpu_samples(fn, warmup, repeats, graph)
    return {"median": statistics.median(times), "mean": statistics.fmean(times)}


def _resources() -> dict[str, Any]:
    """Registers and spills of the Triton op's kernels as last launched (empty where the plugin has none)."""
    try:
        from strategies.kernels.paged import resources
    except ImportError:
        return {}
    return resources()


def _fake_layer(shape: GDNShape, num_spec: int, caches) -> SimpleNamespace:
    """What the plugin reads off a ``QwenGatedDeltaNetAttention`` (TP 1)."""
    return SimpleNamespace(prefix="bench.layers.0.linear_attn", tp_size=1, num_k_heads=shape.num_key_heads,
                           num_v_heads=shape.num_value_heads, head_k_dim=shape.key_head_dim,
                           head_v_dim=shape.value_head_dim, num_spec=num_spec, kv_cache=[tuple(caches)])


def measure_layer(name: str, num_spec: int, B: int, shape: GDNShape, cfg, gen: torch.Generator, device,
                  kernel: Callable | None, accepted: torch.Tensor, tiles: dict[str, int] | None = None,
                  variant: str = "") -> dict[str, Any]:
    """One row: ``vllm_store_all`` (vLLM's kernel) or a strategy through the plugin's op, with the op's
    ``tiles`` (block_v, num_warps, algo: the plugin's COMMITBENCH_BLOCK_V / _NUM_WARPS / _PAGED_ALGO). ``variant``
    ``no_commit``: every call first marks the pages as holding nothing staged, so the op skips its
    commit (and treewy its state write): the commit's share of the step."""
    import os

    from harness.engines.vllm import plugin

    N = num_spec + 1
    tree = DraftTree.chain(num_spec, root=True)
    w, r = int(cfg.warmup), int(cfg.repeats)
    kw = vllm_inputs(gen, B, num_spec, shape, accepted, device)
    path = float(accepted.float().mean()) + 1
    row: dict[str, Any] = {"strategy": name, "batch": B, "draft": tree.label, "nodes": N}
    if name == "vllm_store_all":
        P = 1 + B * N
        _, ssm = make_pages(P, shape, num_spec, None, device)
        ssm.normal_(0, 0.05)
        kw.update(initial_state=ssm, ssm_state_indices=(1 + torch.randperm(B * N, generator=gen))
                  .reshape(B, N).to(device, torch.int32))
        fn = lambda: kernel(**kw)
        graph_safe = True
        bytes_ = layer_traffic(name, B, N, shape, path)
    else:
        from strategies.paged import StashLayout

        from .. import strategy_configs

        opts = strategy_configs.of(cfg, name)        # treewy keeps no ring: the layout's default
        ring = [int(opts["buffer_len"])] if opts.get("buffer_len") else []
        lay = StashLayout(name, shape.num_key_heads, shape.num_value_heads, shape.key_head_dim,
                          shape.value_head_dim, num_spec, *ring)
        P = 1 + B
        caches = make_pages(P, shape, num_spec, lay, device)
        caches[1].normal_(0, 0.05)
        pages = (1 + torch.randperm(B, generator=gen)).to(device, torch.int32)
        # The plugin's metadata patch repeats the one page to the k + 1 columns vLLM reads.
        kw.update(initial_state=caches[1], ssm_state_indices=pages[:, None].expand(B, N))
        layer = _fake_layer(shape, num_spec, caches)
        header, rows = caches[3], pages.long()
        if variant == "no_commit":
            def fn():
                header[:, 0].zero_()
                return plugin.spec_update(layer, name, lay.buffer_len, kernel, **kw)
        else:
            fn = lambda: plugin.spec_update(layer, name, lay.buffer_len, kernel, **kw)
        env = {"COMMITBENCH_BLOCK_V": str(tiles["block_v"]), "COMMITBENCH_NUM_WARPS": str(tiles["num_warps"]),
               "COMMITBENCH_PAGED_ALGO": tiles.get("algo", "auto")} if tiles else {}
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)        # the plugin reads its tiles when it first meets the layer
        try:
            for _ in range(3):        # steady state: a verify staged in every page
                fn()
        finally:
            for k, val in saved.items():
                os.environ.pop(k) if val is None else os.environ.__setitem__(k, val)
        if tiles:
            row.update(tiles)
        ran = getattr(getattr(layer, "_commitbench", None), "paged", None)
        if ran is not None:               # what ran, as a point records it (algo=auto picks by device)
            row["code"] = plugin.code_of(ran, caches[1].device)
            if ran.algo is not None:
                row.update(algo=ran.algo, block_v=ran.block_v, num_warps=ran.num_warps)
        row["variant"] = variant or None
        row["kernels"] = _resources()
        # Older plugins synced with the host on every call: never captured.
        graph_safe = getattr(plugin, "graph_safe", lambda _layer: False)(layer)
        row["graph_safe"] = bool(graph_safe)
        ring = flushes = 0.0
        if name != "treewy":          # the deferred strategies' ring fill and flush rate, as the steps run
            before = int(header[rows, 2].sum())
            for _ in range(r):
                fn()
                ring += float(header[rows, 1].float().mean()) / r
            flushes = (int(header[rows, 2].sum()) - before) / (r * B)
        bytes_ = layer_traffic(name, B, N, shape, path, ring=ring, flushes=flushes)
        row.update(ring_tokens=ring, flushes_per_step=flushes)
    row["bytes"] = bytes_
    row["states_moved"] = bytes_ / (B * shape.state_elems * 4)
    t = timed(fn, w, r, graph=False)
    row.update(eager_s=t["median"], eager_mean_s=t["mean"])
    if graph_safe and torch.cuda.is_available():
        t = timed(fn, w, r, graph=True)
        row.update(graph_s=t["median"], graph_mean_s=t["mean"])
    else:
        row.update(graph_s=None, graph_mean_s=None)
    return row
