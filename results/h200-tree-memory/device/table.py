"""The tree-memory table: what vLLM planned at each startup of ../plan.json, beside the simulator's prediction and
the TreeWY paper's figures.

    .venv/bin/python results/h200-tree-memory/device/table.py results/h200-tree-memory/runs [--out DIR]
        [--plan plan-h100.json]

Reads every ``<name>.json`` (harness.engines.vllm.offline's record: vLLM's own KV plan from its scheduler) and
``summary.json`` (the runner's: a startup that failed has its error there, which is the result for that row).
Writes ``table.md`` and ``table.json`` in ``--out`` (default: the runs folder's parent).

Columns: GDN state pages per request and GDN layer group (vLLM's ``1 + num_speculative_blocks``; the paper's
"store_all blocks 4 -> 40"), blocks per 4096-token request as vLLM counts them (attention blocks + every GDN
group's pages), the attention block size vLLM chose, KV blocks, and the maximum concurrency vLLM logs for
4096-token requests; then the simulator's pool for the same start (``conf/calibration/estimates.yaml``'s memory
model, vLLM's page arithmetic in harness/engines/kv_plan.py).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
sys.path.insert(0, str(ROOT))

MAX_LEN = 4096
#: the TreeWY paper's figures (ARCHITECTURE.md's reference numbers): state pages per request per GDN group
PAPER = {("store_all", 3): 4, ("store_all", 39): 40, ("treewy", 3): 1, ("treewy", 39): 1}


def measured(runs: Path, plan: dict[str, Any]) -> list[dict[str, Any]]:
    summary = {s["name"]: s for s in json.loads((runs / "summary.json").read_text())} \
        if (runs / "summary.json").is_file() else {}
    rows = []
    for run in plan["runs"]:
        name = run["name"]
        row: dict[str, Any] = {"name": name, "gmu": run["gmu"], "k": run["num_spec"],
                               "strategy": run["strategy"] if run["num_spec"] else "none"}
        path = runs / f"{name}.json"
        if path.is_file():
            kv = json.loads(path.read_text())["kv_cache"]
            gdn = [g for g in kv["groups"] if g["num_speculative_blocks"] is not None]
            attn = [g for g in kv["groups"] if g["num_speculative_blocks"] is None]
            row.update(status="started", gdn_groups=len(gdn),
                       pages_per_group=1 + gdn[0]["num_speculative_blocks"] if gdn else None,
                       block_size=kv["block_size"], num_blocks=kv["num_blocks"],
                       blocks_per_request=sum(-(-MAX_LEN // g["block_size"]) for g in attn)
                       + sum(1 + g["num_speculative_blocks"] for g in gdn),
                       max_concurrency=kv["max_concurrency_max_model_len"])
        elif name in summary:
            s = summary[name]
            # the exception's own line (vLLM's log also has the traceback's "raise ValueError(" lines)
            said = [m.group(0) for e in s.get("errors") or [] if (m := re.search(r"\w+Error: .*", e))]
            row.update(status="failed", error=said[-1] if said else s.get("failure") or f"rc {s['rc']}")
        else:
            row.update(status="not run")
        rows.append(row)
    return rows


def predicted(row: dict[str, Any], gpu_name: str) -> dict[str, Any]:
    from harness.config import engine_config, load_model, parse_draft
    from harness.engines.base import GPUSpec
    from harness.engines.sim.memory import build_pool
    import yaml

    engine = engine_config("sim")
    gpu = GPUSpec.from_config(yaml.safe_load((ROOT / "conf" / "gpu" / f"{gpu_name}.yaml").read_text()))
    tree = parse_draft(f"chain:{row['k']}", root=True) if row["k"] else None
    try:
        pool = build_pool(load_model("qwen35_35b"), gpu, row["strategy"] if tree else "store_all", tree,
                          float(row["gmu"]), engine)
    except ValueError as e:
        return {"sim_error": str(e)}
    return {"sim_pages_per_group": pool.plan.gdn_pages, "sim_block_size": pool.plan.block_size,
            "sim_num_blocks": pool.num_blocks, "sim_blocks_per_request": pool.plan.blocks_per_request(MAX_LEN),
            "sim_max_concurrency": pool.plan.max_concurrency(pool.num_blocks, MAX_LEN)}


def markdown(rows: list[dict[str, Any]]) -> str:
    head = ("| gmu | k | strategy | GDN pages / request / group (paper) | blocks / 4096-token request | block size | "
            "KV blocks | max concurrency (4096) | simulator: pages, blocks / request, KV blocks, max conc. |\n"
            "|---|---|---|---|---|---|---|---|---|\n")
    out = []
    for r in rows:
        paper = PAPER.get((r["strategy"], r["k"]))
        sim = (f"{r['sim_pages_per_group']}, {r['sim_blocks_per_request']}, {r['sim_num_blocks']}, "
               f"{r['sim_max_concurrency']:.2f}x") if "sim_num_blocks" in r else r.get("sim_error", "-")
        if r["status"] == "started":
            out.append(f"| {r['gmu']} | {r['k']} | {r['strategy']} | {r['pages_per_group']}"
                       f"{f' ({paper})' if paper else ''} | {r['blocks_per_request']} | {r['block_size']} | "
                       f"{r['num_blocks']} | {r['max_concurrency']:.2f}x | {sim} |")
        else:
            why = r.get("error", "")[:240].replace("|", "/")
            out.append(f"| {r['gmu']} | {r['k']} | {r['strategy']} | {r['status']}{f': {why}' if why else ''} "
                       f"| | | | | {sim} |")
    return head + "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("runs", type=Path)
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--plan", default="plan.json", help="the plan the runs ran (in results/h200-tree-memory/)")
    args = p.parse_args(argv)
    plan = json.loads((HERE.parent / args.plan).read_text())
    rows = [{**r, **predicted(r, plan.get("gpu", "h200"))} for r in measured(args.runs, plan)]
    out = args.out or args.runs.parent
    out.mkdir(parents=True, exist_ok=True)
    (out / "table.json").write_text(json.dumps(rows, indent=1) + "\n")
    (out / "table.md").write_text(markdown(rows))
    print(markdown(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
