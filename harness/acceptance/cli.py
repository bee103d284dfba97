"""``python -m harness check-acceptance``: run the gate, print its table, exit with its verdict."""

from __future__ import annotations

import json
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from .gate import run_gate, write_baseline


def run(cfg: DictConfig) -> int:
    from ..console import console as make_console, table as make_table

    c = OmegaConf.to_container(cfg, resolve=True)
    console = make_console()
    console.print(f"[bold]check-acceptance[/]: {len(c['strategy'])} strategies x {len(c['drafts'])} drafts x "
                  f"{len(c['dtypes'])} dtypes on a tiny GDN hybrid, {c['prompts']['count']} Spec-Bench prompts, "
                  f"{c['max_new_tokens']} tokens each")
    res = run_gate(c, progress=lambda msg: console.print(f"  {msg}", highlight=False))
    if c.get("update_baseline"):
        path = write_baseline(c, res)
        res.failures = [f for f in res.failures if not f.startswith("baseline ")]
        console.print(f"updated {path}")
    t = make_table("acceptance vs the float64 reference", ["draft", "strategy", "dtype", "ref length", "length",
                                                          "agree*", "verdict"], left=3)
    for r in res.rows:
        t.add_row(r.draft, r.strategy, r.dtype, f"{r.ref_length:.3f}", f"{r.length:.3f}", f"{r.agree:.0%}",
                  r.verdict if r.verdict != "FAIL" else f"[red]FAIL[/]: {r.detail}")
    console.print(t)
    console.print("* tokens equal to the reference's; bfloat16: steps accepting as many drafts as the bf16 "
                  "reference, on its path")
    if c.get("tree_sweep"):
        sweep = _tree_sweep(c)
        console.print("acceptance length vs draft tree (float64 reference): " +
                      ", ".join(f"({w}) {v:.2f}" for w, v in sweep.items()))
    for n in res.near_ties:
        console.print(f"near-tie (listed, not failed): {n}")
    for f in res.failures:
        console.print(f"[red]FAIL[/] {f}")
    console.print(f"{'PASS' if res.passed else 'FAIL'}: {len(res.rows)} runs in {res.seconds:.0f} s")
    return 0 if res.passed else 1


def _tree_sweep(c) -> dict[str, float]:
    """Mean acceptance length of the float64 reference for each draft tree in ``tree_sweep``."""
    import torch

    from .gate import _mean_length, parse_widths, prompts_from
    from .model import TinyConfig, TinyHybrid, drafter_of
    from .speculative import Drafter, speculative

    target = TinyHybrid(TinyConfig(**c["model"]), torch.float64)
    drafter = Drafter(drafter_of(target, float(c["drafter_noise"])))
    prompts = prompts_from(c["prompts"], target.cfg.vocab)
    out = {}
    for spec in c["tree_sweep"]:
        w = parse_widths(spec)
        out[spec] = _mean_length([speculative(target, drafter, p, int(c["max_new_tokens"]), w, None) for p in prompts])
    if c.get("tree_sweep_out"):
        from ..provenance import provenance
        from strategies import DraftTree

        path = Path(c["tree_sweep_out"])
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({
            "engine": "tiny-hybrid (harness/acceptance, float64 reference)",
            "what": "mean acceptance length (tokens per verify step) vs draft tree widths",
            "trees": [{"widths": k, "drafts": DraftTree.from_widths(parse_widths(k)).num_drafts,
                       "acceptance_length": v} for k, v in out.items()],
            "config": {k: c[k] for k in ("model", "drafter_noise", "prompts", "max_new_tokens")},
            "provenance": provenance()}, indent=1))
    return out
