"""Host time of one call of the strategies' op on the GPU, by launch path (issue 16, step 1 of the device README).

In vLLM's mixed prefill-decode steps the GDN layers run eagerly and the host paces the step; the layer clock
(`../e2e/layer-clock-gmu0.9/`) put the op's two launches at 0.27 ms of host time per layer against 0.13 ms for
vLLM's one kernel. This times, on one GDN layer of the 35B-A3B shape (H=16, HV=32, K=V=128, MTP k=3, fp32
V-major pages as vLLM lays them out), the host's time per call of:

- ``op direct`` / ``op jit``: :meth:`strategies.paged.PagedCommit.step` with ``launch="direct"`` (Triton's entry
  point once per specialisation, then the compiled kernels' launchers) and ``launch="jit"`` (the entry point
  every call); ``... + commit rows``: a mixed step's call, 8 rows leaving the speculative path;
- ``vllm kernel``: vLLM's ``fused_sigmoid_gating_delta_rule_update`` as its spec branch calls it (when vLLM
  imports; its Python wrapper included);
- ``torch add_``: one small torch launch, the host's yardstick.

Each is called ``--calls`` times back to back, timed per call on the host clock (``time.perf_counter_ns``),
after warm-up; the device is synchronised between blocks of 25 calls so that its queue never fills (a full
queue would make the host wait and count device time). Prints a table and writes ``--out`` (JSON).

    PYTHONPATH=/tmp/cbsite:$PWD python3 results/h200-kernel-speed/device/launch_cost.py --out $OUT/launch.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch


def _timed(fn, calls: int, block: int = 25) -> dict[str, float]:
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    ns = []
    for start in range(0, calls, block):
        for _ in range(min(block, calls - start)):
            t0 = time.perf_counter_ns()
            fn()
            ns.append(time.perf_counter_ns() - t0)
        torch.cuda.synchronize()
    us = sorted(x / 1e3 for x in ns)
    return {"median_us": statistics.median(us), "p10_us": us[len(us) // 10], "p90_us": us[9 * len(us) // 10],
            "calls": len(us)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, default=128, help="speculative rows per call (default 128)")
    ap.add_argument("--calls", type=int, default=400, help="timed calls per variant (default 400)")
    ap.add_argument("--strategy", default="treewy")
    ap.add_argument("--out", default=None, help="JSON file for the results")
    args = ap.parse_args()

    from harness.bench.layer import make_pages
    from strategies import GDNShape
    from strategies.paged import PagedCommit, StashLayout

    dev = torch.device("cuda")
    H, HV, K, V, k = 16, 32, 128, 128, 3
    R, N = args.batch, k + 1
    lay = StashLayout(args.strategy, H, HV, K, V, k, 16)
    _, pool, stash, header = make_pages(2 * R + 20, GDNShape(1, H, HV, K, V), k, lay, dev)
    header.zero_()
    gen = torch.Generator(device=dev).manual_seed(0)
    T = R * N
    q, kk = (torch.randn(T, H, K, generator=gen, device=dev).bfloat16() for _ in range(2))
    v = torch.randn(T, HV, V, generator=gen, device=dev).bfloat16()
    a, b = (torch.randn(T, HV, generator=gen, device=dev).bfloat16() for _ in range(2))
    A_log = torch.log(1 + 15 * torch.rand(HV, generator=gen, device=dev))
    dt_bias = torch.randn(HV, generator=gen, device=dev).bfloat16()
    idx = torch.arange(1, R + 1, dtype=torch.int32, device=dev)[:, None].expand(R, N).contiguous()
    acc = torch.full((R,), 2, dtype=torch.int32, device=dev)
    cu = torch.arange(0, T + 1, N, dtype=torch.int32, device=dev)
    cidx = torch.arange(R + 1, R + 9, dtype=torch.int32, device=dev)
    cacc = torch.full((8,), 2, dtype=torch.int32, device=dev)
    out = torch.empty(T, HV, V, dtype=torch.bfloat16, device=dev)

    rows: dict[str, dict] = {}
    for launch in ("jit", "direct"):
        op = PagedCommit(lay, "triton", launch=launch)
        rows[f"op {launch}"] = _timed(lambda: op.step(pool, stash, header, q, kk, v, a, b, A_log, dt_bias, idx, acc,
                                                      cu, out=out), args.calls)
        rows[f"op {launch} + commit rows"] = _timed(
            lambda: op.step(pool, stash, header, q, kk, v, a, b, A_log, dt_bias, idx, acc, cu, out=out,
                            commit_indices=cidx, commit_accepted=cacc), args.calls)
        algo = op.algo
    try:
        from vllm.third_party.flash_linear_attention.ops.fused_sigmoid_gating import (
            fused_sigmoid_gating_delta_rule_update)
    except Exception as e:      # no vLLM on this host (the first chunk calls): say so, time the rest
        rows["vllm kernel"] = {"skipped": f"{type(e).__name__}: {e}"[:200]}
    else:
        ssm = torch.zeros(2 * R + 20, HV, V, K, device=dev)
        rows["vllm kernel"] = _timed(lambda: fused_sigmoid_gating_delta_rule_update(
            A_log=A_log, a=a, b=b, dt_bias=dt_bias, q=q[None], k=kk[None], v=v[None], initial_state=ssm,
            inplace_final_state=True, cu_seqlens=cu, ssm_state_indices=idx, num_accepted_tokens=acc,
            use_qk_l2norm_in_kernel=True), args.calls)
    x = torch.zeros(16, device=dev)
    rows["torch add_"] = _timed(lambda: x.add_(1), args.calls)

    import triton

    info = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
            "strategy": args.strategy, "algo": algo, "batch": R, "k": k, "shape": [H, HV, K, V], "rows": rows}
    for name, r in rows.items():
        print(f"{name:28s} " + (f"{r['median_us']:8.1f} us  (p10 {r['p10_us']:.1f}, p90 {r['p90_us']:.1f})"
                                if "median_us" in r else r["skipped"]))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(info, f, indent=1)


if __name__ == "__main__":
    main()
