"""``python -m harness check-acceptance`` (the toy model's gate), ``acceptance train`` (the trained Qwen3-Next) and
``acceptance vllm`` (the gate inside vLLM): run, print a table, exit with the verdict."""

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


def train(cfg: DictConfig) -> int:
    from ..console import console as make_console
    from .train import run_training

    c = OmegaConf.to_container(cfg, resolve=True)
    console = make_console()
    console.print(f"[bold]acceptance train[/]: seed {c['seed']}, {c['threads']} threads -> {c['out']}")
    res = run_training(c, progress=lambda msg: console.print(f"  {msg}", highlight=False))
    e = res["evaluation"]
    said = (f"; reference acceptance length {e['mean_acceptance_length']:.3f} at k={e['num_spec']}" if e else "")
    console.print(f"wrote {c['out']} ({res['parameters'] / 1e6:.2f} M parameters, "
                  f"{res['weights_bytes'] / 1e6:.1f} MB, sha256 {res['weights_sha256'][:16]}) in "
                  f"{res['train_seconds']:.0f} s{said}")
    return 0


def vllm_gate(cfg: DictConfig) -> int:
    import tempfile

    from ..console import console as make_console, table as make_table
    from .vllm_gate import run_gate

    c = OmegaConf.to_container(cfg, resolve=True)
    console = make_console()
    train_json = Path(c["model_dir"]).parent / "train.json"
    if c.get("weights_sha256") == "auto":            # the hash train.json recorded beside the weights
        if not train_json.is_file():
            raise FileNotFoundError(f"model_dir={c['model_dir']}: no train.json beside it to read the weights' "
                                    "SHA-256 from; give weights_sha256=HASH, or null to gate any weights")
        c["weights_sha256"] = json.loads(train_json.read_text())["weights_sha256"]
    out = Path(c["out"]) if c.get("out") else Path(tempfile.mkdtemp(prefix="acceptance-vllm-"))
    console.print(f"[bold]acceptance vllm[/]: {c['model_dir']} (real weights, real MTP drafts), "
                  f"strategies {', '.join(c['strategy'])}; runs in {out}")
    res = run_gate(c, out, progress=lambda msg: console.print(f"  {msg}", highlight=False),
                   reference=bool(c.get("reference", True)))
    t = make_table("acceptance inside vLLM", ["strategy", "against", "length", "its length", "agree*",
                                              "diverged", "logit drift**", "verdict"], left=2)
    for r in res.rows:
        t.add_row(r.name, r.against, f"{r.length:.3f}", f"{r.ref_length:.3f}", f"{r.agree:.1%}",
                  str(r.divergences), "-" if r.logit_drift is None else f"{r.logit_drift:g} ulps",
                  r.verdict if r.verdict != "FAIL" else f"[red]FAIL[/]: {r.detail}")
    console.print(t)
    console.print("* tokens before each request's first divergence, of all tokens; ** the largest difference of "
                  "the chosen token's raw bf16 logit before it (vLLM runs only)")
    for n in res.near_ties:
        console.print(f"near tie (listed, not failed): {n}")
    for f in res.failures:
        console.print(f"[red]FAIL[/] {f}")
    summary = {"passed": res.passed, "seconds": round(res.seconds, 1), "config": c,
               "rows": [r.__dict__ for r in res.rows], "failures": res.failures, "near_ties": res.near_ties,
               "runs": {n: {"acceptance_length": r.acceptance_length, "accepted_per_step": r.accepted,
                            "tokens": r.tokens, "provenance": r.result.get("provenance"),
                            "gdn_path": r.result.get("plugin", {}).get("gdn_path"),
                            "spec_decode": r.result.get("spec_decode")} for n, r in res.runs.items()}}
    from ..store import atomic_write

    atomic_write(out / "gate.json", json.dumps(summary, indent=1))
    console.print(f"{'PASS' if res.passed else 'FAIL'}: {len(res.runs)} engine runs in {res.seconds:.0f} s "
                  f"({out / 'gate.json'})")
    return 0 if res.passed else 1
