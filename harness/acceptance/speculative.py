"""Greedy speculative decoding on the tiny hybrid, and the plain greedy reference it must reproduce.

Per step: the drafter proposes a tree under the last sampled token (the root); the target verifies
every node at once; the longest path whose tokens are the target's own argmax choices is accepted;
the target's choice after it is the bonus token; the strategy commits the accepted node. Each step
records how many drafts it accepted and the top-2 logit margin of every choice it made.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

import torch

from strategies import DraftTree, Strategy

from .model import Cache, TinyHybrid


@dataclass
class Decode:
    tokens: list[int]
    accepted: list[int] = field(default_factory=list)          # drafts accepted per step
    margins: list[list[float]] = field(default_factory=list)   # top-2 logit margin of each choice per step
    tops: list[list[float]] = field(default_factory=list)      # the top logit of each choice per step
    nodes: list[int] = field(default_factory=list)             # the tree node committed per step
    emitted: list[list[int]] = field(default_factory=list)     # the tokens each step appended (path + bonus)
    confidences: list[list[float]] = field(default_factory=list)   # each step's drafts' probabilities (preorder)

    @property
    def mean_length(self) -> float:
        """Acceptance length: tokens per verify step (accepted drafts + the bonus token)."""
        return 1.0 + sum(self.accepted) / len(self.accepted) if self.accepted else 0.0


def _top2(logits: torch.Tensor) -> tuple[int, float]:
    v, i = logits.double().topk(2)
    return int(i[0]), float(v[0] - v[1])


def _top(logits: torch.Tensor) -> float:
    return float(logits.double().max())


def greedy(model: TinyHybrid, prompt: list[int], n_new: int) -> Decode:
    """Plain non-speculative greedy decoding through the literal recurrence."""
    logits, cache = model.prefill(prompt)
    tok, margin = _top2(logits)
    out = Decode([tok], margins=[[margin]])
    while len(out.tokens) < n_new:
        logits = model.verify(cache, [tok], DraftTree.chain(1))
        model.commit(cache, 0)
        tok, margin = _top2(logits[0])
        out.tokens.append(tok)
        out.margins.append([margin])
    return out


class Drafter:
    """Drafts a tree of given widths by running a (noisy) copy of the target along every branch.
    Memoised on the context, so every strategy and dtype sees the same drafts for the same context.

    Each draft's confidence is the drafter's softmax probability of its token given its parent (what a selective
    strategy decides its checkpoints by). Here it reflects only how far the drafter's weights are from the
    target's (``drafter_noise``) and the tiny model's logit scale, not any trained drafter's calibration."""

    def __init__(self, model: TinyHybrid):
        self.model = model
        self.memo: dict[tuple, tuple[list[int], list[float]]] = {}
        self._prefixes: dict[tuple, Cache] = {}   # committed drafter caches, to extend instead of re-prefill

    def draft(self, context: list[int], widths: tuple[int, ...]) -> list[int]:
        return self.draft_with_confidence(context, widths)[0]

    def draft_with_confidence(self, context: list[int], widths: tuple[int, ...]) -> tuple[list[int], list[float]]:
        """The drafts in DFS preorder and each one's probability under the drafter."""
        key = (tuple(context), widths)
        if key not in self.memo:
            if len(context) < 2:
                raise ValueError("the drafter needs a context of at least two tokens")
            cache = self._cache_for(tuple(context[:-1]))
            cache = copy.deepcopy(cache)
            logits = self._step(cache, context[-1])
            out: list[int] = []
            conf: list[float] = []
            self._expand(cache, logits, widths, 0, out, conf)
            self.memo[key] = (out, conf)
        return self.memo[key]

    def _cache_for(self, prefix: tuple) -> Cache:
        """The drafter's cache after ``prefix``: extended from the longest cached prefix of it."""
        if prefix in self._prefixes:
            return self._prefixes[prefix]
        best = max((k for k in self._prefixes if len(k) < len(prefix) and prefix[:len(k)] == k), key=len,
                   default=None)
        if best is None:
            _, cache = self.model.prefill(list(prefix))
        else:
            cache = copy.deepcopy(self._prefixes[best])
            for tok in prefix[len(best):]:
                self._step(cache, tok)
        self._prefixes[prefix] = cache
        return cache

    def _step(self, cache: Cache, token: int) -> torch.Tensor:
        logits = self.model.verify(cache, [token], DraftTree.chain(1))
        self.model.commit(cache, 0)
        return logits[0]

    def _expand(self, cache: Cache, logits: torch.Tensor, widths, depth: int, out: list[int],
                conf: list[float]) -> None:
        probs = logits.double().softmax(-1)
        for tok in logits.topk(widths[depth]).indices.tolist():
            out.append(tok)
            conf.append(float(probs[tok]))
            if depth + 1 < len(widths):
                child = copy.deepcopy(cache)
                self._expand(child, self._step(child, tok), widths, depth + 1, out, conf)


def speculative(model: TinyHybrid, drafter: Drafter, prompt: list[int], n_new: int, widths: tuple[int, ...],
                gdn: Strategy | None, follow: Decode | None = None) -> Decode:
    """Greedy speculative decoding with the GDN state committed by ``gdn`` (None: literal recurrence).

    ``follow`` (a decode of the same prompt and widths): decode along its path instead of our own: each step
    verifies and records what *this* model would accept (``accepted``, ``margins``), then commits the node
    ``follow`` committed and appends its tokens, so both see the same context at every step. Free-running, two
    runs that differ in one near-tie choice decode different text from there on, and their acceptance lengths
    then differ by the text, not by the state they carry."""
    tree = DraftTree.from_widths(widths, root=True)
    logits, cache = model.prefill(prompt, gdn=gdn)
    root, margin = _top2(logits)
    out = Decode([follow.tokens[0] if follow else root])
    root = out.tokens[0]
    while len(out.tokens) < n_new and (follow is None or len(out.accepted) < len(follow.accepted)):
        drafts, conf = drafter.draft_with_confidence(prompt + out.tokens, widths)
        nodes = [root] + drafts
        out.confidences.append(conf)
        lg = model.verify(cache, nodes, tree, confidence=[1.0] + conf)     # the root: sampled, accepted
        node, path, margins, tops = 0, [], [], []
        while True:
            best, margin = _top2(lg[node])
            margins.append(margin)
            tops.append(_top(lg[node]))
            child = next((c for c in tree.children(node) if nodes[c] == best), None)
            if child is None:
                break
            node = child
            path.append(best)
        out.accepted.append(len(path))
        out.margins.append(margins)
        out.tops.append(tops)
        if follow is not None:
            i = len(out.accepted) - 1
            node, emitted = follow.nodes[i], follow.emitted[i]
        else:
            emitted = path + [best]
        model.commit(cache, node)
        out.nodes.append(node)
        out.emitted.append(emitted)
        out.tokens.extend(emitted)
        root = emitted[-1]
    out.tokens = out.tokens[:n_new]
    return out
