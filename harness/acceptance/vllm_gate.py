"""The acceptance gate inside the real engine: the trained Qwen3-Next's MTP drafts, vLLM verifies, every strategy.

A strategy that commits the wrong GDN state changes what the target predicts next, so its tokens and its
acceptance lengths drift from the reference's. Each engine run is a fresh offline vLLM
(``python -m harness.engines.vllm.offline``) with the committed weights (``load_format=auto``: no dummy
weights, no synthetic acceptance), greedy, MTP chain of ``num_spec`` drafts, the gate's held-out Spec-Bench
prompts as token ids. Compared, request by request:

* **strategy vs store_all** (vLLM's own kernel, same engine): the tokens equal up to each request's first
  divergence, and a divergence only where both runs' choice was a near tie (a top-2 margin of the raw bf16 logits
  of at most ``tie_ulps`` ulps: bf16 rounding of the hidden state can flip it, a wrong state flips far more), in at
  most ``max_near_ties`` requests; before it the chosen token's logit within ``logit_ulps`` of store_all's and
  every verify step accepting exactly what store_all's did; the mean acceptance length within
  ``length_tolerance`` of store_all's; and each run's recorded steps are vLLM's own count (:func:`check_run`).
* **store_all vs speculation off**: speculation is lossless under greedy: the same tokens, divergences only at
  near ties.
* **vLLM vs the torch reference** (the same weights in float32 through transformers' Qwen3-Next and the MTP as
  vLLM computes it, :mod:`.qwen3next`, decoded by :mod:`.reference`): the share of tokens before each request's
  first divergence (the token agreement), divergences only at the reference's near ties
  (``reference_tie_margin``, in at most ``reference_max_near_ties`` requests), and the mean acceptance length
  within ``reference_length_tolerance``.

The mean acceptance length is over every verify step of every request (1 + accepted / steps, as vLLM's
``spec_decode`` counters give it).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from ..store import atomic_write
from .gate import bf16_ulp as _bf16_ulp
from .reference import mean_acceptance_length

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class EngineRun:
    """One engine run's per-request outputs."""
    name: str
    tokens: list[list[int]]
    accepted: list[list[int]]                  # per request, per verify step (empty without speculation)
    margins: list[list[float]]                 # per request, per output token: top-2 margin in bf16 ulps
    tops: list[list[float]]                    # per request, per output token: the top (chosen) raw logit
    result: dict[str, Any]

    @property
    def acceptance_length(self) -> float:
        return mean_acceptance_length(self.accepted)


@dataclass
class Row:
    name: str                      # strategy (or 'spec off', 'torch reference')
    against: str
    length: float
    ref_length: float
    agree: float                   # tokens before each request's first divergence / all tokens
    divergences: int               # requests that diverge at all
    logit_drift: float | None      # max |chosen logit - against's|, bf16 ulps, before the divergences (None: unchecked)
    verdict: str                   # pass | FAIL
    detail: str = ""


@dataclass
class GateResult:
    rows: list[Row] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    near_ties: list[str] = field(default_factory=list)
    runs: dict[str, EngineRun] = field(default_factory=dict)
    reference: list = field(default_factory=list)       # the torch reference's Decoded per prompt
    reference_length: float | None = None
    seconds: float = 0.0

    @property
    def passed(self) -> bool:
        return not self.failures


def bf16_ulp(x: float) -> float:
    """The toy gate's :func:`.gate.bf16_ulp`, NaN where ``x`` is not finite (a NaN logit), so every comparison in
    units of it fails instead of raising."""
    return _bf16_ulp(x) if math.isfinite(x) else float("nan")


def _logits(result: dict[str, Any]) -> tuple[list[list[float]], list[list[float]]]:
    """Per request and output token: the top logit and the top-2 margin in bf16 units in the last place of the top
    logit (vLLM's raw bf16 logits, ``logprobs_mode=raw_logits``)."""
    tops, margins = [], []
    for steps in result.get("logprobs") or []:
        t, m = [], []
        for step in steps:
            vals = sorted(step.values(), reverse=True)
            t.append(vals[0])
            m.append((vals[0] - vals[1]) / bf16_ulp(vals[0]) if len(vals) > 1 else float("inf"))
        tops.append(t)
        margins.append(m)
    return tops, margins


def engine_run(name: str, model_dir: Path, prompts_file: Path, out_dir: Path, c: dict[str, Any],
               strategy: str, num_spec: int, fault: str = "", kernels: str | None = None) -> EngineRun:
    """One fresh in-process vLLM engine (a subprocess) on the committed weights; raises with its log's tail."""
    out = out_dir / f"{name}.json"
    cmd = [sys.executable, "-m", "harness.engines.vllm.offline", "--model-dir", str(model_dir),
           "--load-format", "auto", "--strategy", strategy, "--num-spec", str(num_spec),
           "--prompt-ids", str(prompts_file), "--output-len", str(c["new_tokens"]),
           "--max-model-len", str(c["max_model_len"]), "--max-num-seqs", str(c["max_num_seqs"]),
           "--tokens", "--logprobs", "2", "--logprobs-mode", "raw_logits", "--out", str(out)]
    if c.get("kv_cache_bytes"):
        cmd += ["--kv-cache-bytes", str(int(c["kv_cache_bytes"]))]
    if c.get("gmu"):
        cmd += ["--gmu", str(c["gmu"])]
    if c.get("eager", True):
        cmd.append("--eager")
    if fault:
        cmd += ["--fault", fault]
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    if kernels:
        env["COMMITBENCH_KERNELS"] = kernels
    try:
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env,
                              timeout=float(c["run_timeout_s"]))
    except subprocess.TimeoutExpired as e:
        (out_dir / f"{name}.log").write_text(f"{e.stdout or ''}\n{e.stderr or ''}")
        raise RuntimeError(f"engine run {name} ({strategy}, k={num_spec}) passed run_timeout_s="
                           f"{c['run_timeout_s']} and was killed; its log: {out_dir / (name + '.log')}") from None
    (out_dir / f"{name}.log").write_text(proc.stdout[-20000:] + "\n" + proc.stderr[-60000:])
    if proc.returncode != 0 or not out.is_file():
        raise RuntimeError(f"engine run {name} ({strategy}, k={num_spec}{', fault ' + fault if fault else ''}) "
                           f"failed with exit {proc.returncode}; its log: {out_dir / (name + '.log')}\n"
                           f"{proc.stderr[-3000:]}")
    result = json.loads(out.read_text())
    tops, margins = _logits(result)
    return EngineRun(name, result["tokens"], result.get("accepted_per_step") or [[] for _ in result["tokens"]],
                     margins, tops, result)


def check_run(name: str, run: EngineRun, k: int, res: GateResult) -> None:
    """What a run's per-step records must agree with: vLLM's own count of verify steps, and per request the tokens
    its steps emitted (1 + each step's accepted + 1: at least the output's length, at most k past it, where the
    last step runs over and vLLM cuts the output)."""
    if not k:
        return
    drafts = (run.result.get("spec_decode") or {}).get("spec_decode_num_drafts")
    steps = sum(len(a) for a in run.accepted)
    if drafts is None or steps != drafts:
        res.failures.append(f"{name}: {steps} verify steps recorded, vLLM counted {drafts} (the per-step records "
                            "are not the engine's)")
    for r, (toks, acc) in enumerate(zip(run.tokens, run.accepted)):
        emitted = 1 + sum(a + 1 for a in acc)
        if not len(toks) <= emitted <= len(toks) + k:
            res.failures.append(f"{name}: request {r}'s recorded steps emit {emitted} tokens for an output of "
                                f"{len(toks)} (k={k})")
            break


def first_divergence(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def steps_before(accepted: list[int], tokens: int) -> int:
    """How many verify steps emitted only tokens before index ``tokens`` (the prefill emits token 0)."""
    emitted, n = 1, 0
    for a in accepted:
        if emitted + a + 1 > tokens:
            break
        emitted += a + 1
        n += 1
    return n


def compare(name: str, against: str, run_tokens, run_accepted, ref_tokens, ref_accepted, ref_margins,
            tie_margin: float, tolerance: float, run_length: float, ref_length: float, res: GateResult,
            exact_steps: bool = True, run_tops=None, ref_tops=None, logit_ulps: float | None = None,
            unit: str = "bf16 ulps", run_margins=None, max_near_ties: int | None = None) -> Row:
    """One row of the gate: ``run`` against ``ref`` (see the module docstring). With ``logit_ulps``, the chosen
    tokens' raw logits (``run_tops``, ``ref_tops``) must agree within that many bf16 ulps before each request's
    first divergence."""
    agree, total, diverged, problems, ties = 0, 0, 0, [], 0
    worst = 0.0
    if len(run_tokens) != len(ref_tokens):
        problems.append(f"{len(run_tokens)} requests against {against}'s {len(ref_tokens)}")
    for r, (toks, ref) in enumerate(zip(run_tokens, ref_tokens)):
        total += len(ref)
        d = first_divergence(toks, ref)
        agree += len(ref) if d is None else d
        if d is None:
            upto = len(ref)
        else:
            diverged += 1
            upto = d
            margin = ref_margins[r][d] if d < len(ref_margins[r]) else float("inf")
            if run_margins is not None:       # a tie is a tie on both sides: each run's own top-2 are close
                margin = max(margin, run_margins[r][d] if d < len(run_margins[r]) else float("inf"))
            where = f"{name} vs {against}: request {r} token {d} (top-2 margin {margin:.3g} {unit})"
            if margin <= tie_margin:
                res.near_ties.append(where)
                ties += 1
            else:
                problems.append(f"request {r} diverges at token {d} where {against}'s top-2 margin is "
                                f"{margin:.3g} {unit} (a near tie is <= {tie_margin:g})")
        if logit_ulps is not None:
            for i in range(min(upto, len(run_tops[r]), len(ref_tops[r]))):
                drift = abs(run_tops[r][i] - ref_tops[r][i]) / bf16_ulp(ref_tops[r][i])
                worst = max(worst, drift) if math.isfinite(drift) else float("inf")
                if not drift <= logit_ulps:       # NaN fails too
                    problems.append(f"request {r} token {i}: the chosen logit {run_tops[r][i]:.4g} is {drift:.3g} "
                                    f"bf16 ulps from {against}'s {ref_tops[r][i]:.4g} (at most {logit_ulps:g})")
                    break
        if exact_steps and run_accepted is not None and ref_accepted is not None:
            n = min(steps_before(ref_accepted[r], upto), steps_before(run_accepted[r], upto))
            if run_accepted[r][:n] != ref_accepted[r][:n]:
                i = next(i for i in range(n) if run_accepted[r][i] != ref_accepted[r][i])
                problems.append(f"request {r} verify step {i} accepted {run_accepted[r][i]} drafts, {against} "
                                f"{ref_accepted[r][i]} (before any token divergence)")
    if max_near_ties is not None and ties > max_near_ties:
        problems.append(f"{ties} requests diverge at near ties (at most {max_near_ties}: bf16 rounding flips a few "
                        "choices, a wrong state many)")
    if not abs(run_length - ref_length) <= tolerance:
        problems.append(f"mean acceptance length {run_length:.3f} vs {against}'s {ref_length:.3f} "
                        f"(tolerance {tolerance:g})")
    row = Row(name, against, run_length, ref_length, agree / max(total, 1), diverged,
              worst if logit_ulps is not None else None,
              "FAIL" if problems else "pass", "; ".join(problems[:3]) + (f" (+{len(problems) - 3} more)"
                                                                         if len(problems) > 3 else ""))
    res.failures += [f"{name} vs {against}: {p}" for p in problems]
    res.rows.append(row)
    return row


def run_gate(c: dict[str, Any], out_dir: Path, progress: Callable[[str], None] = print,
             reference: bool = True, baseline: EngineRun | None = None) -> GateResult:
    """Every strategy in ``c['strategy']`` (plus speculation off) on the trained model, judged as above; each
    engine run's JSON and log under ``out_dir``. ``c['fault']``: run the strategies with a deliberate commit
    mistake (the mutation tests; no speculation-off run). ``baseline``: a store_all run of the same settings to
    judge against instead of running one."""
    import torch

    from . import corpus
    from .qwen3next import load
    from ..identity import file_sha256
    from .reference import reference_decode

    t0 = time.perf_counter()
    model_dir = Path(c["model_dir"])
    if not (model_dir / "model.safetensors").is_file():
        raise FileNotFoundError(f"model_dir={model_dir}: no model.safetensors; `python -m harness acceptance "
                                "train` writes it")
    want = c.get("weights_sha256")
    if want == "auto":
        raise ValueError("weights_sha256=auto: resolve it from train.json first (python -m harness acceptance vllm "
                         "does), or give the hash, or null")
    got = file_sha256(model_dir / "model.safetensors")
    if want and got != want:
        raise ValueError(f"model_dir={model_dir}: weights SHA-256 {got[:12]} is not the committed {want[:12]} "
                         "(retrained or edited?); set weights_sha256=null to gate other weights")
    k = int(c["num_spec"])
    fault = c.get("fault") or ""
    if k < 1:
        raise ValueError(f"num_spec={k}: the gate judges speculative decoding; give k >= 1 (speculation off runs "
                         "beside it by itself)")
    if fault:
        from ..engines.vllm.faults import FAULTS

        if fault not in FAULTS:
            raise ValueError(f"fault={fault}: unknown; use one of {', '.join(FAULTS)}")
        if not [s for s in c["strategy"] if s != "store_all"]:
            raise ValueError(f"fault={fault}: the faults live in the plugin's paged op, which store_all does not "
                             "run; add a strategy such as treewy")
    from ..engines.vllm.engine import VLLMEngine

    for s in c["strategy"]:
        why = VLLMEngine.runs_strategy(s)
        if why:
            raise ValueError(f"strategy={s}: the in-engine gate runs what vLLM runs, and {why}")
    heldout = int(c["heldout"])
    if int(c["prompts"]) > heldout:
        raise ValueError(f"prompts={c['prompts']}: the training held out only Spec-Bench's first {heldout} "
                         f"questions (conf/acceptance_train.yaml data.heldout); use prompts <= {heldout}")
    out_dir.mkdir(parents=True, exist_ok=True)
    prompts = corpus.gate_prompts(int(c["prompts"]), int(c["prompt_len"]))
    prompts_file = out_dir / "prompts.json"
    atomic_write(prompts_file, json.dumps(prompts))
    jobs: dict[str, tuple[str, int, str]] = {}
    if not fault and c.get("spec_off", True):
        jobs["spec off"] = ("store_all", 0, "")
    for s in c["strategy"]:
        if not (s == "store_all" and baseline is not None):
            jobs[s] = (s, k, fault if s != "store_all" else "")
    if "store_all" not in jobs and baseline is None:
        jobs["store_all"] = ("store_all", k, "")           # every strategy is judged against it
    res = GateResult()
    if baseline is not None:
        res.runs["store_all"] = baseline
    progress(f"{len(jobs)} engine runs ({', '.join(jobs)}), {len(prompts)} prompts x {c['new_tokens']} tokens, "
             f"k={k}{', fault ' + fault if fault else ''}")
    with ThreadPoolExecutor(max_workers=int(c.get("parallel", 2))) as pool:
        futures = {n: pool.submit(engine_run, n.replace(" ", "_"), model_dir, prompts_file, out_dir, c, s, kk, f,
                                  c.get("kernels"))
                   for n, (s, kk, f) in jobs.items()}
        for n, fut in futures.items():
            try:
                res.runs[n] = fut.result()
            except RuntimeError as e:                            # the others' runs still count
                res.failures.append(f"{n}: {str(e).splitlines()[0]}")
                progress(f"  {n}: FAILED ({str(e).splitlines()[0]})")
                continue
            r = res.runs[n]
            check_run(n, r, jobs[n][1], res)
            progress(f"  {n}: acceptance length {r.acceptance_length:.3f}, "
                     f"{r.result['elapsed_s']:.1f} s generating ({r.result['plugin']['gdn_path'] or 'vLLM kernel'})")
    if "store_all" not in res.runs:                       # nothing to judge against
        res.seconds = time.perf_counter() - t0
        return res
    base = res.runs["store_all"]
    tie, tol, ulps = float(c["tie_ulps"]), float(c["length_tolerance"]), float(c["logit_ulps"])
    most = int(c["max_near_ties"])
    for n, r in res.runs.items():
        if n in ("store_all", "spec off"):
            continue
        compare(n, "store_all", r.tokens, r.accepted, base.tokens, base.accepted, base.margins, tie, tol,
                r.acceptance_length, base.acceptance_length, res, run_tops=r.tops, ref_tops=base.tops,
                logit_ulps=ulps, run_margins=r.margins, max_near_ties=most)
    if "spec off" in res.runs:
        off = res.runs["spec off"]
        compare("store_all", "spec off", base.tokens, None, off.tokens, None, off.margins, tie, float("inf"),
                base.acceptance_length, 1.0, res, exact_steps=False, run_tops=base.tops, ref_tops=off.tops,
                logit_ulps=float(c["spec_off_logit_ulps"]), run_margins=base.margins, max_near_ties=most)
    if reference:
        net = load(model_dir, torch.float32)
        ref = reference_decode(net, prompts, int(c["new_tokens"]), k)
        ref_len = mean_acceptance_length([d.accepted for d in ref])
        progress(f"  torch reference: acceptance length {ref_len:.3f}")
        res.reference = ref
        res.reference_length = ref_len
        rtie, rtol = float(c["reference_tie_margin"]), float(c["reference_length_tolerance"])
        for n, r in res.runs.items():
            if n == "spec off":
                continue
            compare(n, "torch reference", r.tokens, r.accepted, [d.tokens for d in ref], [d.accepted for d in ref],
                    [d.margins for d in ref], rtie, rtol, r.acceptance_length, ref_len, res, exact_steps=False,
                    unit="nats (float32)", max_near_ties=int(c["reference_max_near_ties"]))
    res.seconds = time.perf_counter() - t0
    return res
