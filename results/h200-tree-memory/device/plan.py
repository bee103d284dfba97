"""Writes ../plan.json (the H200's) and ../plan-h100.json: the startups of the tree-memory table (issue 19), in the
order they run.

    .venv/bin/python results/h200-tree-memory/device/plan.py

The paper's two ends come first (k = 3, its MTP chain; k = 39, the draft count of its (3,3,3) tree), at both
gmu, so a short session brings back the comparison that matters; then k = 1, 7, 15; then no speculation.
"""

import json
from pathlib import Path

import yaml

from harness.engines.acceptance_rates import rates_for
from strategies import DraftTree

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
STRATEGIES = ("store_all", "treewy")


def write(gmus: tuple[float, ...], gpu: str, path: Path, note: str) -> None:
    table = yaml.safe_load((ROOT / "conf" / "acceptance" / "synthetic.yaml").read_text())
    order = [(g, k, s) for g in gmus for k in (3, 39) for s in STRATEGIES]
    order += [(g, k, s) for g in gmus for k in (1, 7, 15) for s in STRATEGIES]
    runs = []
    for gmu, k, strategy in order:
        rates = rates_for(DraftTree.from_widths([1] * k, root=True), table)
        runs.append({"name": f"start-{gmu}-{strategy}-k{k}", "strategy": strategy, "gmu": gmu, "num_spec": k,
                     "acceptance_rates": [round(float(r), 6) for r in rates]})
    runs += [{"name": f"start-{gmu}-nospec", "strategy": "store_all", "gmu": gmu, "num_spec": 0,
              "acceptance_rates": []} for gmu in gmus]
    plan = {
        "gpu": gpu,
        "comment": f"Issue 19, tree memory in a real engine: vLLM 0.26.0 on one {gpu.upper()} starts the "
                   "Qwen3.5-35B-A3B shape (dummy weights, eager) with an MTP chain of k drafts under store_all and "
                   f"treewy at gmu {' and '.join(map(str, gmus))} and stops once its KV plan is made "
                   f"(skip_generate). {note}vLLM 0.26 has no tree attention; a chain of k drafts holds the GDN state pages a draft tree of k nodes does under "
                   "store_all (k = 39: the paper's (3,3,3) tree). Synthetic acceptance rates from "
                   "conf/acceptance/synthetic.yaml (they set nothing about memory). Written by device/plan.py.",
        "env": {"VLLM_USE_FLASHINFER_SAMPLER": "0"},
        "defaults": {"model": "qwen35_35b", "max_model_len": 4096, "max_num_seqs": 256,
                     "max_num_batched_tokens": 8192, "eager": True, "load_format": "dummy", "seed": 0,
                     "skip_generate": True, "prompt_len": 1024, "output_len": 256},
        "runs": runs,
    }
    path.write_text(json.dumps(plan, indent=1) + "\n")
    print(f"{len(runs)} runs -> {path}")


def main() -> None:
    write((0.6, 0.9), "h200", HERE.parent / "plan.json", "")
    # Where no H200 is lent: the same startups on an H100 (80 GB), whose gmu 0.9 leaves the 35B's 65 GiB of weights
    # a few GiB of pool. Pages and blocks per request are the model's, the same on any GPU; the pool is the H100's.
    note = ("On an H100 the 35B's weights leave a few GiB of pool at gmu 0.9 (gmu 0.6 cannot hold them); pages and "
            "blocks per request are the model's on any GPU, the pool and concurrency the H100's. ")
    write((0.9,), "h100", HERE.parent / "plan-h100.json", note)
    write((0.95,), "h100", HERE.parent / "plan-h100-gmu0.95.json", note)


if __name__ == "__main__":
    main()
