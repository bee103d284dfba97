"""The paged step on Triton (:class:`strategies.paged.PagedCommit` with ``backend="triton"``).

Two launches per call (:mod:`.paged_kernels`; the step's in :mod:`.paged_gluon` with ``algo="gluon"``), no host
sync, nothing shaped by the data: what an engine can capture in a CUDA graph. Sizes come from the layout and the
tensors' shapes only.
"""

from __future__ import annotations

import os

import torch
import triton

from . import paged_kernels as pk

STRATS = {"treewy": pk.TREEWY, "replay": pk.REPLAY, "treewy_deferred": pk.TREEWY_DEFERRED}
#: How the step kernel verifies: the gated delta rule token by token on CUDA cores, in Triton. The H200
#: measured every other form slower at batch 256, k = 3 (results/h200-kernel-speed): TreeWY's matrix form in
#: tf32x3 dots 1.7x (e1fc163), the recurrence unrolled from the committed state in Gram scalars 1.3x (f4ad430),
#: the same from the page as it is, its commit after the verify, 1.4x (39c52ac), and both projections of a
#: token from one pass within 4% (554dc81). ``gluon``: the same recurrence with the state tile's layout
#: chosen (:mod:`.paged_gluon`: 16 K-values per thread, three shuffle rounds per K-reduction instead of
#: five); CUDA only, 0.70x the Triton kernel's time there, so :class:`strategies.paged.PagedCommit`'s
#: ``algo="auto"`` picks it on CUDA pages.
ALGOS = ("recurrence", "gluon")
#: The compiled kernels of the last launch, by name (their registers and spills: :func:`resources`).
LAUNCHED: dict[str, object] = {}
#: How a call reaches the GPU. ``jit``: through Triton's entry point (``kernel[grid](...)``) every time, which
#: binds the ~30 arguments, formats the specialisation into a cache key and looks the kernel up. ``direct``: that
#: once per specialisation, then the compiled kernel's launcher directly (:func:`_run`), on a key of what Triton
#: specialises on (dtypes, 16-byte alignment, integers equal to 1 or divisible by 16). Why: in vLLM's mixed
#: prefill-decode steps the GDN layers run eagerly and the host paces the step (the layer clock in
#: results/h200-kernel-speed/e2e/layer-clock-gmu0.9: the op's two launches 0.27 ms of host time per layer, vLLM's
#: one 0.13 ms). ``direct`` falls back to ``jit`` in Triton's interpreter and while a launch hook (a profiler) is set.
LAUNCHES = ("direct", "jit")
#: (kernel, constants, warps, device, specialisation) -> (compiled kernel, the constexpr values in parameter order)
_DIRECT: dict[tuple, tuple[object, tuple]] = {}


def resources() -> dict[str, dict[str, int | None]]:
    """Registers per thread and spilled bytes of the kernels launched last (None in the interpreter)."""
    return {name: {"registers": getattr(k, "n_regs", None), "spills": getattr(k, "n_spills", None)}
            for name, k in LAUNCHED.items()}


def _consts(layout, block_v: int) -> dict[str, int]:
    H, HV, K, V = layout.num_key_heads, layout.num_value_heads, layout.key_head_dim, layout.value_head_dim
    N = layout.nodes
    L = layout.buffer_len if layout.strategy != "treewy" else N
    return {"H": H, "HV": HV, "K": K, "V": V, "BK": triton.next_power_of_2(K),
            "BV": min(int(block_v), triton.next_power_of_2(V)), "N": N, "L": L, "STRAT": STRATS[layout.strategy]}


def _finish_consts(c: dict[str, int]) -> dict[str, int]:
    return {"H": c["H"], "HV": c["HV"], "K": c["K"], "V": c["V"], "BH": triton.next_power_of_2(c["H"]),
            "BK": c["BK"], "BHV": triton.next_power_of_2(c["HV"]), "N": c["N"], "L": c["L"], "STRAT": c["STRAT"]}


#: What was checked and derived per (layout, tiles, page tensors' metadata): the engine calls the op once per
#: layer and step with the same pages, so its Python work per call is the launches alone (on the H200 the
#: step is often waiting on the CPU: vLLM's mixed prefill/decode steps run the GDN layers eagerly).
_PLANS: dict[tuple, tuple[dict[str, int], dict[str, object], dict[str, int]]] = {}


def _meta(t: torch.Tensor) -> tuple:
    return (tuple(t.shape), t.stride(), t.dtype, t.device)


def _plan(layout, pool, stash, header, block_v: int, algo: str):
    """(step constants, finish constants), checked once per page layout and arithmetic."""
    key = (layout, int(block_v), algo, _meta(pool), _meta(stash), _meta(header))
    got = _PLANS.get(key)
    if got is None:
        _check(pool, stash, header, layout)
        if algo not in ALGOS:
            raise ValueError(f"algo={algo!r}: choose one of {', '.join(ALGOS)} (the plugin reads "
                             "COMMITBENCH_PAGED_ALGO)")
        c = _consts(layout, block_v)
        got = _PLANS[key] = (c, _finish_consts(c))
    return got


def _check(pool: torch.Tensor, stash: torch.Tensor, header: torch.Tensor, layout) -> None:
    HV, V, K = layout.num_value_heads, layout.value_head_dim, layout.key_head_dim
    if pool.dim() != 4 or tuple(pool.shape[1:]) != (HV, V, K):
        raise ValueError(f"pool: shape {tuple(pool.shape)}; expected [P, {HV}, {V}, {K}] (vLLM's V-major pages)")
    if tuple(stash.shape[1:]) != layout.shapes()[0] or stash.dtype != torch.float32:
        raise ValueError(f"stash: shape {tuple(stash.shape)} {stash.dtype}; expected [P, *{layout.shapes()[0]}] "
                         "float32 (StashLayout.shapes())")
    if header.shape[-1] != 4 or header.dtype != torch.int32:
        raise ValueError(f"header: shape {tuple(header.shape)} {header.dtype}; expected [P, 4] int32")
    for name, t in (("stash", stash), ("header", header)):
        if t.stride(-1) != 1 or (t.dim() == 3 and t.stride(1) != t.shape[2]):
            raise ValueError(f"{name}: each page's part must be contiguous (strides {t.stride()})")


def step(layout, pool, stash, header, q, k, v, a, b, A_log, dt_bias, state_indices, num_accepted, cu_seqlens,
         scale: float, out: torch.Tensor, probe: torch.Tensor | None = None, block_v: int = 32,
         num_warps: int = 4, algo: str = "recurrence", commit_indices: torch.Tensor | None = None,
         commit_accepted: torch.Tensor | None = None, launch: str = "direct") -> None:
    """See :meth:`strategies.paged.PagedCommit.step` (same arguments); writes ``out`` and the pages. The rows
    ``commit_indices`` (with ``commit_accepted``) only commit, in the same two launches. ``launch``: one of
    :data:`LAUNCHES`."""
    n = cu_seqlens.shape[0] - 1
    if n <= 0:
        if commit_indices is not None:
            commit(layout, pool, stash, header, commit_indices, commit_accepted, block_v, num_warps, algo, launch)
        return
    c, fc = _plan(layout, pool, stash, header, block_v, algo)
    if probe is not None and not (probe.is_contiguous() and probe.dtype == torch.float32
                                  and tuple(probe.shape[1:]) == (c["HV"], c["K"], c["V"]) and probe.shape[0] >= n):
        raise ValueError(f"probe: shape {tuple(probe.shape)}, strides {probe.stride()}, {probe.dtype}; the op writes "
                         f"it as a contiguous float32 [rows >= {n}, {c['HV']}, {c['K']}, {c['V']}] block (a transposed "
                         "view of the pages is not one: allocate it with torch.empty)")
    if not (q.is_contiguous() and k.is_contiguous() and v.is_contiguous() and a.is_contiguous()
            and b.is_contiguous()):   # vLLM's are
        q, k, v, a, b = (x.contiguous() for x in (q, k, v, a, b))
    if commit_indices is None:     # none to commit: any tensors stand in (rows past n_verify do not exist)
        commit_indices, commit_accepted = state_indices, num_accepted
        m = 0
    else:
        m = commit_indices.shape[0]
    _launch(c, fc, pool, stash, header, state_indices, num_accepted, cu_seqlens, commit_indices, commit_accepted,
            n, m, (q, k, v, a, b, A_log, dt_bias, out), probe, scale, num_warps, algo, launch)


def commit(layout, pool, stash, header, state_indices, num_accepted, block_v: int = 32, num_warps: int = 4,
           algo: str = "recurrence", launch: str = "direct") -> None:
    """See :meth:`strategies.paged.PagedCommit.commit`: the step's two launches with no verify rows."""
    m = state_indices.shape[0]
    if m <= 0:
        return
    c, fc = _plan(layout, pool, stash, header, block_v, algo)
    # No tokens: the verify rows' arguments are never read; any tensor stands in for them.
    dummy = num_accepted
    _launch(c, fc, pool, stash, header, dummy, dummy, dummy, state_indices, num_accepted, 0, m,
            (dummy,) * 7 + (pool,), None, 1.0, num_warps, algo, launch)


def _launch(c, fc, pool, stash, header, state_indices, num_accepted, cu_seqlens, cidx, cnacc, n, m, tokens, probe,
            scale, num_warps, algo, launch) -> None:
    """``paged_step`` (Gluon's with ``algo="gluon"``) then ``paged_finish`` over n verify rows and m commit rows;
    ``c``, ``fc``: their constants (:func:`_plan`), ``tokens``: q, k, v, a, b, A_log, dt_bias, out."""
    q, k, v, a, b, A_log, dt_bias, out = tokens
    s_idx = state_indices.stride(0) if state_indices.dim() else 0
    s_cidx = cidx.stride(0) if cidx.dim() else 0      # a strided or 2-D index (vLLM's block table column) as is
    grid = ((n + m) * c["HV"], -(-c["V"] // c["BV"]))
    args = (pool, *pool.stride(), stash, stash.stride(0), header, header.stride(0), state_indices, s_idx,
            num_accepted, cu_seqlens, cidx, s_cidx, cnacc, n, q, k, v, a, b, A_log, dt_bias, out,
            probe if probe is not None else out, scale)
    if launch not in LAUNCHES:
        raise ValueError(f"launch={launch!r}: choose one of {', '.join(LAUNCHES)} (the vLLM plugin reads "
                         "COMMITBENCH_PAGED_LAUNCH)")
    direct = launch == "direct" and pool.device.type == "cuda" and os.environ.get("TRITON_INTERPRET") != "1"
    if algo == "gluon":
        if pool.device.type != "cuda" or os.environ.get("TRITON_INTERPRET") == "1":
            raise ValueError("algo='gluon' runs on a CUDA device only (Gluon has no interpreter): use 'recurrence' "
                             "(COMMITBENCH_PAGED_ALGO) on CPU")
        from . import paged_gluon

        kernel = _run(paged_gluon.paged_step, grid, args, c, {"PROBE": probe is not None, "NW": num_warps},
                      num_warps, direct)
    else:
        kernel = _run(pk.paged_step, grid, args, c, {"PROBE": probe is not None}, num_warps, direct)
    finish = _run(pk.paged_finish, (n + m, 1),
                  (stash, stash.stride(0), header, header.stride(0), state_indices, s_idx, num_accepted, cu_seqlens,
                   cidx, s_cidx, cnacc, n, k, a, A_log, dt_bias), fc, {}, 4, direct)
    if n:       # resources() reports the verify step's kernels, not a commit's variant
        LAUNCHED["paged_step"], LAUNCHED["paged_finish"] = kernel, finish


def launch_hooked() -> bool:
    """Whether Triton has a launch hook to call (a profiler's): then a launch goes through its entry point, which
    calls it. Triton's knobs hold each hook as a chain whose ``calls`` list is empty by default (3.5 on); older
    versions as a plain callable or None. (Testing ``is None`` saw the empty chain as a hook: the first direct
    launch fell back to the entry point every time.)"""
    runtime = getattr(getattr(triton, "knobs", None), "runtime", None)
    for name in ("launch_enter_hook", "launch_exit_hook"):
        hook = getattr(runtime, name, None)
        if hook is not None and getattr(hook, "calls", True):
            return True
    return False


def specialisation(args: tuple) -> tuple:
    """What Triton's launch specialises on, per argument, refined so that equal keys always mean the same compiled
    kernel: a tensor's dtype and whether its data is 16-byte aligned, an integer's being 1, divisible by 16 and
    32-bit, a float's nothing. Finer than Triton's own key where an argument is marked ``do_not_specialize``
    (a miss then compiles nothing: Triton's entry point finds its kernel and the key joins the cache)."""
    key = []
    for x in args:
        if isinstance(x, torch.Tensor):
            key.append((x.dtype, x.data_ptr() % 16 == 0))
        elif isinstance(x, bool) or not isinstance(x, int):
            key.append(type(x))
        else:
            key.append((x == 1, x % 16 == 0, -2 ** 31 <= x < 2 ** 31))
    return tuple(key)


def _run(fn, grid: tuple[int, int], args: tuple, consts: dict, flags: dict, num_warps: int, direct: bool):
    """Launch ``fn`` over ``grid`` with the runtime ``args`` (in parameter order), the plan's constexprs
    ``consts`` (cached per plan, so one dict per plan) and ``flags`` (the per-call constexprs); returns the
    compiled kernel. ``direct``: see :data:`LAUNCHES`."""
    if direct and not launch_hooked():
        device = torch.cuda.current_device()     # where Triton's entry point launches too
        key = (fn, id(consts), num_warps, device, tuple(flags.values()), specialisation(args))
        hit = _DIRECT.get(key)
        if hit is not None:
            kernel, tail = hit
            # The launcher's arguments as Triton's entry point passes them (triton/runtime/jit.py, 3.3 to 3.9):
            # grid, stream, function, metadata, launch metadata and hooks (none: no hook is set), the arguments.
            kernel.run(grid[0], grid[1], 1, torch._C._cuda_getCurrentRawStream(device), kernel.function,
                       kernel.packed_metadata, None, None, None, *args, *tail)
            return kernel
        kernel = fn[grid](*args, num_warps=num_warps, **flags, **consts)
        names = {**consts, **flags}
        _DIRECT[key] = (kernel, tuple(names[p] for p in fn.arg_names[len(args):]))
        return kernel
    return fn[grid](*args, num_warps=num_warps, **flags, **consts)

