"""The torch reference's decoding of the trained Qwen3-Next: plain greedy, and greedy speculative decoding with
its MTP chain exactly as vLLM's proposer drafts (:func:`mtp_chain`), per prompt the tokens and the drafts each
verify step accepts; what the in-engine gate (:mod:`.vllm_gate`) compares vLLM's runs with.

    net = qwen3next.load("results/trained-qwen3next/model")
    ref = reference_decode(net, prompts, max_new_tokens=64, k=3)
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .qwen3next import TrainedQwen3Next


def mean_acceptance_length(accepted: list[list[int]]) -> float:
    """1 + accepted drafts / verify steps over every step of every request (``accepted``: per request, the drafts
    each step accepted), as vLLM's spec-decode counters give it; 1.0 without a step."""
    steps = sum(len(a) for a in accepted)
    return 1.0 + sum(sum(a) for a in accepted) / steps if steps else 1.0


@dataclass
class Decoded:
    """One prompt's greedy speculative decoding: the output tokens and the drafts accepted per verify step."""
    tokens: list[int]
    accepted: list[int]               # per verify step, 0..k
    margins: list[float]              # per output token: the target's top-2 logit margin at that choice
    confidences: list[list[float]] = field(default_factory=list)   # per verify step: the MTP's probability of
                                                                    #   each of its k drafts

    @property
    def acceptance_length(self) -> float:
        return mean_acceptance_length([self.accepted])


@torch.no_grad()
def greedy(net: TrainedQwen3Next, prompts: list[list[int]], max_new_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Plain greedy decoding, all prompts of one length in one batch, the whole sequence recomputed per token
    (no cache: one code path, the chunked delta rule). Returns the sequences [B, P + N] and each choice's top-2
    margin [B, N]."""
    if len({len(p) for p in prompts}) != 1:
        raise ValueError("reference prompts must share one length (they decode as one batch)")
    seq = torch.tensor(prompts, dtype=torch.long)
    margins = []
    for _ in range(max_new_tokens):
        logits = net.logits(net.hidden(seq)[:, -1])
        top2 = logits.topk(2, dim=-1).values
        margins.append(top2[:, 0] - top2[:, 1])
        seq = torch.cat([seq, logits.argmax(-1, keepdim=True)], dim=1)
    return seq, torch.stack(margins, dim=1)


@torch.no_grad()
def mtp_chain(net: TrainedQwen3Next, seq: torch.Tensor, hidden: torch.Tensor, p: int, k: int) -> list[int]:
    """The k drafts vLLM's proposer makes after the target accepted up to position ``p`` of ``seq`` (1-D),
    whose token ``seq[p + 1]`` it just emitted: the MTP's first pass covers positions 0..p with the target's
    hidden states and the true next tokens, then each further draft feeds the MTP its own output and the
    previous draft at the next position."""
    return mtp_drafts(net, seq, hidden, p, k)[0]


@torch.no_grad()
def mtp_drafts(net: TrainedQwen3Next, seq: torch.Tensor, hidden: torch.Tensor, p: int,
               k: int) -> tuple[list[int], list[float]]:
    """:func:`mtp_chain`'s drafts and the MTP's softmax probability of each (its draft confidence)."""
    embeds = net.embed(seq[1:p + 2])[None]                        # t_{j+1} for j = 0..p
    hid = hidden[:p + 1][None]
    pos = torch.arange(p + 1)[None]
    drafts: list[int] = []
    probs: list[float] = []
    for i in range(k):
        h = net.mtp(embeds, hid, pos)
        logits = net.logits(h[0, -1]).double()
        d = int(logits.argmax())
        drafts.append(d)
        probs.append(float(logits.softmax(-1)[d]))
        embeds = torch.cat([embeds, net.embed(torch.tensor([[d]]))], dim=1)
        hid = torch.cat([hid, h[:, -1:]], dim=1)
        pos = torch.arange(p + 2 + i)[None]
    return drafts, probs


@torch.no_grad()
def reference_decode(net: TrainedQwen3Next, prompts: list[list[int]], max_new_tokens: int, k: int) -> list[Decoded]:
    """Greedy speculative decoding with the MTP chain of ``k`` drafts, as exact arithmetic defines it: the output
    is plain greedy decoding's (speculation never changes greedy tokens), and each verify step accepts the
    longest prefix of the drafts that equals those tokens. Per prompt: the tokens, the accepted count per
    step (the prefill's first token is no verify step; the last step may run past ``max_new_tokens``, as in
    vLLM, whose output is cut there) and the margins."""
    seqs, margins = greedy(net, prompts, max_new_tokens + k + 1)
    P = len(prompts[0])
    out = []
    for b in range(len(prompts)):
        seq = seqs[b]
        hidden = net.hidden(seq[None])[0]
        accepted: list[int] = []
        confidences: list[list[float]] = []
        p = P - 1                                  # the target accepted up to here; seq[p + 1] is emitted
        while k and p + 1 - (P - 1) < max_new_tokens:
            drafts, probs = mtp_drafts(net, seq, hidden, p, k)
            confidences.append(probs)
            a = 0
            while a < k and drafts[a] == int(seq[p + 2 + a]):
                a += 1
            accepted.append(a)
            p += a + 1
        out.append(Decoded(tokens=seq[P:P + max_new_tokens].tolist(), accepted=accepted,
                           margins=margins[b, :max_new_tokens].tolist(), confidences=confidences))
    return out
