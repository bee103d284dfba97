"""``python -m harness acceptance train``: train the small Qwen3-Next and its MTP head on two CPU cores.

Two phases, every step seeded (bit-identical on one machine and thread count):

1. **Language model.** Target and MTP together on byte windows of ShareGPT and Spec-Bench text: the target's
   next-token loss plus the MTP's next-next-token loss (its hidden input detached, so the MTP never bends the
   target toward itself).
2. **Drafting the target's own text.** The target decodes training prompts greedily; the MTP alone (target
   frozen) learns to predict those choices, chained as vLLM chains it: draft i feeds the MTP its previous
   output (teacher-forced: with the true token, and with every position of a depth taking that depth's hidden
   states, where vLLM's earlier positions hold the target's). Greedy speculative decoding accepts a draft only
   where it equals the target's greedy choice, so this is what acceptance length rewards.

Writes a Hugging Face model dir (``config.json``, ``model.safetensors`` in bf16, the byte tokenizer) and
``train.json`` beside it: the settings, losses, seconds, the weights' SHA-256, the reference's acceptance
length on the gate's held-out prompts and what corrupting the GDN state does to greedy output.
"""

from __future__ import annotations

import json
import math
import platform
import time
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F

from ..identity import file_sha256
from ..provenance import provenance
from ..store import atomic_write
from . import corpus
from .qwen3next import TrainedQwen3Next, hf_config, load, save
from .reference import mean_acceptance_length, reference_decode


def _version(package: str) -> str | None:
    from ..provenance import package_version

    return package_version(package)


def _lr(step: int, steps: int, lr: float, warmup: int) -> float:
    if step < warmup:
        return lr * (step + 1) / warmup
    return lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, steps - warmup))))


def _windows(stream: torch.Tensor, batch: int, length: int, gen: torch.Generator) -> torch.Tensor:
    starts = torch.randint(0, stream.numel() - length, (batch,), generator=gen)
    return torch.stack([stream[s:s + length] for s in starts.tolist()])


def mtp_chain_loss(net: TrainedQwen3Next, seq: torch.Tensor, hidden: torch.Tensor, depth: int,
                   mask: torch.Tensor | None = None) -> tuple[torch.Tensor, list[float]]:
    """The MTP's loss over a chain of ``depth`` drafts at every position j of ``seq`` [B, T]: draft i (from 1)
    predicts ``seq[j + 1 + i]`` from the previous draft's hidden output (the target's ``hidden`` [B, T, d] for
    i = 1) and token ``seq[j + i]``. ``mask`` [B, T - 1 - depth] picks the positions that count. Returns the
    summed loss and each depth's mean."""
    B, T = seq.shape
    n = T - 1 - depth
    pos = torch.arange(n).expand(B, n)
    h = hidden[:, :n]
    total, parts = 0.0, []
    for i in range(1, depth + 1):
        h = net.mtp(net.embed(seq[:, i:i + n]), h, pos + (i - 1))
        ce = F.cross_entropy(net.logits(h).flatten(0, 1).float(), seq[:, i + 1:i + 1 + n].flatten(), reduction="none")
        loss = ce.mean() if mask is None else (ce * mask.flatten()).sum() / mask.sum()
        total = total + loss
        parts.append(float(loss.detach()))
    return total, parts


def run_training(c: dict[str, Any], progress: Callable[[str], None] = print) -> dict[str, Any]:
    """Train per ``c`` (conf/acceptance_train.yaml) and write the model dir ``c['out']``; returns train.json.

    Trains at ``c['threads']`` torch threads (the weights are bit-identical only at one thread count) and gives the
    caller back its own count: a process that trains and then goes on (a test worker) must not keep two threads
    spinning against its neighbours."""
    threads = torch.get_num_threads()
    torch.set_num_threads(int(c["threads"]))
    try:
        return _train(c, progress)
    finally:
        torch.set_num_threads(threads)


def _train(c: dict[str, Any], progress: Callable[[str], None]) -> dict[str, Any]:
    torch.manual_seed(int(c["seed"]))
    gen = torch.Generator().manual_seed(int(c["seed"]))
    t0 = time.perf_counter()
    d = c["data"]
    stream = torch.tensor(corpus.token_stream(int(d["sharegpt_records"]), int(d["heldout"])), dtype=torch.long)
    progress(f"corpus: {stream.numel():,} bytes ({d['sharegpt_records']} ShareGPT conversations, Spec-Bench after "
             f"the first {d['heldout']} questions)")
    shape = {k: v for k, v in c["model"].items() if k != "decay_init"}
    shape.update(vocab_size=corpus.VOCAB, eos_token_id=corpus.EOS)
    net = TrainedQwen3Next(hf_config(shape)).float()
    lo, hi = (float(x) for x in c["model"]["decay_init"])
    with torch.no_grad():      # slow decays at the start, so the GDN state carries context the predictions need
        for layer in net.target.model.layers:
            if hasattr(layer, "linear_attn"):
                la = layer.linear_attn
                la.A_log.copy_(torch.empty(la.A_log.shape).uniform_(lo, hi, generator=gen).log())
    params = sum(p.numel() for p in net.parameters())
    progress(f"model: {params / 1e6:.2f} M parameters")
    log: dict[str, Any] = {"lm": [], "distill": []}

    # Phase 1: the language model (target + MTP at depth 1).
    p1 = c["lm"]
    opt = torch.optim.AdamW(net.parameters(), lr=float(p1["lr"]), weight_decay=0.01, betas=(0.9, 0.95))
    steps = int(p1["steps"])
    for step in range(steps):
        for g in opt.param_groups:
            g["lr"] = _lr(step, steps, float(p1["lr"]), int(p1["warmup"]))
        x = _windows(stream, int(p1["batch"]), int(p1["seq_len"]) + 2, gen)
        hidden = net.hidden(x[:, :-1])
        lm = F.cross_entropy(net.logits(hidden[:, :-1]).flatten(0, 1), x[:, 1:-1].flatten())
        mtp, _ = mtp_chain_loss(net, x[:, :-1], hidden.detach(), 1)
        loss = lm + float(p1["mtp_weight"]) * mtp
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
        opt.step()
        log["lm"].append([round(lm.item(), 4), round(mtp.item(), 4)])
        if step % 20 == 0 or step == steps - 1:
            progress(f"lm step {step + 1}/{steps}: target loss {lm.item():.3f}, mtp loss {mtp.item():.3f} "
                     f"({time.perf_counter() - t0:.0f} s)")

    # Phase 2: the MTP drafts the target's own greedy text (target frozen).
    p2 = c["distill"]
    net.target.requires_grad_(False)
    net.eval()
    P, N = int(p2["prompt_len"]), int(p2["new_tokens"])
    texts = _windows(stream, int(p2["sequences"]), P, gen)
    seqs = []
    with torch.no_grad():
        for i in range(0, texts.shape[0], 32):
            seqs.append(_greedy_cached(net, texts[i:i + 32], N))
    seqs = torch.cat(seqs)
    progress(f"distill: {seqs.shape[0]} greedy continuations of {N} tokens ({time.perf_counter() - t0:.0f} s)")
    with torch.no_grad():
        hid_all = torch.cat([net.hidden(seqs[i:i + 32]) for i in range(0, seqs.shape[0], 32)])
    depth = int(p2["depth"])
    n = seqs.shape[1] - 1 - depth
    mask = (torch.arange(n) >= P - 1).float().expand(int(p2["batch"]), n)   # positions whose targets are generated
    net.mtp.train()
    opt = torch.optim.AdamW(net.mtp.parameters(), lr=float(p2["lr"]), weight_decay=0.01, betas=(0.9, 0.95))
    steps = int(p2["steps"])
    for step in range(steps):
        for g in opt.param_groups:
            g["lr"] = _lr(step, steps, float(p2["lr"]), int(p2["warmup"]))
        idx = torch.randint(0, seqs.shape[0], (int(p2["batch"]),), generator=gen)
        loss, parts = mtp_chain_loss(net, seqs[idx], hid_all[idx], depth, mask)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(net.mtp.parameters(), 1.0)
        opt.step()
        log["distill"].append([round(x, 4) for x in parts])
        if step % 20 == 0 or step == steps - 1:
            progress(f"distill step {step + 1}/{steps}: mtp loss per depth {', '.join(f'{x:.3f}' for x in parts)} "
                     f"({time.perf_counter() - t0:.0f} s)")
    train_s = time.perf_counter() - t0

    out = Path(c["out"])
    save(net, out)
    corpus.write_tokenizer(out)
    result = {
        "what": "a small Qwen3-Next (3 Gated DeltaNet + 1 gated attention layer, one MTP layer) trained on "
                "two CPU cores, byte vocabulary",
        "parameters": params, "train_seconds": round(train_s, 1), "threads": int(c["threads"]),
        "weights_sha256": file_sha256(out / "model.safetensors"),
        "weights_bytes": (out / "model.safetensors").stat().st_size,
        "config": c, "losses": log,
        "torch": torch.__version__, "transformers": _version("transformers"), "python": platform.python_version(),
        "machine": platform.machine(), "provenance": provenance(transformers=_version("transformers")),
    }
    result["evaluation"] = evaluate(out, c["eval"], progress) if c.get("eval") else None
    atomic_write(out.parent / "train.json", json.dumps(result, indent=1) + "\n")
    return result


@torch.no_grad()
def _greedy_cached(net: TrainedQwen3Next, prompts: torch.Tensor, n: int,
                   corrupt: Callable[[Any], None] | None = None) -> torch.Tensor:
    """Greedy decoding with transformers' cache (fast; training data and the corruption check only). With
    ``corrupt``, the cache is handed to it after the prompt's prefill."""
    from transformers import DynamicCache

    cache = DynamicCache(config=net.config)
    out = net.target(input_ids=prompts, past_key_values=cache, use_cache=True)
    if corrupt is not None:
        corrupt(cache)
    seq = prompts
    nxt = out.logits[:, -1].argmax(-1, keepdim=True)
    for _ in range(n):
        seq = torch.cat([seq, nxt], dim=1)
        out = net.target(input_ids=nxt, past_key_values=cache, use_cache=True)
        nxt = out.logits[:, -1].argmax(-1, keepdim=True)
    return seq


def evaluate(model_dir: Path, e: dict[str, Any], progress: Callable[[str], None] = print) -> dict[str, Any]:
    """On the committed (bf16) weights, computed in float32: the reference's mean acceptance length on the gate's
    held-out prompts, and the share of those prompts whose greedy output changes when the GDN layers' recurrent
    state is zeroed after the prefill (the state matters to the predictions)."""
    net = load(model_dir)
    prompts = corpus.gate_prompts(int(e["prompts"]), int(e["prompt_len"]))
    k, n = int(e["num_spec"]), int(e["new_tokens"])
    t = time.perf_counter()
    ref = reference_decode(net, prompts, n, k)
    lengths = [r.acceptance_length for r in ref]
    mean = mean_acceptance_length([r.accepted for r in ref])
    progress(f"eval: mean acceptance length {mean:.3f} (k={k}, {len(prompts)} held-out Spec-Bench prompts, "
             f"{time.perf_counter() - t:.0f} s)")

    matters = state_matters(net, prompts, n)
    progress(f"eval: zeroing the GDN state after the prefill changes the greedy output of "
             f"{matters['share_changed']:.0%} of prompts")
    return {"prompts": len(prompts), "prompt_len": int(e["prompt_len"]), "new_tokens": n, "num_spec": k,
            "reference_dtype": "float32 (the bf16 weights)", "mean_acceptance_length": round(mean, 4),
            "per_prompt_acceptance_length": [round(v, 3) for v in lengths],
            "accepted_histogram": [sum(r.accepted.count(a) for r in ref) for a in range(k + 1)],
            "zeroed_gdn_state": matters,
            "sample": corpus.decode(ref[0].tokens)}


@torch.no_grad()
def state_matters(net: TrainedQwen3Next, prompts: list[list[int]], n: int) -> dict[str, Any]:
    """Greedy decoding of ``n`` tokens with and without the GDN layers' recurrent state zeroed after the prefill:
    the share of prompts whose output changes and the first changed token of each."""
    def zero_gdn(cache):
        for layer in cache.layers:
            for state in (getattr(layer, "recurrent_states", None) or {}).values():
                if isinstance(state, torch.Tensor):
                    state.zero_()

    x = torch.tensor(prompts)
    clean = _greedy_cached(net, x, n)[:, x.shape[1]:]
    broken = _greedy_cached(net, x, n, corrupt=zero_gdn)[:, x.shape[1]:]
    first = [int((c != b).nonzero()[0]) if bool((c != b).any()) else None for c, b in zip(clean, broken)]
    return {"share_changed": sum(f is not None for f in first) / len(first), "first_change": first,
            "tokens_changed": float((clean != broken).float().mean())}
