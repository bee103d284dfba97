"""One MoE layer of the 35B-A3B shape as vLLM 0.26 runs it (``fused_experts``, Triton), timed per token count.

Why: the e2e campaign's engine step grows almost in proportion to the batch (ITL 37.6 ms at 41 running, 81.8 ms at
100, store_all and treewy at gmu 0.6 in one call), and vLLM logs "Using default MoE config. Performance might be
sub-optimal!" for E=256, N=512 on the H200: it ships tuned tiles for that shape on the H100 (same SMs) but not on
the H200. This measures how much of a step the MoE layers take at the token counts the campaign's steps carry, with
vLLM's default tiles and with the H100's tuned ones (the user's fix: ``VLLM_TUNED_CONFIG_FOLDER``).

  python3 results/h200-kernel-speed/device/moe_probe.py OUT.json [--tokens 95,164,400,544]

Shapes: x [M, 2048] bf16, w1 [256, 1024, 2048] (gate and up, N=512 each), w2 [256, 2048, 512], top-8 routing from
random logits (dummy weights route about uniformly too). Timing: median of 50 CUDA-event timings after 10 warm-up
calls, one process per tile choice (vLLM caches its config lookup); us per layer. Bytes: the expert weights the
layer reads (every expert a token routes to, at least once), and what that is at the measured time in TB/s.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

E, N, K, TOPK = 256, 512, 2048, 8


def measure(tokens: list[int]) -> list[dict]:
    import torch
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.model_executor.layers.fused_moe import fused_experts

    torch.manual_seed(0)
    dev, dt = "cuda", torch.bfloat16
    w1 = torch.randn(E, 2 * N, K, device=dev, dtype=dt) * 0.02
    w2 = torch.randn(E, K, N, device=dev, dtype=dt) * 0.02
    rows = []
    with set_current_vllm_config(VllmConfig()):
        for m in tokens:
            x = torch.randn(m, K, device=dev, dtype=dt)
            weights, ids = torch.topk(torch.softmax(torch.randn(m, E, device=dev), -1), TOPK)
            ids = ids.to(torch.int32)
            for _ in range(10):
                fused_experts(x, w1, w2, weights, ids)
            times = []
            for _ in range(50):
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                fused_experts(x, w1, w2, weights, ids)
                b.record()
                b.synchronize()
                times.append(a.elapsed_time(b) * 1e3)
            times.sort()
            us = times[len(times) // 2]
            experts = int(torch.unique(ids).numel())
            weight_bytes = experts * (2 * N * K + K * N) * 2
            rows.append({"tokens": m, "us": round(us, 1), "experts_hit": experts,
                         "weight_bytes": weight_bytes, "weight_tb_s": round(weight_bytes / (us * 1e-6) / 1e12, 2)})
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("--tokens", default="1,16,95,164,170,400,512,544,1024")
    ap.add_argument("--child", choices=["default", "h100"], help=argparse.SUPPRESS)
    a = ap.parse_args()
    tokens = [int(t) for t in a.tokens.split(",")]
    if a.child:                                  # out: where the parent reads this child's rows
        Path(a.out).write_text(json.dumps(measure(tokens)))
        return 0
    import vllm
    import torch

    configs = Path(vllm.__file__).parent / "model_executor/layers/fused_moe/configs"
    h100 = configs / f"E={E},N={N},device_name=NVIDIA_H100_80GB_HBM3.json"
    result = {"shape": {"E": E, "N": N, "K": K, "topk": TOPK, "dtype": "bfloat16"},
              "device": torch.cuda.get_device_name(), "vllm": vllm.__version__, "torch": torch.__version__,
              "git_commit": os.environ.get("COMMITBENCH_GIT_COMMIT"), "tiles": {}}
    with tempfile.TemporaryDirectory() as tuned:
        # vLLM names the H200's file NVIDIA_H200 (get_config_file_name): the H100's tiles under that name
        (Path(tuned) / f"E={E},N={N},device_name=NVIDIA_H200.json").write_text(h100.read_text())
        for name, extra in (("default", {}), ("h100", {"VLLM_TUNED_CONFIG_FOLDER": tuned})):
            rows = Path(tuned) / f"{name}.json"
            cmd = [sys.executable, __file__, str(rows), "--tokens", a.tokens, "--child", name]
            # vLLM logs to stdout unless told otherwise: its line saying which tiles it took is the evidence
            env = {**os.environ, "VLLM_LOGGING_STREAM": "ext://sys.stderr", **extra}
            try:
                p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
            except subprocess.TimeoutExpired:
                result["tiles"][name] = "no result: the run passed 300 s (cold Triton compiles?)"
                break
            if p.returncode or not rows.exists():
                result["tiles"][name] = f"failed (rc {p.returncode}): {p.stderr[-2000:]}"
                break
            result["tiles"][name] = json.loads(rows.read_text())
            result["tiles"][name + "_log"] = [ln for ln in p.stderr.splitlines()
                                              if "MoE config" in ln or "MoE layer" in ln][:2]
        used = " ".join(result["tiles"].get("h100_log") or [])
        if isinstance(result["tiles"].get("h100"), list) and tuned not in used:
            result["tiles"]["h100"] = f"not the H100 tiles: vLLM's log does not name {tuned} ({used or 'no line'})"
    Path(a.out).write_text(json.dumps(result, indent=1))        # whatever was measured, failures named
    default, h100 = result["tiles"].get("default"), result["tiles"].get("h100")
    if not (isinstance(default, list) and isinstance(h100, list)):
        print(f"default tiles: {default if not isinstance(default, list) else 'ok'}; "
              f"H100 tiles: {h100 if not isinstance(h100, list) else 'ok'}", file=sys.stderr)
        return 1
    for d, h in zip(default, h100):
        print(f"M={d['tokens']:5d}  default {d['us']:8.1f} us ({d['weight_tb_s']} TB/s)   "
              f"H100 tiles {h['us']:8.1f} us ({h['weight_tb_s']} TB/s)   experts hit {d['experts_hit']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
