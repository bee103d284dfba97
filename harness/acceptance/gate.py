"""The acceptance-length gate: every strategy must reproduce the reference's decoding, step by step.

Reference: greedy speculative decoding of the tiny hybrid in float64 through the literal recurrence
(itself checked token for token against plain non-speculative greedy decoding). Each strategy x
draft shape x dtype runs the same prompts with the same drafter and is compared step by step:

* float64: every step's accepted count and every token equal;
* float32: equal too, except a divergence at a near-tie (a choice whose top-2 logit margin is under
  ``near_tie``), which is listed, not failed;
* bfloat16: the mean acceptance length within ``bf16_tolerance`` of the reference run *in bfloat16*
  (the literal recurrence on the same bf16 model: the TreeWY paper's criterion), measured along the
  reference's own path: each step verifies with the strategy's state and counts what it would accept, then
  commits the node the reference committed. Free-running, a bf16 run that flips one near-tie choice decodes
  different text from there on, and with 6 prompts of 32 tokens its acceptance length then moves by ~0.1
  with the text alone (treewy_deferred 3,2,1 read 0.149 against a 0.15 bound): along one path, only the
  state's arithmetic can move it. And each step that accepts another count than the reference must do so at a
  choice bf16 rounding can flip: a top-2 margin within ``bf16_tie_ulps`` units in the last place of the top
  logit (the correct strategies differ at 0-4 ulps; a bf16 state 10% off made a difference at 11). The share of
  steps accepting the reference's count is reported.

The reference's mean acceptance lengths are also checked against a pinned baseline file.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from .. import strategy_configs
from strategies import Strategy

from .model import TinyConfig, TinyHybrid, drafter_of
from .speculative import Decode, Drafter, greedy, speculative

DTYPES = {"float64": torch.float64, "float32": torch.float32, "bfloat16": torch.bfloat16}


@dataclass
class Row:
    draft: str
    strategy: str
    dtype: str
    ref_length: float
    length: float
    agree: float                 # fraction of tokens equal to the reference's (bfloat16: of steps accepting as many)
    verdict: str                 # pass | near-tie | FAIL
    detail: str = ""


@dataclass
class GateResult:
    rows: list[Row] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    near_ties: list[str] = field(default_factory=list)
    reference: dict[str, float] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def passed(self) -> bool:
        return not self.failures


def parse_widths(spec: str) -> tuple[int, ...]:
    s = str(spec).strip()
    if s.startswith("chain:"):
        return (1,) * int(s.split(":")[1])
    return tuple(int(w) for w in s.strip("()[]").split(","))


def prompts_from(cfg: dict[str, Any], vocab: int) -> list[list[int]]:
    """Spec-Bench questions as token ids (bundled tokenizer) folded into the tiny vocabulary."""
    import workloads
    from workloads.tokens import token_counter

    wl = {"source": "spec_bench", "num_requests": int(cfg["count"]), "seed": int(cfg.get("seed", 0)),
          "arrival": {"kind": "closed", "max_concurrency": 1}, "categories": cfg.get("categories")}
    reqs, _ = workloads.build(wl).requests()
    enc = token_counter()
    out = []
    for r in reqs:
        ids = [t % vocab for t in enc.encode(r.prompt)][: int(cfg["max_tokens"])]
        out.append(ids if len(ids) >= 2 else ids + [1, 2])
    return out


def compare(ref: Decode, run: Decode) -> tuple[int | None, str]:
    """(first diverging step or None, what differs there)."""
    for s, (a, b) in enumerate(zip(ref.accepted, run.accepted)):
        if a != b:
            return s, f"step {s}: accepted {b} drafts, reference {a}"
    n = min(len(ref.tokens), len(run.tokens))
    for t in range(n):
        if ref.tokens[t] != run.tokens[t]:
            return _step_of(ref, t), f"token {t}: {run.tokens[t]} vs reference {ref.tokens[t]}"
    return None, ""


def _step_of(d: Decode, token: int) -> int:
    produced = 1
    for s, a in enumerate(d.accepted):
        produced += a + 1
        if produced > token:
            return s
    return len(d.accepted)


def run_gate(cfg: dict[str, Any], strategy_factory: Callable[[str, tuple[int, ...]], Strategy | None] | None = None,
             progress: Callable[[str], None] | None = None) -> GateResult:
    """Run the gate; ``strategy_factory(name, widths)`` may swap in other strategies (mutation tests)."""
    t0 = time.perf_counter()
    tiny = TinyConfig(**cfg["model"])
    target = TinyHybrid(tiny, torch.float64)
    drafter = Drafter(drafter_of(target, float(cfg["drafter_noise"])))
    prompts = prompts_from(cfg["prompts"], tiny.vocab)
    n_new = int(cfg["max_new_tokens"])
    factory = strategy_factory or _default_factory(cfg)
    res = GateResult()
    for p_i, prompt in enumerate(prompts):  # the speculative loop must itself be exact
        plain = greedy(target, prompt, n_new)
        spec = speculative(target, drafter, prompt, n_new, parse_widths(cfg["drafts"][0]), None)
        if spec.tokens != plain.tokens:
            res.failures.append(f"reference: speculative decoding differs from greedy decoding on prompt {p_i}")
    models = {name: target.as_dtype(DTYPES[name]) for name in cfg["dtypes"]}
    for draft in cfg["drafts"]:
        widths = parse_widths(draft)
        refs = [speculative(target, drafter, p, n_new, widths, None) for p in prompts]
        res.reference[draft] = _mean_length(refs)
        low = {d: [speculative(models[d], drafter, p, n_new, widths, None) for p in prompts]
               for d in cfg["dtypes"] if d == "bfloat16"}
        for name in cfg["strategy"]:
            for dname in cfg["dtypes"]:
                strat = factory(name, widths)
                if strat is None:
                    continue
                base = low.get(dname, refs)
                follow = base if dname == "bfloat16" else [None] * len(prompts)   # bf16: along the reference
                runs = [speculative(models[dname], drafter, p, n_new, widths, strat, follow=f)
                        for p, f in zip(prompts, follow)]
                res.rows.append(_judge(cfg, draft, name, dname, base, runs, _mean_length(base), res))
                if progress:
                    progress(f"{draft} {name} {dname}: {res.rows[-1].verdict}")
    _check_baseline(cfg, res)
    res.seconds = time.perf_counter() - t0
    return res


def _default_factory(cfg):
    def make(name: str, widths: tuple[int, ...]) -> Strategy | None:
        strat = strategy_configs.configured(cfg, name)   # its options: the config's strategies node
        if not strat.supports_trees and not all(w == 1 for w in widths):
            return None                                   # a chains-only strategy (replay) skips the trees
        return strat
    return make


def bf16_ulp(x: float) -> float:
    """The spacing of bfloat16 numbers at ``x`` (8 significant bits): 2^(floor(log2|x|) - 7)."""
    return 2.0 ** (math.floor(math.log2(max(abs(x), 2.0 ** -126))) - 7)


def _mean_length(decodes: list[Decode]) -> float:
    steps = sum(len(d.accepted) for d in decodes)
    return 1.0 + sum(sum(d.accepted) for d in decodes) / steps if steps else 0.0


def _judge(cfg, draft, name, dname, refs, runs, ref_len, res: GateResult) -> Row:
    length = _mean_length(runs)
    if dname == "bfloat16":     # the runs followed the reference's tokens: compare what each step accepted
        steps = sum(len(r.accepted) for r in refs)
        agree = sum(a == b for r, x in zip(refs, runs) for a, b in zip(r.accepted, x.accepted)) / steps
    else:
        total = sum(len(r.tokens) for r in refs)
        agree = sum(a == b for r, x in zip(refs, runs) for a, b in zip(r.tokens, x.tokens)) / total
    row = Row(draft, name, dname, ref_len, length, agree, "pass")
    if dname == "bfloat16":
        tol, ties = float(cfg["bf16_tolerance"]), float(cfg["bf16_tie_ulps"])
        if abs(length - ref_len) > tol:
            row.verdict = "FAIL"
            row.detail = f"mean acceptance length {length:.3f} vs bf16 reference {ref_len:.3f} (tolerance {tol})"
            res.failures.append(f"{name} {draft} {dname}: {row.detail}")
            return row
        # on one path, a step may accept another count than the reference only at a choice that bf16 rounding
        # can flip: a top-2 margin within bf16_tie_ulps units in the last place of the top logit
        for p_i, (ref, run) in enumerate(zip(refs, runs)):
            for i, (a, b) in enumerate(zip(ref.accepted, run.accepted)):
                if a == b:
                    continue
                c = min(a, b)                                  # the first choice the two made differently
                ulps = min(ref.margins[i][c] / bf16_ulp(ref.tops[i][c]), run.margins[i][c] / bf16_ulp(run.tops[i][c]))
                if ulps > ties:
                    row.verdict = "FAIL"
                    row.detail = (f"prompt {p_i}, step {i}: accepted {b} where the bf16 reference accepted {a}, at a "
                                  f"choice {ulps:.1f} bf16 ulps from a tie (at most {ties:g})")
                    res.failures.append(f"{name} {draft} {dname}: {row.detail}")
                    return row
        return row
    for p_i, (ref, run) in enumerate(zip(refs, runs)):
        step, what = compare(ref, run)
        if step is None:
            continue
        margin = min(ref.margins[step] + (run.margins[step] if step < len(run.margins) else [])) \
            if step < len(ref.margins) else float("inf")
        where = f"prompt {p_i}, first diverging {what} (choice margin {margin:.2e})"
        if dname == "float32" and margin < float(cfg["near_tie"]):
            row.verdict = "near-tie"
            res.near_ties.append(f"{name} {draft} {dname}: {where}")
            continue
        row.verdict, row.detail = "FAIL", where
        res.failures.append(f"{name} {draft} {dname}: {where}")
        break
    return row


def _check_baseline(cfg, res: GateResult) -> None:
    if cfg.get("baseline") is None:  # no pinned file for this configuration (e.g. a reduced test run)
        return
    path = Path(cfg["baseline"])
    if not path.is_file():
        res.failures.append(f"baseline {path}: missing; create it with `python -m harness check-acceptance "
                            "update_baseline=true`")
        return
    pinned = json.loads(path.read_text())["mean_acceptance_length"]
    tol = float(cfg["baseline_tolerance"])
    for draft, got in res.reference.items():
        want = pinned.get(draft)
        if want is None:
            res.failures.append(f"baseline {path}: no entry for draft {draft}; update it")
        elif abs(got - want) > tol:
            res.failures.append(f"baseline {path}: draft {draft} mean acceptance length {got:.4f}, pinned {want:.4f} "
                                f"(tolerance {tol}): the model, drafter or prompts changed")


def write_baseline(cfg, res: GateResult) -> Path:
    path = Path(cfg["baseline"])
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"what": "mean acceptance length of the float64 reference per draft shape",
                                "model": cfg["model"], "drafter_noise": cfg["drafter_noise"],
                                "prompts": cfg["prompts"], "max_new_tokens": cfg["max_new_tokens"],
                                "mean_acceptance_length": res.reference}, indent=2))
    return path
