"""``python -m harness bench kernels``: the strategies' Triton kernels on one GPU, against its memory roofline.

Per (draft shape, batch, strategy), one GDN layer of the model's head shape: the median GPU time of
verify and of commit, the bytes each moves (a model of the unique bytes the kernels read and write,
documented per strategy in :func:`traffic`), the achieved bandwidth and its fraction of the HBM copy
bandwidth measured at the start of the same run, and the speculative state the strategy holds. Times
come from CUDA graphs of one call replayed ``repeats`` times (launch overhead excluded); replay's
commit, torch code with host syncs, is timed with events around each call. Then TreeWY's verify with
and without its triangular solve over chains of N nodes: the solve's cost as N grows, and the N at
which TreeWY's verify costs more than store_all's. With ``tune=true`` each strategy first gets the
value-tile width and warp count that make its step fastest at the largest batch (recorded as ``tiles``).
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path
from typing import Any, Callable

import torch
from omegaconf import DictConfig

import strategies
from strategies import DraftTree, GDNShape, as_dtype, dtype_bytes
from strategies.inputs import check_confidence, check_step

from .. import strategy_configs
from ..config import load_model, parse_draft
from ..provenance import provenance
from .strategies import sample_accepted, step_inputs

GiB = 2 ** 30


# -- timing ---------------------------------------------------------------------------------------

def gpu_samples(fn: Callable[[], Any], warmup: int, repeats: int, graph: bool = True) -> list[float]:
    """Seconds of each of ``repeats`` calls of ``fn()`` on the GPU: CUDA events around each call, or with
    ``graph`` around each replay of a CUDA graph of one call (launch overhead excluded). CPU wall time
    where there is no GPU (Triton's interpreter: smoke runs)."""
    for _ in range(warmup):
        fn()
    if not torch.cuda.is_available():
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return times
    torch.cuda.synchronize()
    run = fn
    if graph:
        g = torch.cuda.CUDAGraph()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            fn()                                  # allocations settle before capture
            with torch.cuda.graph(g, stream=stream):
                fn()
        torch.cuda.current_stream().wait_stream(stream)
        run = g.replay
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return times


def gpu_seconds(fn: Callable[[], Any], warmup: int, repeats: int, graph: bool = True) -> float:
    """Median seconds of one ``fn()`` (:func:`gpu_samples`)."""
    return statistics.median(gpu_samples(fn, warmup, repeats, graph))


def copy_bandwidth(nbytes: int, warmup: int, repeats: int, device: str) -> dict[str, float]:
    """HBM copy bandwidth in bytes/s counting read + write, for ``nbytes``: torch's ``copy_`` and a
    plain streaming Triton kernel; ``best`` (the larger) is the roofline the fractions divide by."""
    from strategies.kernels import _ops

    n = max(1, nbytes // 4)
    src = torch.ones(n, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    graph = torch.cuda.is_available()
    torch_bw = 2 * n * 4 / gpu_seconds(lambda: dst.copy_(src), warmup, repeats, graph=graph)
    triton_bw = 2 * n * 4 / gpu_seconds(lambda: _ops().stream_copy(src, dst), warmup, repeats, graph=graph)
    return {"torch_copy": torch_bw, "triton_copy": triton_bw, "best": max(torch_bw, triton_bw), "bytes": n * 4}


# -- inputs and bytes -----------------------------------------------------------------------------

def inputs(gen: torch.Generator, B: int, tree: DraftTree, s: GDNShape, in_dtype, state_dtype, device):
    """A state ``[B, HV, K, V]`` and one step's q, k, v, g, beta (bench strategies' inputs) on ``device``."""
    state = 0.1 * torch.randn(B, s.num_value_heads, s.key_head_dim, s.value_head_dim, generator=gen)
    return state.to(device, state_dtype), [t.to(device, in_dtype) for t in step_inputs(gen, B, tree, s, torch.float32)]


def traffic(name: str, tree: DraftTree, s: GDNShape, sb: int, ib: int, B: int, *,
            path_nodes: float = 0.0, ring_tokens: float = 0.0, appended: float = 0.0,
            flushes: float = 0.0) -> dict[str, float]:
    """Unique bytes one step moves for ``B`` requests, one layer (what a perfect cache would move).

    sb/ib: state and input element bytes. Every verify reads h0, q, k, v, g, beta and writes the
    outputs (fp32). treewy's verify writes Ṽ, G (fp32) and k, and its Gram matrices k·k and q·k
    (two [H, N, N] fp32 per request, from q and k read again) go out and back; its commit reads h0 and
    the accepted path's stash (``path_nodes`` nodes on average) and writes h_a. treewy_fused (the
    engine's step: commit the last draft, verify the next, one kernel) reads h0 once and writes h_a once.
    store_all's verify writes N snapshots and, for a branching tree, reads each non-root-level node's
    parent snapshot back; its commit moves an index. replay's verify reads the checkpoint and
    ``ring_tokens`` buffered tokens' (u, k, g) and writes u; its commit copies the ``appended``
    accepted tokens into the ring and, in ``flushes`` of the steps, rebuilds the checkpoint (read,
    write, and the ring).
    """
    N, H, HV, K, V = tree.num_nodes, s.num_key_heads, s.num_value_heads, s.key_head_dim, s.value_head_dim
    S = HV * K * V * sb
    ins = N * (2 * H * K + HV * V + 2 * HV) * ib
    outs = N * HV * V * 4
    tok = HV * V * sb + H * K * sb + HV * sb       # one ring or stash token (u or Ṽ, k, g or G)
    stash = HV * V * 4 + HV * 4 + H * K * ib       # one node's Ṽ, G and k
    grams = 2 * (2 * H * N * N * 4) + 2 * N * H * K * ib
    if name == "treewy":
        verify = S + ins + outs + N * stash + grams
        commit = 2 * S + path_nodes * stash
    elif name == "treewy_fused":                   # commit + verify in one kernel: h0 read once, h_a written once
        verify = 2 * S + path_nodes * stash + ins + outs + N * stash + grams
        commit = 0
    elif name == "store_all":
        parents_read = 0 if tree.is_chain else sum(1 for p in tree.parents if p >= 0)
        verify = S + ins + outs + N * S + parents_read * S
        commit = 8
    else:
        verify = S + ring_tokens * tok + ins + outs + N * HV * V * 4
        commit = 2 * appended * tok + flushes * (2 * S + ring_tokens * tok)
    return {"verify_bytes": B * verify, "commit_bytes": B * commit}


def flushes_per_step(tree: DraftTree, accepted: list[int], L: int) -> float:
    """Replay's flushes per request per step in steady state, from the sampled acceptance: the ring
    takes each step's accepted tokens and is flushed when the next draft would not fit behind them."""
    N, length, flushes, steps = tree.num_nodes, 0, 0, 0
    for _ in range(8):
        for a in accepted:
            length += a + 1
            steps += 1
            if length + N > L:
                flushes, length = flushes + 1, 0
    return flushes / steps


# -- one measurement ------------------------------------------------------------------------------

def measure(name: str, tree: DraftTree, B: int, shape: GDNShape, cfg: DictConfig, gen, device,
            tiles: dict[str, int] | None = None) -> dict[str, Any]:
    """One strategy's verify and commit on one draft shape and batch; ``tiles`` (block_v, num_warps)
    default to the config's."""
    from strategies import kernels

    sdt, idt = as_dtype(cfg.state_dtype), as_dtype(cfg.input_dtype)
    sb, ib = dtype_bytes(sdt), dtype_bytes(idt)
    state, (q, k, v, g, beta) = inputs(gen, B, tree, shape, idt, sdt, device)
    acc_list = sample_accepted(gen, tree, B, float(cfg.accept_rate)).tolist()
    accepted = torch.tensor(acc_list, device=device)
    path_nodes = statistics.mean(len(tree.path_to(a)) if a >= 0 else 0 for a in acc_list)
    tiles = tiles or dict(block_v=int(cfg.block_v), num_warps=int(cfg.num_warps))
    w, r = int(cfg.warmup), int(cfg.repeats)
    row: dict[str, Any] = {"strategy": name, "batch": B, "draft": tree.label, "nodes": tree.num_nodes, **tiles}
    if name == "treewy":
        strat = kernels.get("treewy", inplace=True, solve=str(cfg.solve), **tiles)
        ver = strat.verify(state, q, k, v, g, beta, tree)
        row["verify_s"] = gpu_seconds(lambda: strat.verify(state, q, k, v, g, beta, tree), w, r)
        row["commit_s"] = gpu_seconds(lambda: strat._commit(state, ver, accepted), w, r)  # no host-side checks
        bytes_ = traffic(name, tree, shape, sb, ib, B, path_nodes=path_nodes)
    elif name == "treewy_fused":
        strat = kernels.get("treewy", solve=str(cfg.solve), **tiles)
        ver = strat.verify(state, q, k, v, g, beta, tree)
        s = ver.shape
        row["verify_s"] = gpu_seconds(lambda: strat._step(state, ver, accepted, q, k, v, g, beta, tree, s,
                                                          shape.key_head_dim ** -0.5), w, r)
        row["commit_s"] = 0.0
        bytes_ = traffic(name, tree, shape, sb, ib, B, path_nodes=path_nodes)
    elif name == "store_all":
        strat = kernels.get("store_all", **tiles)
        carry = strat.commit(strat.start(state), strat.verify(strat.start(state), q, k, v, g, beta, tree), accepted)
        ver = strat.verify(carry, q, k, v, g, beta, tree)          # in place from here on
        row["verify_s"] = gpu_seconds(lambda: strat.verify(carry, q, k, v, g, beta, tree), w, r)
        row["commit_s"] = gpu_seconds(lambda: strat._commit(carry, ver, accepted), w, r)
        bytes_ = traffic(name, tree, shape, sb, ib, B)
    else:
        L = int(strategy_configs.of(cfg, "replay")["buffer_len"])
        strat = kernels.get("replay", buffer_len=L, **tiles)
        carry = strat.start(state)
        strat.verify(carry, q, k, v, g, beta, tree)               # allocates the ring
        ring = torch.randint(0, L - tree.num_nodes + 1, (B,), generator=gen)
        carry.length = ring.to(device)                            # steady state: rings part full
        carry.u.normal_(0, 0.1), carry.k.normal_(0, 0.1), carry.g.uniform_(-2, 0)
        row["verify_s"] = gpu_seconds(lambda: strat.verify(carry, q, k, v, g, beta, tree), w, r)
        ver = strat.verify(carry, q, k, v, g, beta, tree)
        f = flushes_per_step(tree, acc_list, L)

        def append():                                             # commit without the flush
            saved = carry.length.clone()
            carry.commit_path(torch.arange(tree.num_nodes, device=device).expand(B, -1), accepted + 1,
                              ver.stash["u"], ver.stash["k"], ver.stash["g"], reserve=0)
            carry.length = saved
        append_s = gpu_seconds(append, w, r, graph=False)
        full = torch.ones(B, dtype=torch.bool, device=device)

        def flush():
            carry.length = ring.to(device)
            carry._rebuild_from_ring(carry.checkpoint, carry.checkpoint, full, store_all=False)
        flush_s = gpu_seconds(flush, w, r, graph=False)
        row.update(flush_s=flush_s, flushes_per_step=f, append_s=append_s, commit_s=append_s + f * flush_s)
        bytes_ = traffic(name, tree, shape, sb, ib, B, ring_tokens=float(ring.float().mean()),
                         appended=statistics.mean(a + 1 for a in acc_list), flushes=f)
    row.update(bytes_)
    row["step_s"] = row["verify_s"] + row["commit_s"]
    # The issue's yardstick: full states' worth of bytes per request and layer, verify + commit.
    row["states_moved"] = (row["verify_bytes"] + row["commit_bytes"]) / (B * shape.state_elems * sb)
    base = name.removesuffix("_fused")
    mem = kernels.get(base, **strategy_configs.of(cfg, base)).memory(shape, tree, state_dtype=cfg.state_dtype)
    row["speculative_bytes_per_request"] = mem.speculative_bytes
    return row


def _solve_row(N: int, shape: GDNShape, cfg: DictConfig, gen, device,
               tiles: dict[str, dict[str, int]]) -> dict[str, Any]:
    """TreeWY's verify with and without the triangular solve, and store_all's verify, on a chain of N nodes."""
    from strategies import kernels

    sdt, idt = as_dtype(cfg.state_dtype), as_dtype(cfg.input_dtype)
    w, r, B = int(cfg.warmup), int(cfg.repeats), int(cfg.solve_batch)
    tree = DraftTree.chain(N - 1, root=True)
    state, (q, k, v, g, beta) = inputs(gen, B, tree, shape, idt, sdt, device)
    on = kernels.get("treewy", **tiles["treewy"])
    off = kernels.get("treewy", solve="none", **tiles["treewy"])
    sa = kernels.get("store_all", **tiles["store_all"])
    carry = sa.commit(sa.start(state), sa.verify(sa.start(state), q, k, v, g, beta, tree),
                      torch.zeros(B, dtype=torch.long, device=device))
    t_on = gpu_seconds(lambda: on.verify(state, q, k, v, g, beta, tree), w, r)
    t_off = gpu_seconds(lambda: off.verify(state, q, k, v, g, beta, tree), w, r)
    t_sa = gpu_seconds(lambda: sa.verify(carry, q, k, v, g, beta, tree), w, r)
    return {"nodes": N, "batch": B, "treewy_verify_s": t_on, "treewy_verify_nosolve_s": t_off,
            "solve_s": max(t_on - t_off, 0.0), "store_all_verify_s": t_sa}


def crossover(rows: list[dict[str, Any]]) -> int | None:
    """The smallest N at which TreeWY's verify takes longer than store_all's (None: never here)."""
    for r in sorted(rows, key=lambda r: r["nodes"]):
        if r["treewy_verify_s"] > r["store_all_verify_s"]:
            return r["nodes"]
    return None


STRATEGY_ROWS = ("store_all", "replay", "treewy", "treewy_fused")


def tune(shape: GDNShape, cfg: DictConfig, gen, device, console) -> dict[str, dict[str, int]]:
    """Each strategy's fastest (block_v, num_warps) among ``tune_block_v`` x ``tune_num_warps``, by
    verify + commit time on ``tune_draft`` at the largest batch: every kernel is compared at its best."""
    tree, B = parse_draft(cfg.tune_draft, root=bool(cfg.root)), max(int(b) for b in cfg.batches)
    best: dict[str, dict[str, int]] = {}
    for name in STRATEGY_ROWS:
        times = {}
        for bv in cfg.tune_block_v:
            for nw in cfg.tune_num_warps:
                tiles = {"block_v": int(bv), "num_warps": int(nw)}
                try:
                    times[(int(bv), int(nw))] = measure(name, tree, B, shape, cfg, gen, device, tiles)["step_s"]
                except torch.cuda.OutOfMemoryError:
                    torch.cuda.empty_cache()
        if not times:
            best[name] = {"block_v": int(cfg.block_v), "num_warps": int(cfg.num_warps)}
            continue
        (bv, nw), t = min(times.items(), key=lambda kv: kv[1])
        best[name] = {"block_v": bv, "num_warps": nw}
        console.print(f"  tiles for {name}: block_v={bv} num_warps={nw} ({1e6 * t:.1f} us per step on "
                      f"{tree.label} at batch {B}; slowest tried {1e6 * max(times.values()):.1f} us)")
    return best


# -- the command ----------------------------------------------------------------------------------

def _smoke(cfg: DictConfig) -> DictConfig:
    from omegaconf import OmegaConf

    small = OmegaConf.create({"batches": [1, 2], "drafts": ["chain:1", "chain:3", [2, 2]], "solve_nodes": [2, 4],
                              "solve_batch": 2, "warmup": 0, "repeats": 1, "copy_bytes": 1 << 20,
                              "block_v": 16, "tune_block_v": [16, 32], "tune_num_warps": [4],
                              "layer": {"batches": [1, 2], "chains": [1, 3]},
                              "forks": {"drafts": [[2, 2]], "batches": [2]},
                              "selective": {"drafts": ["chain:3", [2, 2]], "batches": [2]}})
    small.strategies = {name: {**opts, "buffer_len": 8} if "buffer_len" in opts else opts
                        for name, opts in strategy_configs.of_all(cfg).items()}
    return OmegaConf.merge(cfg, small)


def _ring(cfg: DictConfig, name: str) -> float:
    """Tokens strategy ``name``'s ring holds in this run (inf: it keeps none)."""
    return float(strategy_configs.of(cfg, name).get("buffer_len") or float("inf"))


def _runs(cfg: DictConfig, name: str, tree: DraftTree) -> bool:
    """Whether a section times row ``name`` on ``tree``: a strategy that takes no trees only on chains, a deferred
    one only where one step fits its ring; rows that are no strategy of the registry (``treewy_fused``, a variant
    of treewy's kernel; the layer section's ``vllm_store_all``, vLLM's own kernel) on all."""
    if name not in strategies.names():
        return True
    strat = strategies.get(name)
    return (strat.supports_trees or tree.is_chain) and tree.num_nodes <= _ring(cfg, name)


def run(cfg: DictConfig) -> int:
    from strategies import kernels

    from ..console import console as make_console

    gpu = _refuse_what_cannot_run(cfg)
    model = load_model(cfg.model)
    shape = model.gdn_shape()
    if cfg.smoke:
        cfg = _smoke(cfg)
        shape = GDNShape(num_layers=shape.num_layers, num_key_heads=1, num_value_heads=2, key_head_dim=16,
                         value_head_dim=32, conv_kernel=shape.conv_kernel)
    kernels.get("treewy")  # loads the kernels (and the interpreter switch) before anything else
    device = "cuda" if gpu else "cpu"
    console = make_console()
    where = torch.cuda.get_device_name(0) if gpu else "CPU, Triton interpreter (smoke: times mean nothing)"
    console.print(f"[bold]bench kernels[/] on {where}: one GDN layer of {model.display_name} "
                  f"(H={shape.num_key_heads} HV={shape.num_value_heads} K={shape.key_head_dim} "
                  f"V={shape.value_head_dim}), state {cfg.state_dtype}, inputs {cfg.input_dtype}, "
                  f"median of {cfg.repeats}")
    gen = torch.Generator().manual_seed(int(cfg.seed))
    copy = copy_bandwidth(int(cfg.copy_bytes), int(cfg.warmup), int(cfg.repeats), device)
    copy_bw = copy["best"]
    console.print(f"  copy bandwidth (read + write, {copy['bytes'] / GiB:.1f} GiB): "
                  f"torch {copy['torch_copy'] / 1e9:,.0f} GB/s, Triton {copy['triton_copy'] / 1e9:,.0f} GB/s")
    result = _new_result(cfg, shape, where, gpu, copy)
    out = Path(str(cfg.out)) if cfg.out else None
    done = _resume(out, result, console)
    if "layer" in cfg.sections:
        _layer_section(result, shape, cfg, gen, device, copy_bw, console, out)
    if "kernels" in cfg.sections:
        _kernel_section(result, done, shape, cfg, gen, device, copy_bw, console, out)
    if "solve" in cfg.sections:
        _solve_section(result, shape, cfg, gen, device, console, out)
    if "forks" in cfg.sections:
        _forks_section(result, shape, cfg, gen, device, console, out)
    if "selective" in cfg.sections:
        _selective_section(result, shape, cfg, gen, device, console, out)
    result["crossover_nodes"] = crossover(result["solve"])
    result["complete"] = True
    print_tables(console, result)
    if out is not None:
        _write(out, result, console)
    return 0


def _refuse_what_cannot_run(cfg: DictConfig) -> bool:
    """Whether a CUDA GPU is here; refuses, before any timing, an unknown section, a missing Triton, and a
    machine without a GPU unless ``smoke`` (Triton's interpreter, tiny shapes)."""
    from strategies import kernels

    unknown = sorted(set(cfg.sections) - set(SECTIONS))
    if unknown:
        raise ValueError(f"sections={list(cfg.sections)}: unknown {unknown}; choose from {list(SECTIONS)}")
    if not kernels.available():
        raise ValueError("bench kernels: Triton is not installed; on the GPU host it comes with CUDA torch, "
                         "elsewhere pip install 'commitbench[gpu]'")
    gpu = torch.cuda.is_available()
    if not gpu and not cfg.smoke:
        raise ValueError("bench kernels times compiled Triton kernels on a CUDA GPU and this machine has none; "
                         "run it on the GPU host, or pass smoke=true to exercise the benchmark on tiny shapes in "
                         "Triton's CPU interpreter (its times mean nothing)")
    return gpu


def _new_result(cfg: DictConfig, shape: GDNShape, where: str, gpu: bool, copy: dict[str, Any]) -> dict[str, Any]:
    """The result document the sections fill (and a resumed run continues)."""
    from omegaconf import OmegaConf

    return {
        "engine": "triton" if gpu else "triton-interpreter (smoke)", "device": where, "complete": False,
        "copy_bandwidth": copy["best"], "copy": copy, "num_layers": shape.num_layers,
        "shape": {"H": shape.num_key_heads, "HV": shape.num_value_heads, "K": shape.key_head_dim,
                  "V": shape.value_head_dim},
        "rows": [], "failed": [], "solve": [], "crossover_nodes": None, "triton": _triton_version(), "tiles": {},
        "layer": {"rows": [], "vllm_kernel": None}, "forks": {"rows": [], "step_reference": None},
        "selective": {"rows": []},
        "sections": list(cfg.sections),
        "provenance": provenance(),
        "config": OmegaConf.to_container(cfg, resolve=True)}


def _write(out: Path, result: dict[str, Any], console) -> None:
    """The finished result to ``out``, and its HTML report beside it where matplotlib is installed."""
    _save(out, result)
    console.print(f"wrote {out}")
    try:
        from reports.kernels import write_report
    except ImportError as e:  # a lean GPU host: the numbers are safe, plot them elsewhere
        console.print(f"no report here ({e}); run `python -m harness report {out.parent}` where matplotlib is")
    else:
        console.print(f"wrote {write_report(result, out.with_suffix('.html'))}")


SECTIONS = ("layer", "kernels", "solve", "forks", "selective")


def campaign_steps(folder: Path) -> list[dict[str, Any]]:
    """The measured 35B decoding steps a fork's cost is compared with: each store_all point of a committed real-
    engine sweep (``folder/points/*/summary.json``), its step = mean TPOT x mean acceptance length (tokens per
    verify step), at its mean running batch."""
    rows = []
    for f in sorted(folder.glob("points/*/summary.json")):
        d = json.loads(f.read_text())
        c, m = d["config"], d.get("metrics") or {}
        if d.get("status") != "ok" or c.get("strategy") != "store_all" or not c.get("draft"):
            continue
        if not m.get("tpot_mean") or not m.get("acceptance_length"):
            continue
        rows.append({"point": f.parent.name, "engine": (d.get("telemetry") or {}).get("engine", c["engine"]["name"]),
                     "device": (d.get("telemetry") or {}).get("device"),
                     "mean_running": float(d["telemetry"].get("mean_running") or 0.0),
                     "step_s": float(m["tpot_mean"]) * float(m["acceptance_length"]),
                     "draft": c["draft"]})
    if not rows:
        raise ValueError(f"forks.step_reference={folder}: no store_all point with a TPOT and an acceptance length "
                         "there; point it at a committed real-engine sweep (results/h200-vllm-sweep)")
    return rows


def attach_step(row: dict[str, Any], steps: list[dict[str, Any]], match: float = 1.5,
                device: str | None = None) -> dict[str, Any]:
    """Set ``row``'s reference step: the measured step whose mean running batch is nearest ``row['batch']``, if
    within a factor ``match`` of it (a step at another batch is another step: fork time grows with the batch) and,
    where both are known, measured on the same GPU as the row (``device``: an H100's forks against an H200's
    step would mix two machines); else None, and no fraction. Also the forks' time per node and request, every
    GDN layer (the write-up prices one fork: 6 us per 12 MB)."""
    B = row["batch"]
    near = [s for s in steps if s["mean_running"] and 1 / match <= s["mean_running"] / B <= match
            and (device is None or s.get("device") is None or s["device"] == device)]
    best = min(near, key=lambda s: abs(s["mean_running"] - B)) if near else None
    row.update(step_point=best and best["point"], step_s=best and best["step_s"],
               step_running=best and best["mean_running"],
               fork_fraction_of_step=best and row["fork_step_s"] / best["step_s"],
               fork_per_node_us=1e6 * row["fork_step_s"] / (B * row["nodes"]))
    return row


def _fork_row(tree: DraftTree, B: int, fork: str, shape: GDNShape, cfg: DictConfig, gen, device,
              tiles: dict[str, int]) -> dict[str, Any]:
    """store_all's verify in one fork order with and without its snapshot writes: the forks' own time."""
    from strategies import kernels

    sdt, idt = as_dtype(cfg.state_dtype), as_dtype(cfg.input_dtype)
    w, r = int(cfg.warmup), int(cfg.repeats)
    state, (q, k, v, g, beta) = inputs(gen, B, tree, shape, idt, sdt, device)
    times = {}
    for store in (True, False):
        strat = kernels.get("store_all", fork=fork, store=store, **tiles)
        carry = strat.commit(strat.start(state), strat.verify(strat.start(state), q, k, v, g, beta, tree),
                             torch.zeros(B, dtype=torch.long, device=device))      # in place from here on
        times[store] = gpu_seconds(lambda: strat.verify(carry, q, k, v, g, beta, tree), w, r)
        del carry
    snap = B * tree.num_nodes * shape.state_elems * dtype_bytes(sdt)
    fork_s = max(times[True] - times[False], 0.0)
    return {"draft": tree.label, "nodes": tree.num_nodes, "depths": len(tree.levels), "batch": B, "fork": fork,
            **tiles, "verify_s": times[True], "verify_nostore_s": times[False], "fork_s": fork_s,
            "snapshot_bytes": snap, "fork_bandwidth": snap / fork_s if fork_s else None,
            "fork_step_s": fork_s * shape.num_layers, "verify_step_s": times[True] * shape.num_layers}


def _selective_row(tree: DraftTree, B: int, shape: GDNShape, cfg: DictConfig, gen, device,
                   tiles: dict[str, int]) -> dict[str, Any]:
    """store_selective's verify and commit against store_all's on one draft and batch, with draft confidences and
    accepted nodes drawn together from the configured profile's measured steps."""
    from strategies import kernels

    sdt, idt = as_dtype(cfg.state_dtype), as_dtype(cfg.input_dtype)
    w, r = int(cfg.warmup), int(cfg.repeats)
    state, (q, k, v, g, beta) = inputs(gen, B, tree, shape, idt, sdt, device)
    opts = strategy_configs.of(cfg, "store_selective")
    profile = strategies.get("store_selective", confidences=opts.get("confidences"))._profile()
    conf, acc = profile.sample_steps(tree, B, gen)
    conf, acc = conf.to(device), acc.to(device)
    store = kernels.get("store_all", **tiles)
    sel = kernels.get("store_selective", threshold=float(opts.get("threshold", 0.95)), **tiles)
    row: dict[str, Any] = {"draft": tree.label, "nodes": tree.num_nodes, "batch": B, **tiles,
                           "threshold": sel.threshold, "profile": profile.path}
    zero = torch.zeros(B, dtype=torch.long, device=device)
    for name, strat, kw in (("store_all", store, {}), ("store_selective", sel, {"confidence": conf})):
        carry = strat.commit(strat.start(state), strat.verify(strat.start(state), q, k, v, g, beta, tree, **kw), zero)
        ver = strat.verify(carry, q, k, v, g, beta, tree, **kw)                   # in place from here on
        # the op as an engine launches it, its inputs checked once here: the public verify reads the confidences on
        # the host to check them, a sync that the CUDA graph the timing captures cannot hold
        s_ = check_step(strat._base(carry), q, k, v, g, beta, tree, same_dtype=not strat.mixed_dtypes)
        kw_ = {"confidence": check_confidence(conf, B, tree.num_nodes).to(device)} if kw else {}
        row[f"{name}_verify_s"] = gpu_seconds(
            lambda: strat._verify(carry, q, k, v, g, beta, tree, s_, s_.K ** -0.5, **kw_), w, r)
        if name == "store_all":
            row["store_all_commit_s"] = gpu_seconds(lambda: strat._commit(carry, ver, acc), w, r)
        else:
            plan = strat.recovery_args(ver, acc)      # host-side planning, as an engine's scheduler would do it
            row["store_selective_commit_s"] = gpu_seconds(lambda: strat.commit_with(ver, acc, *plan), w, r)
            keep = ver.stash["keep"]
            row["kept_fraction"] = float(keep.double().mean())
            row["recovery_fraction"] = float((plan[2] > 0).double().mean())
            row["redone_per_recovery"] = (float(plan[2].sum()) / max(int((plan[2] > 0).sum()), 1))
        del carry
    row["verify_ratio"] = row["store_selective_verify_s"] / row["store_all_verify_s"]
    row["step_ratio"] = ((row["store_selective_verify_s"] + row["store_selective_commit_s"])
                         / (row["store_all_verify_s"] + row["store_all_commit_s"]))
    return row


def _selective_section(result, shape, cfg, gen, device, console, out) -> None:
    """store_selective's kernels against store_all's on ``selective.drafts`` x ``selective.batches``."""
    sc = cfg.selective
    tiles = (result["tiles"] or _fixed_tiles(cfg))["store_all"]
    result.setdefault("selective", {"rows": []})
    have = {(r["draft"], r["batch"]) for r in result["selective"]["rows"]}
    for d in sc.drafts:
        tree = parse_draft(d, root=bool(cfg.root))
        for B in sc.batches:
            if (tree.label, int(B)) in have:
                continue
            row = _selective_row(tree, int(B), shape, cfg, gen, device, tiles)
            result["selective"]["rows"].append(row)
            console.print(f"    selective {tree.label} B={int(B):<3d} kept {100 * row['kept_fraction']:.0f}%: verify "
                          f"{1e6 * row['store_selective_verify_s']:.1f} us vs store_all "
                          f"{1e6 * row['store_all_verify_s']:.1f} us; commit "
                          f"{1e6 * row['store_selective_commit_s']:.1f} us ({100 * row['recovery_fraction']:.0f}% "
                          f"recover {row['redone_per_recovery']:.1f} nodes) vs {1e6 * row['store_all_commit_s']:.1f} us")
            _save(out, result)


def _forks_section(result, shape, cfg, gen, device, console, out) -> None:
    """store_all's verify node by node against depth by depth on the trees of ``forks.drafts``, and the forks'
    marginal time per step (verify minus the same kernel without its snapshot writes, x GDN layers) against the
    measured 35B step at the same batch (:func:`attach_step`) of ``forks.step_reference``; each (draft, batch,
    order) saved as it is done."""
    fc = cfg.forks
    folder = Path(str(fc.step_reference))
    ref = campaign_steps(folder if folder.is_absolute() else Path(__file__).resolve().parents[2] / folder)
    result.setdefault("forks", {"rows": [], "step_reference": {"folder": str(fc.step_reference), "steps": ref}})
    result["forks"]["step_reference"] = {"folder": str(fc.step_reference), "steps": ref}
    tiles = (result["tiles"] or _fixed_tiles(cfg))["store_all"]
    have = {(r["draft"], r["batch"], r["fork"]) for r in result["forks"]["rows"]}
    for d in fc.drafts:
        tree = parse_draft(d, root=bool(cfg.root))
        for B in fc.batches:
            for fork in ("node", "depth"):
                if (tree.label, int(B), fork) in have:
                    continue
                try:
                    row = _fork_row(tree, int(B), fork, shape, cfg, gen, device, tiles)
                except torch.cuda.OutOfMemoryError as e:
                    reason = f"out of GPU memory: {str(e).splitlines()[0]}"
                    result["failed"].append({"strategy": f"store_all fork={fork}", "draft": tree.label,
                                             "batch": int(B), "reason": reason})
                    torch.cuda.empty_cache()
                    continue
                attach_step(row, ref, device=result.get("device"))
                result["forks"]["rows"].append(row)
                share = ("no measured step at this batch on this GPU" if row["step_s"] is None else
                         f"{100 * row['fork_fraction_of_step']:.2f}% of a {1e3 * row['step_s']:.1f} ms step")
                console.print(f"    forks {tree.label} B={int(B):<3d} {fork:5s} verify {1e6 * row['verify_s']:9.1f} us,"
                              f" without snapshots {1e6 * row['verify_nostore_s']:9.1f} us: forks "
                              f"{1e3 * row['fork_step_s']:.3f} ms per step, {share}")
                _save(out, result)


def _solve_section(result, shape, cfg, gen, device, console, out) -> None:
    """The triangular solve against the draft's node count N (``cfg.solve_nodes``), each N saved as it is done
    (a resumed run skips those it has)."""
    have = {r["nodes"] for r in result["solve"]}
    for N in cfg.solve_nodes:
        if int(N) not in have:
            result["solve"].append(_solve_row(int(N), shape, cfg, gen, device, result["tiles"] or _fixed_tiles(cfg)))
            _save(out, result)
            console.print(f"  solve vs N: N={N} done")


def _fixed_tiles(cfg: DictConfig) -> dict[str, dict[str, int]]:
    fixed = {"block_v": int(cfg.block_v), "num_warps": int(cfg.num_warps)}
    return {n: fixed for n in STRATEGY_ROWS}


def _kernel_section(result, done, shape, cfg, gen, device, copy_bw, console, out) -> None:
    """Each strategy's Triton kernels per draft shape and batch (K-major states, the contract's layout)."""
    if not result["tiles"]:
        result["tiles"] = tune(shape, cfg, gen, device, console) if cfg.tune else _fixed_tiles(cfg)
        _save(out, result)
    jobs = [(parse_draft(d, root=bool(cfg.root)), int(B)) for d in cfg.drafts for B in cfg.batches]
    started = time.perf_counter()
    for i, (tree, B) in enumerate(jobs, 1):
        console.print(f"  [{i}/{len(jobs)}] {tree.label} (N={tree.num_nodes}) batch {B} "
                      f"(elapsed {time.perf_counter() - started:.0f} s)")
        for name in STRATEGY_ROWS:
            if not _runs(cfg, name, tree):
                continue
            if (name, tree.label, B) in done:
                continue
            try:
                row = measure(name, tree, B, shape, cfg, gen, device, result["tiles"][name])
            except torch.cuda.OutOfMemoryError as e:   # a shape too big for this GPU: record it, go on
                reason = f"out of GPU memory: {str(e).splitlines()[0]}"
                result["failed"].append({"strategy": name, "draft": tree.label, "batch": B, "reason": reason})
                console.print(f"    {name:9s} skipped ({reason})")
                torch.cuda.empty_cache()
                continue
            for part in ("verify", "commit"):
                row[f"{part}_bandwidth"] = row[f"{part}_bytes"] / row[f"{part}_s"] if row[f"{part}_s"] else None
                row[f"{part}_fraction_of_copy"] = (row[f"{part}_bandwidth"] or 0) / copy_bw
            row["step_s_model"] = row["step_s"] * shape.num_layers
            result["rows"].append(row)
            console.print(f"    {name:9s} verify {1e6 * row['verify_s']:9.1f} us "
                          f"({100 * row['verify_fraction_of_copy']:3.0f}% of copy), commit "
                          f"{1e6 * row['commit_s']:8.1f} us ({100 * row['commit_fraction_of_copy']:3.0f}%)")
        _save(out, result)   # a run cut short keeps what it measured; rerun the same command to resume


def _layer_section(result, shape, cfg, gen, device, copy_bw, console, out) -> None:
    """vLLM's own store_all kernel and each strategy's op as the plugin runs it, per chain and batch
    (:mod:`.layer`); each row's time relative to vLLM's at the same chain and batch. With
    ``layer.tune``, each strategy's op first gets its fastest value tile and warps (CUDA-graph time at
    the largest batch, ``layer.tune_chain``), and a ``no_commit`` variant row times the op without its
    commit there."""
    from . import layer as L

    kernel, where = L.vllm_kernel()
    result["layer"]["vllm_kernel"] = where
    if kernel is None:
        console.print(f"  [yellow]vLLM's kernel is not importable here[/] ({where['missing']}); "
                      "the layer rows run without their baseline")
    lc = cfg.layer
    tiles = result["layer"].setdefault("tiles", {})
    if lc.tune and torch.cuda.is_available() and not tiles:
        B, k = max(int(b) for b in lc.batches), int(lc.tune_chain)
        acc = sample_accepted(gen, DraftTree.chain(k, root=True), B, float(cfg.accept_rate))
        tried = result["layer"].setdefault("tuning", [])
        for name in lc.strategies:
            best = None
            for algo, bv, nw in lc.tune_candidates:
                t = {"algo": str(algo), "block_v": int(bv), "num_warps": int(nw)}
                try:
                    row = L.measure_layer(name, k, B, shape, cfg, gen, device, kernel, acc, tiles=t)
                except Exception as e:  # a candidate this Triton cannot build or run: say so, try the next
                    tried.append({"strategy": name, **t, "error": f"{type(e).__name__}: {str(e)[:300]}"})
                    console.print(f"  [yellow]layer op {name} {t}: {type(e).__name__}[/] (skipped)")
                    continue
                tried.append(row)
                if row["graph_s"] is not None and (best is None or row["graph_s"] < best[1]):
                    best = (t, row["graph_s"])
            if best is not None:
                tiles[name] = best[0]
                console.print(f"  layer op for {name}: {best[0]['algo']}, block_v={best[0]['block_v']} "
                              f"num_warps={best[0]['num_warps']} ({1e6 * best[1]:.1f} us at chain:{k}, batch {B})")
        _save(out, result)
    names = (["vllm_store_all"] if kernel is not None else []) + list(lc.strategies)
    have = {(r["strategy"], r["draft"], r["batch"], r.get("variant")) for r in result["layer"]["rows"]}
    jobs = [(int(k), int(B), name, None) for k in lc.chains for B in lc.batches for name in names]
    if lc.tune:
        jobs += [(int(lc.tune_chain), max(int(b) for b in lc.batches), name, "no_commit") for name in lc.strategies]
    accepted_for: dict[tuple[int, int], torch.Tensor] = {}
    for k, B, name, variant in jobs:
        tree = DraftTree.chain(k, root=True)
        if (name, tree.label, B, variant) in have:
            continue
        if not _runs(cfg, name, tree):                            # a deferred ring one step would overflow
            continue
        if (k, B) not in accepted_for:   # every op of a (chain, batch) sees the same accepted counts
            accepted_for[(k, B)] = sample_accepted(gen, tree, B, float(cfg.accept_rate))
        try:
            row = L.measure_layer(name, k, B, shape, cfg, gen, device, kernel, accepted_for[(k, B)],
                                  tiles=tiles.get(name), variant=variant or "")
        except torch.cuda.OutOfMemoryError as e:
            reason = f"out of GPU memory: {str(e).splitlines()[0]}"
            result["failed"].append({"strategy": f"layer:{name}", "draft": tree.label, "batch": B, "reason": reason})
            torch.cuda.empty_cache()
            continue
        t = row["graph_s"] if row["graph_s"] is not None else row["eager_s"]
        row["fraction_of_copy"] = row["bytes"] / t / copy_bw
        base = next((r for r in [*result["layer"]["rows"], row] if r["strategy"] == "vllm_store_all"
                     and r["draft"] == tree.label and r["batch"] == B), None)
        if base is not None:
            row["eager_vs_vllm"] = row["eager_s"] / base["eager_s"]
            row["graph_vs_vllm"] = (row["graph_s"] / base["graph_s"]
                                    if row["graph_s"] is not None and base["graph_s"] else None)
        result["layer"]["rows"].append(row)
        g = f"{1e6 * row['graph_s']:8.1f}" if row["graph_s"] is not None else "       -"
        label = name + (f":{variant}" if variant else "")
        console.print(f"    layer {tree.label} B={B:<3d} {label:18s} eager {1e6 * row['eager_s']:8.1f} us"
                      f"  graph {g} us  {row['states_moved']:.2f} states  "
                      f"{100 * row['fraction_of_copy']:3.0f}% of copy")
        _save(out, result)

def _save(out: Path | None, result: dict[str, Any]) -> None:
    if out is None:
        return
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(result, indent=2))
    tmp.replace(out)


def _resume(out: Path | None, result: dict[str, Any], console) -> set[tuple[str, str, int]]:
    """Rows of an unfinished run of the same benchmark at ``out`` (same device, shapes and settings)."""
    if out is None or not out.is_file():
        return set()
    try:
        old = json.loads(out.read_text())
    except ValueError:
        return set()
    same = ("device", "shape", "num_layers")
    keys = ("state_dtype", "input_dtype", "block_v", "num_warps", "strategies", "root", "repeats", "smoke", "solve",
            "tune", "tune_block_v", "tune_num_warps", "tune_draft", "accept_rate", "layer", "forks", "selective")
    if old.get("complete") or any(old.get(k) != result[k] for k in same) \
            or any(old.get("config", {}).get(k) != result["config"][k] for k in keys):
        return set()
    result["rows"], result["solve"], result["tiles"] = old.get("rows", []), old.get("solve", []), old.get("tiles", {})
    result["layer"].update({k: old.get("layer", {}).get(k) for k in ("rows", "tiles", "tuning")
                            if old.get("layer", {}).get(k) is not None})
    for part in ("forks", "selective"):
        if (old.get(part) or {}).get("rows"):
            result[part] = old[part]
    console.print(f"  resuming {out}: {len(result['rows'])} rows, {len(result['layer']['rows'])} layer rows, "
                  f"{len(result['solve'])} solve points and {len(result['forks']['rows'])} fork rows kept")
    return {(r["strategy"], r["draft"], r["batch"]) for r in result["rows"]}


def _triton_version() -> str:
    import triton

    return triton.__version__


def print_tables(console, result: dict[str, Any]) -> None:
    from ..console import table as make_table

    L = result["num_layers"]
    layer = result.get("layer", {}).get("rows", [])
    if layer:
        t = make_table(f"one layer's speculative branch as vLLM runs it ({result['device']}); x = time / vLLM's "
                       "store_all kernel at the same chain and batch (graph replays where the op can be captured)",
                       ["draft", "batch", "op", "eager us", "graph us", "x vLLM (eager)", "x vLLM (graph)",
                        "states moved", "% of copy"], left=3)
        for r in layer:
            op = r["strategy"] + (f":{r['variant']}" if r.get("variant") else "")
            t.add_row(f"{r['draft']} (N={r['nodes']})", str(r["batch"]), op, f"{1e6 * r['eager_s']:.1f}",
                      "-" if r["graph_s"] is None else f"{1e6 * r['graph_s']:.1f}",
                      "-" if r.get("eager_vs_vllm") is None else f"{r['eager_vs_vllm']:.2f}",
                      "-" if r.get("graph_vs_vllm") is None else f"{r['graph_vs_vllm']:.2f}",
                      f"{r['states_moved']:.2f}", f"{100 * r['fraction_of_copy']:.0f}")
        console.print(t)
        lt = result["layer"].get("tiles") or {}
        regs = {r["strategy"]: r.get("kernels", {}).get("paged_step") for r in layer if r.get("kernels")}
        if lt or regs:
            console.print("layer op tiles (value columns / warps) and the step kernel's registers / spilled bytes: "
                          + ", ".join(f"{n} {lt.get(n, {}).get('block_v', '-')}/{lt.get(n, {}).get('num_warps', '-')}"
                                      f" {(regs.get(n) or {}).get('registers')}/{(regs.get(n) or {}).get('spills')}"
                                      for n in sorted(set(lt) | set(regs))))
    if result["rows"]:
        t = make_table(f"per layer and step ({result['device']}); whole model = x {L} GDN layers; "
                       f"% = achieved / copy bandwidth ({result['copy_bandwidth'] / 1e9:,.0f} GB/s)",
                       ["draft", "batch", "strategy", "verify us", "commit us", "step us", f"x{L} ms",
                        "states moved", "verify %", "commit %", "spec. MiB/req"], left=3)
        for r in result["rows"]:
            t.add_row(f"{r['draft']} (N={r['nodes']})", str(r["batch"]), r["strategy"],
                      f"{1e6 * r['verify_s']:.1f}", f"{1e6 * r['commit_s']:.1f}", f"{1e6 * r['step_s']:.1f}",
                      f"{1e3 * r['step_s_model']:.2f}", f"{r['states_moved']:.2f}",
                      f"{100 * r['verify_fraction_of_copy']:.0f}", f"{100 * r['commit_fraction_of_copy']:.0f}",
                      f"{r['speculative_bytes_per_request'] / 2 ** 20:.1f}")
        console.print(t)
    if result.get("tiles"):
        console.print("tiles (value columns per program, warps): " + ", ".join(
            f"{n} {t['block_v']}/{t['num_warps']}" for n, t in result["tiles"].items()))
    if result["solve"]:
        s = make_table(f"TreeWY's triangular solve vs N (chains, batch {result['solve'][0]['batch']}, one layer)",
                       ["N", "treewy verify us", "without solve us", "solve us", "store_all verify us"], left=1)
        for r in result["solve"]:
            s.add_row(str(r["nodes"]), f"{1e6 * r['treewy_verify_s']:.1f}",
                      f"{1e6 * r['treewy_verify_nosolve_s']:.1f}",
                      f"{1e6 * r['solve_s']:.1f}", f"{1e6 * r['store_all_verify_s']:.1f}")
        console.print(s)
        n = result["crossover_nodes"]
        console.print(f"TreeWY's verify costs more than store_all's from N = {n}" if n else
                      "TreeWY's verify stays cheaper than store_all's at every N measured")
    forks = (result.get("forks") or {}).get("rows") or []
    if forks:
        t = make_table(f"store_all's forks: node by node vs depth by depth ({result['device']}, one layer); forks = "
                       f"verify - verify without snapshot writes (their marginal cost); per step = x {L} GDN layers, "
                       "against the measured 35B store_all step at the same batch (within 1.5x)",
                       ["draft", "batch", "fork", "verify us", "no-snapshot us", "forks us", "GB/s", "forks/step ms",
                        "us/fork", "step ms", "% of step"], left=3)
        for r in forks:
            t.add_row(f"{r['draft']} (N={r['nodes']})", str(r["batch"]), r["fork"], f"{1e6 * r['verify_s']:.1f}",
                      f"{1e6 * r['verify_nostore_s']:.1f}", f"{1e6 * r['fork_s']:.1f}",
                      "-" if not r["fork_bandwidth"] else f"{r['fork_bandwidth'] / 1e9:,.0f}",
                      f"{1e3 * r['fork_step_s']:.2f}", f"{r['fork_per_node_us']:.1f}",
                      "-" if r["step_s"] is None else f"{1e3 * r['step_s']:.1f} (B~{r['step_running']:.0f})",
                      "-" if r["step_s"] is None else f"{100 * r['fork_fraction_of_step']:.1f}")
        console.print(t)
    sel = (result.get("selective") or {}).get("rows") or []
    if sel:
        t = make_table(f"store_selective's kernels vs store_all's ({result['device']}, one layer; confidences and "
                       "accepted nodes from the measured profile)", ["draft", "batch", "kept %", "verify us",
                                                                     "store_all us", "commit us", "store_all us",
                                                                     "recoveries %", "redone", "step x"], left=2)
        for r in sel:
            t.add_row(f"{r['draft']} (N={r['nodes']})", str(r["batch"]), f"{100 * r['kept_fraction']:.0f}",
                      f"{1e6 * r['store_selective_verify_s']:.1f}", f"{1e6 * r['store_all_verify_s']:.1f}",
                      f"{1e6 * r['store_selective_commit_s']:.1f}", f"{1e6 * r['store_all_commit_s']:.1f}",
                      f"{100 * r['recovery_fraction']:.0f}", f"{r['redone_per_recovery']:.2f}",
                      f"{r['step_ratio']:.2f}")
        console.print(t)
    for f in result.get("failed", []):
        console.print(f"[red]not measured[/]: {f['strategy']} {f['draft']} batch {f['batch']}: {f['reason']} "
                      "(rerun the same command to retry)")
