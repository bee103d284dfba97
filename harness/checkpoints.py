"""``python -m harness checkpoints``: the fork/checkpoint write-up's claims, measured on real models' states and drafts.

Two models, both run here in torch (no GPU): the trained Qwen3-Next of ``results/trained-qwen3next`` (its MTP head
drafts a chain of k, as vLLM's proposer does; Spec-Bench's held-out questions, greedy) and the acceptance gate's
tiny hybrid with its noisy-copy drafter (chains and trees). For each:

- **draft confidences**: the drafter's probability of every draft, per verify step, with the drafts the target
  accepted, written as a confidence profile (:mod:`strategies.confidence`) that ``store_selective``'s expected
  memory and the simulator read; the fraction above the selective threshold per depth;
- **selective fork**: per step, the checkpoints a threshold skips and the recoveries the accepted node needs
  (nodes redone from the nearest checkpointed ancestor), from the trained model's measured steps and from the tiny
  model's decoding with ``store_selective`` itself;
- **delta checkpoints**: every GDN layer's recurrent state after each generated token (the states a chain's
  checkpoints hold), the delta to the previous token's, and each codec's size and error: compression per layer
  (median and range over tokens) against a bf16 checkpoint (the write-up's) and an fp32 one (vLLM's), the decay
  ``a_t`` that keeps the delta dense, and the size of the exact low-rank form (TreeWY's stash).

The states are these two small models' (trained a few minutes on a byte vocabulary, or random): they do not
transfer to Qwen3.5's trained weights, whose decays and state statistics differ.
"""

from __future__ import annotations

import contextlib
import json
import statistics
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import torch
from omegaconf import DictConfig, OmegaConf

import strategies
from strategies import DraftTree
from strategies.confidence import ConfidenceProfile
from strategies.store_delta import encode_decode
from strategies.store_selective import StoreSelective, recovery_plan

from .provenance import provenance
from .store import atomic_write

ROOT = Path(__file__).resolve().parents[1]


# -- GDN states ------------------------------------------------------------------------------------

def literal_states(k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor) -> torch.Tensor:
    """The gated delta rule token by token from a zero state, in float64: every token's state.
    k ``[T, HV, K]`` (L2-normalised), v ``[T, HV, V]``, g, beta ``[T, HV]``; returns ``[T, HV, K, V]``."""
    T, HV, K = k.shape
    h = torch.zeros(HV, K, v.shape[-1], dtype=torch.float64)
    out = torch.empty(T, HV, K, v.shape[-1], dtype=torch.float64)
    for t in range(T):
        h, _ = strategies.delta_rule_step(h, k[t].double(), v[t].double(), g[t].double(), beta[t].double())
        out[t] = h
    return out


@contextlib.contextmanager
def captured_gdn_inputs() -> Iterator[list[tuple[torch.Tensor, ...]]]:
    """Within the block, every call of transformers' torch chunked delta rule (Qwen3-Next's GDN layers, in layer
    order per forward pass) records its (k, v, g, beta), k L2-normalised as the kernel does it."""
    import transformers.models.qwen3_next.modeling_qwen3_next as m

    calls: list[tuple[torch.Tensor, ...]] = []
    orig = m.torch_chunk_gated_delta_rule

    def spy(query, key, value, g, beta, **kw):
        kn = key.double() * torch.rsqrt((key.double() ** 2).sum(-1, keepdim=True) + 1e-6)   # transformers' l2norm
        calls.append((kn.detach(), value.detach().double(), g.detach().double(), beta.detach().double()))
        return orig(query, key, value, g=g, beta=beta, **kw)

    m.torch_chunk_gated_delta_rule = spy
    try:
        yield calls
    finally:
        m.torch_chunk_gated_delta_rule = orig


def trained_states(net, seq: list[int]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per GDN layer of the trained Qwen3-Next, (every token's state ``[T, HV, K, V]``, its log decays ``[T, HV]``)
    over the sequence ``seq``."""
    with torch.no_grad(), captured_gdn_inputs() as calls:
        net.hidden(torch.tensor([seq]))
    if not calls:
        raise RuntimeError("transformers' Qwen3-Next ran no torch_chunk_gated_delta_rule: the capture hook needs "
                           "its torch path (a flash-linear-attention install replaces it)")
    return [(literal_states(k[0], v[0], g[0], b[0]), g[0]) for k, v, g, b in calls]


def tiny_states(model, prompt: list[int], n_new: int) -> list[torch.Tensor]:
    """Per GDN layer of the tiny hybrid, its state after the prompt and after each of ``n_new`` greedily decoded
    tokens, ``[1 + n_new, HV, K, V]``."""
    logits, cache = model.prefill(prompt)
    per_layer: list[list[torch.Tensor]] = [[s[0].clone()] for s in cache.gdn]
    tok = int(logits.argmax())
    for _ in range(n_new):
        logits = model.verify(cache, [tok], DraftTree.chain(1))
        model.commit(cache, 0)
        for j, s in enumerate(cache.gdn):
            per_layer[j].append(s[0].clone())
        tok = int(logits[0].argmax())
    return [torch.stack(x).double() for x in per_layer]


# -- delta compression -----------------------------------------------------------------------------

def delta_rows(states: torch.Tensor, start: int, codecs: list[str], threshold: float) -> dict[str, dict[str, list]]:
    """Per codec, per token t >= ``start`` (t >= 1): the compression of its checkpoint as a delta from token
    t-1's, against a bf16 checkpoint (sparse values in bf16; the error is this one's) and an fp32 one (sparse
    values in fp32), and the restored state's relative error; plus the sparse codec's kept fraction. The states as
    vLLM holds them, in float32 (``exact``: a float32 delta)."""
    states = states.float()
    HV, K, V = states.shape[1:]
    E = HV * K * V
    child, parent = states[start:], states[start - 1:-1]
    delta = child - parent
    out: dict[str, dict[str, list]] = {}
    for codec in codecs:
        # against a bf16 checkpoint the deltas' values (sparse's) are bf16; against an fp32 one, fp32
        decoded, nbytes = encode_decode(delta, child, codec, threshold, torch.bfloat16)
        _, nbytes32 = encode_decode(delta, child, codec, threshold, torch.float32)
        err = (decoded - delta).flatten(1).norm(dim=1) / child.flatten(1).norm(dim=1).clamp(min=1e-300)
        row = {"vs_bf16": (2 * E / nbytes).tolist(), "vs_fp32": (4 * E / nbytes32).tolist(),
               "rel_error": err.tolist()}
        if codec == "sparse":
            scale = child.abs().amax(dim=(1, 2, 3), keepdim=True)
            row["kept_fraction"] = (delta.abs() > threshold * scale).flatten(1).double().mean(1).tolist()
        out[codec] = row
    low_rank = HV * (1 + K + V) * 2          # (a_t - 1) per head and k ⊗ ṽ per head, bf16: TreeWY's stash slot
    out["low_rank"] = {"vs_bf16": [2 * E / low_rank] * len(child), "vs_fp32": [4 * E / low_rank] * len(child),
                       "rel_error": [0.0] * len(child)}
    return out


def _spread(xs: list[float]) -> dict[str, float]:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "n": len(xs)}


def summarize_deltas(per_layer: list[dict[str, dict[str, list]]]) -> list[dict[str, Any]]:
    """Per layer and codec: median and range of each measure over every token of every prompt."""
    out = []
    for j, codecs in enumerate(per_layer):
        out.append({"layer": j, **{c: {m: _spread(v) for m, v in ms.items()} for c, ms in codecs.items()}})
    return out


def _merge(acc: list[dict[str, dict[str, list]]], rows: list[dict[str, dict[str, list]]]) -> None:
    for j, codecs in enumerate(rows):
        if j == len(acc):
            acc.append({c: {m: [] for m in ms} for c, ms in codecs.items()})
        for c, ms in codecs.items():
            for m, v in ms.items():
                acc[j][c][m] += v


# -- selective fork ----------------------------------------------------------------------------------

def selective_from_steps(steps: list[dict[str, Any]], threshold: float, root: bool = True) -> dict[str, Any]:
    """Checkpoints skipped and recoveries over a chain drafter's measured steps (each: its drafts' confidences
    and the drafts accepted), with the engine's root token above the drafts (confidence 1)."""
    nodes = kept = recoveries = redone = 0
    for s in steps:
        conf = ([1.0] if root else []) + list(s["confidence"])
        tree = DraftTree.chain(len(s["confidence"]), root=root)
        slot = [i if c <= threshold else -1 for i, c in enumerate(conf)]
        nodes += len(conf)
        kept += sum(x >= 0 for x in slot)
        a = s["accepted"] + (0 if root else -1)              # the last accepted node (root: node 0)
        if a >= 0:
            n = len(recovery_plan(slot, tree, a)[1])
            recoveries += n > 0
            redone += n
    return {"threshold": threshold, "steps": len(steps), "nodes": nodes, "checkpoints": kept,
            "skipped_fraction": 1 - kept / nodes, "drafts_skipped_fraction":
                1 - (kept - (len(steps) if root and threshold >= 1.0 else 0)) / (nodes - (len(steps) if root else 0)),
            "recoveries_per_step": recoveries / len(steps), "redone_per_recovery": redone / recoveries if recoveries
            else 0.0, "redone_per_step": redone / len(steps)}


class CountingSelective(StoreSelective):
    """store_selective that adds up what each commit costs (:meth:`StoreSelective.recovery`)."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.totals = {"nodes": 0, "checkpoints": 0, "skipped": 0, "recoveries": 0, "recovered_tokens": 0,
                       "commits": 0}

    def _commit(self, carry, verified, accepted):
        rec = self.recovery(verified, accepted)
        for key in ("nodes", "checkpoints", "skipped", "recoveries", "recovered_tokens"):
            self.totals[key] += rec[key]
        self.totals["commits"] += len(accepted)
        return super()._commit(carry, verified, accepted)


# -- the two studies ---------------------------------------------------------------------------------

def trained_study(c: DictConfig, progress: Callable[[str], None]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The trained Qwen3-Next: (its confidence profile, its results)."""
    from .acceptance import corpus, qwen3next
    from .acceptance.reference import reference_decode

    model_dir = Path(str(c.model_dir))
    if not model_dir.is_absolute() and not model_dir.exists():
        model_dir = ROOT / model_dir                  # the committed weights, from any working folder
    net = qwen3next.load(model_dir)
    prompts = corpus.gate_prompts(int(c.prompts), int(c.prompt_len))
    t0 = time.perf_counter()
    refs = reference_decode(net, prompts, int(c.new_tokens), int(c.k))
    progress(f"  trained: {len(prompts)} prompts decoded with the MTP chain of {c.k} "
             f"({time.perf_counter() - t0:.0f} s)")
    steps = [{"confidence": conf, "accepted": a} for r in refs for conf, a in zip(r.confidences, r.accepted)]
    profile = {"drafter": f"the trained Qwen3-Next's MTP head, chain of {c.k} ({c.model_dir})",
               "source": f"Spec-Bench's first {c.prompts} questions (held out of training), {c.prompt_len}-byte "
                         f"prompts, {c.new_tokens} greedy tokens, float32 torch reference",
               "steps": steps}
    per_layer: list[dict[str, dict[str, list]]] = []
    decays: list[list[float]] = []
    t0 = time.perf_counter()
    for i, (prompt, r) in enumerate(zip(prompts, refs)):
        layers = trained_states(net, prompt + r.tokens)
        _merge(per_layer, [delta_rows(s, len(prompt), list(c.codecs), float(c.sparse_threshold)) for s, _ in layers])
        for j, (_, g) in enumerate(layers):
            if j == len(decays):
                decays.append([])
            decays[j] += (1 - g[len(prompt):].exp()).flatten().tolist()
    progress(f"  trained: GDN states of {len(prompts)} sequences, deltas per layer "
             f"({time.perf_counter() - t0:.0f} s)")
    deltas = summarize_deltas(per_layer)
    for j, d in enumerate(deltas):
        d["one_minus_decay"] = _spread(decays[j])
    return profile, {"deltas": deltas, "selective": [selective_from_steps(steps, float(t)) for t in c.thresholds],
                     "confidence": [ConfidenceProfile.from_doc(profile).summary(float(t)) for t in c.thresholds],
                     "acceptance_length": 1 + sum(s["accepted"] for s in steps) / len(steps)}


def tiny_study(c: DictConfig, progress: Callable[[str], None]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The acceptance gate's tiny hybrid and drafter: (its confidence profile, its results)."""
    from .acceptance.gate import parse_widths, prompts_from
    from .acceptance.model import TinyConfig, TinyHybrid, drafter_of
    from .acceptance.speculative import Drafter, speculative

    gate = OmegaConf.to_container(c.gate, resolve=True)
    tiny = TinyConfig(**gate["model"])
    target = TinyHybrid(tiny, torch.float64)
    drafter = Drafter(drafter_of(target, float(gate["drafter_noise"])))
    prompts = prompts_from(gate["prompts"], tiny.vocab)
    n_new = int(gate["max_new_tokens"])
    out: dict[str, Any] = {"selective": [], "confidence": []}
    profile: dict[str, Any] = {"drafter": f"the acceptance gate's tiny drafter (drafter_noise "
                                          f"{gate['drafter_noise']}: a noisy copy of the target)",
                               "source": f"{len(prompts)} Spec-Bench prompts, {n_new} greedy tokens", "steps": [],
                               "ranks": {}}
    t0 = time.perf_counter()
    for spec in c.tiny_drafts:
        widths = parse_widths(spec)
        tree = DraftTree.from_widths(widths, root=True)
        for thr in c.thresholds:
            strat = CountingSelective(threshold=float(thr))
            decs = [speculative(target, drafter, p, n_new, widths, strat) for p in prompts]
            t = strat.totals
            layers = sum(k == "gdn" for k in tiny.layer_kinds)
            steps = t["commits"] / layers
            # the root (confidence 1) skips its checkpoint below threshold 1, unless a tree's children fork from it
            roots = t["commits"] if float(thr) < 1.0 and tree.is_chain else 0
            out["selective"].append({
                "draft": tree.label, "threshold": float(thr), "steps": steps,
                "skipped_fraction": t["skipped"] / t["nodes"],
                "drafts_skipped_fraction": (t["skipped"] - roots) / (t["nodes"] - t["commits"]),
                "recoveries_per_step": t["recoveries"] / layers / steps,
                "redone_per_recovery": t["recovered_tokens"] / t["recoveries"] if t["recoveries"] else 0.0,
                "acceptance_length": 1 + sum(sum(d.accepted) for d in decs) / sum(len(d.accepted) for d in decs)})
        confs = [(conf, a) for d in decs for conf, a in zip(d.confidences, d.accepted)]
        ranks: dict[int, list[float]] = {}
        for conf, _ in confs:
            for node, p in enumerate(conf, start=1):
                sib = [x for x, q in enumerate(tree.parents) if q == tree.parents[node]]
                ranks.setdefault(sib.index(node), []).append(p)
        out["confidence"].append({"draft": tree.label, "steps": len(confs),
                                  **{f"above_{t}_by_rank": {str(r): sum(p > float(t) for p in ps) / len(ps)
                                                            for r, ps in sorted(ranks.items())}
                                     for t in c.thresholds}})
        if tree.is_chain:
            profile["steps"] += [{"confidence": conf, "accepted": a} for conf, a in confs]
        else:
            for r, ps in ranks.items():
                if r > 0:
                    profile["ranks"].setdefault(str(r), []).extend(ps)
        progress(f"  tiny: {tree.label} decoded with store_selective at {list(c.thresholds)} "
                 f"({time.perf_counter() - t0:.0f} s)")
    if not profile["steps"]:
        raise ValueError(f"tiny_drafts={list(c.tiny_drafts)}: needs a chain (e.g. chain:3) for the profile's steps")
    per_layer: list[dict[str, dict[str, list]]] = []
    for p in prompts:
        _merge(per_layer, [delta_rows(s, 1, list(c.codecs), float(c.sparse_threshold))
                           for s in tiny_states(target, p, n_new)])
    out["deltas"] = summarize_deltas(per_layer)
    out["profile_summary"] = [ConfidenceProfile.from_doc(profile).summary(float(t)) for t in c.thresholds]
    return profile, out


def run(cfg: DictConfig) -> int:
    from .console import console as make_console

    console = make_console()
    out = Path(str(cfg.out))
    (out / "confidences").mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {"config": OmegaConf.to_container(cfg, resolve=True), "provenance": provenance(),
                              "engine": "torch (CPU)"}
    for name, study, fname in (("trained", trained_study, "trained-qwen3next-mtp.json"),
                               ("tiny", tiny_study, "toy-drafter.json")):
        if name not in cfg.studies:
            continue
        console.print(f"[bold]checkpoints[/]: the {name} model")
        profile, res = study(cfg[name] if name == "trained" else cfg, console.print)
        atomic_write(out / "confidences" / fname, json.dumps(profile, indent=1) + "\n")
        result[name] = res
    atomic_write(out / "checkpoints.json", json.dumps(result, indent=1) + "\n")
    print_summary(console, result)
    console.print(f"wrote {out / 'checkpoints.json'} and {out / 'confidences'}/")
    return 0


def print_summary(console, result: dict[str, Any]) -> None:
    from .console import table as make_table

    for name in ("trained", "tiny"):
        res = result.get(name)
        if not res:
            continue
        t = make_table(f"{name}: delta checkpoints, compression vs a bf16 checkpoint: median (min, max) over tokens",
                       ["layer", *[c for c in res["deltas"][0] if c not in ("layer", "one_minus_decay")],
                        "1 - a_t (median)"], left=1)
        for d in res["deltas"]:
            cells = [f"{d[c]['vs_bf16']['median']:.2f} ({d[c]['vs_bf16']['min']:.2f}, {d[c]['vs_bf16']['max']:.2f})"
                     for c in d if c not in ("layer", "one_minus_decay")]
            t.add_row(str(d["layer"]), *cells,
                      f"{d['one_minus_decay']['median']:.3g}" if "one_minus_decay" in d else "-")
        console.print(t)
        for s in res["selective"]:
            console.print(f"  {name} selective {s.get('draft', 'chain')} at {s['threshold']}: "
                          f"{100 * s['skipped_fraction']:.1f}% of checkpoints skipped (root included; "
                          f"{100 * s['drafts_skipped_fraction']:.1f}% of the drafts'), "
                          f"{s['recoveries_per_step']:.2f} recoveries per step redoing "
                          f"{s['redone_per_recovery']:.2f} nodes each")
