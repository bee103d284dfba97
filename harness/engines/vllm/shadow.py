"""The shadow check's summary: how far each strategy's op is from vLLM's own store_all kernel on the very
same inputs, over every GDN layer and speculative step of one run.

``python -m harness.engines.vllm.shadow PROBE.pt OUT.json`` reads the probe a ``--strategy store_all
--shadow treewy,replay,treewy_deferred --probe-dir DIR`` run of :mod:`.offline` saved
(``DIR/probe-<pid>.pt``) and writes the per-strategy and per-layer worst errors, with the code that ran
each shadow (Triton op or torch reference). Errors are ``max |x - vLLM| / max |vLLM|`` of the committed
state (float32 pages) and of the layer's outputs (vLLM's are bf16).
"""

from __future__ import annotations

import json
import math
import statistics
import sys
from pathlib import Path
from typing import Any

WHAT = ("at every GDN layer and speculative step of vLLM's own store_all run, each strategy ran on the same "
        "inputs in pages of its own; errors are max|x - vLLM| / max|vLLM| of the committed state (fp32) and "
        "the outputs (vLLM's are bf16)")


def summarize(probe: dict[str, Any]) -> dict[str, Any]:
    """``probe``: what the plugin's probe saved (``comparisons``: one dict per layer, step and shadow)."""
    comps = probe.get("comparisons") or []
    if not comps:
        raise ValueError("the probe holds no shadow comparisons: run the offline engine with --strategy store_all "
                         "--shadow STRATEGIES --probe-dir DIR (and speculative decoding on)")
    bad = [c for c in comps if not (math.isfinite(c["state_rel_err"]) and math.isfinite(c["out_rel_err"]))]
    if bad:   # max() would quietly skip a NaN that is not first
        c = bad[0]
        raise ValueError(f"{len(bad)} comparisons are not finite (first: {c['shadow']} at {c['layer']} step "
                         f"{c['step']}: state {c['state_rel_err']}, outputs {c['out_rel_err']}): the shadow diverged")
    per_strategy: dict[str, Any] = {}
    per_layer: list[dict[str, Any]] = []
    for shadow in sorted({c["shadow"] for c in comps}):
        mine = [c for c in comps if c["shadow"] == shadow]
        st, out = [c["state_rel_err"] for c in mine], [c["out_rel_err"] for c in mine]
        per_strategy[shadow] = {"layer_steps": len(mine), "code": (probe.get("shadow_code") or {}).get(shadow),
                                "state_rel_err_max": max(st), "state_rel_err_median": statistics.median(st),
                                "out_rel_err_max": max(out), "out_rel_err_median": statistics.median(out)}
        for layer in sorted({c["layer"] for c in mine}):
            rows = [c for c in mine if c["layer"] == layer]
            per_layer.append({"strategy": shadow, "layer": layer, "steps": len(rows),
                              "state_rel_err_max": max(c["state_rel_err"] for c in rows),
                              "out_rel_err_max": max(c["out_rel_err"] for c in rows)})
    return {"what": WHAT, "layer_steps": len({(c["layer"], c["step"]) for c in comps}),
            "per_strategy": per_strategy, "per_layer": per_layer}


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m harness.engines.vllm.shadow PROBE.pt OUT.json", file=sys.stderr)
        return 2
    import torch

    probe = torch.load(args[0], weights_only=False)
    summary = summarize(probe)
    Path(args[1]).write_text(json.dumps(summary, indent=2))
    for name, s in summary["per_strategy"].items():
        print(f"{name}: {s['layer_steps']} layer-steps ({s['code']}): committed state <= {s['state_rel_err_max']:.1e}, "
              f"outputs <= {s['out_rel_err_max']:.1e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
