"""Measured draft confidences: what a selective strategy's memory and traffic depend on, as a drafter gave them.

A profile is a JSON file written by ``python -m harness checkpoints`` (``results/fork-checkpoint/confidences/``)::

    {"drafter": "...", "source": "...",
     "steps": [{"confidence": [c_1, ..., c_k], "accepted": a}, ...],   # a chain drafter's verify steps
     "ranks": {"1": [p, ...], "2": [...]}}                             # optional: probabilities of a parent's
                                                                       #   2nd, 3rd, ... child (tree drafters)

``confidence[d]`` is the probability the drafter gave its top token at draft depth d given the drafts above it;
``accepted`` the drafts the target accepted in that step. From these: the chance that a node at (depth, sibling
rank) is above a threshold, and what recoveries a step needs. Two approximations, both named where used: a depth
deeper than the profile's chain takes its deepest measured depth's distribution, and a tree's accepted path is
taken to follow the top-ranked children as a chain's does (the non-top children's confidence only counts
their checkpoints). A child that is not its parent's top token has probability at most 1/2, so at thresholds of
1/2 and above it always keeps its checkpoint, with or without ``ranks``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from .tree import DraftTree

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class ConfidenceProfile:
    path: str
    drafter: str
    steps: tuple[tuple[tuple[float, ...], int], ...]      # (confidences by depth, accepted drafts) per step
    ranks: dict[int, tuple[float, ...]]

    @classmethod
    def load(cls, path: str | Path | None) -> "ConfidenceProfile":
        if path is None:
            raise ValueError("strategies.store_selective.confidences: not set; give a measured profile of draft "
                             "confidences (results/fork-checkpoint/confidences/*.json, written by `python -m "
                             "harness checkpoints`), which its expected memory and traffic come from")
        return _load(str(path))

    @classmethod
    def from_doc(cls, doc: dict[str, Any], path: str = "(in memory)") -> "ConfidenceProfile":
        """A profile from its JSON document (the module docstring's layout)."""
        try:
            steps = tuple((tuple(float(c) for c in s["confidence"]), int(s["accepted"])) for s in doc["steps"])
            ranks = {int(r): tuple(float(x) for x in v) for r, v in (doc.get("ranks") or {}).items()}
        except (ValueError, KeyError, TypeError) as e:
            raise ValueError(f"strategies.store_selective.confidences={path}: not a confidence profile ({e}); it "
                             "needs 'steps': [{'confidence': [...], 'accepted': n}, ...]") from None
        if not steps or any(not c for c, _ in steps):
            raise ValueError(f"strategies.store_selective.confidences={path}: no steps with confidences in it")
        return cls(path=path, drafter=str(doc.get("drafter", "?")), steps=steps, ranks=ranks)

    @property
    def depth(self) -> int:
        """Draft depths the profile measured (the chain's k)."""
        return min(len(c) for c, _ in self.steps)

    def p_above(self, depth: int, rank: int, threshold: float) -> float:
        """Chance that a draft at ``depth`` (0: the first draft) that is its parent's ``rank``-th child (0: the top
        one) has confidence above ``threshold``."""
        if rank == 0:
            d = min(depth, self.depth - 1)
            return sum(c[d] > threshold for c, _ in self.steps) / len(self.steps)
        samples = self.ranks.get(rank)
        if samples:
            return sum(p > threshold for p in samples) / len(samples)
        if threshold >= 0.5:
            return 0.0                    # not the top token: its probability is at most 1/2
        raise ValueError(f"{self.path}: no measured probabilities of a parent's child of rank {rank} (a chain "
                         f"drafter's profile), which a threshold of {threshold} < 0.5 needs; measure a tree drafter")

    def checkpoint_probabilities(self, tree: DraftTree, threshold: float) -> list[float]:
        """Per node of ``tree``, the chance that it keeps its checkpoint (confidence at or below ``threshold``, or
        on a branching tree children to fork from it: ``store_selective.keep_mask``). The engine's root (node 0
        of a rooted tree) was sampled, confidence 1."""
        out = []
        for t, p in enumerate(tree.parents):
            if not tree.is_chain and tree.children(t):
                out.append(1.0)
                continue
            if tree.has_root and t == 0:
                out.append(0.0 if 1.0 > threshold else 1.0)
                continue
            depth = tree.depths[t] - int(tree.has_root)
            rank = [c for c, q in enumerate(tree.parents) if q == p].index(t)
            out.append(1.0 - self.p_above(depth, rank, threshold))
        return out

    def expected_recovery(self, tree: DraftTree, threshold: float) -> dict[str, float]:
        """Over the profile's steps: the chance that a step's last accepted node has no checkpoint (a recovery),
        and the nodes the recovery redoes then, on average. The accepted path follows the top-ranked children, at
        most ``tree``'s draft depth long."""
        rec = []
        D = tree.draft_depth
        for conf, accepted in self.steps:
            path = ([1.0] if tree.has_root else []) + [conf[min(d, len(conf) - 1)] for d in range(min(accepted, D))]
            kept = [i for i, c in enumerate(path) if c <= threshold]
            rec.append(len(path) - 1 - kept[-1] if kept else len(path))
        hit = [r for r in rec if r > 0]
        return {"probability": len(hit) / len(rec), "tokens": sum(hit) / len(hit) if hit else 0.0}

    def sample(self, tree: DraftTree, B: int, gen) -> "torch.Tensor":
        """Confidences ``[B, N]`` for benchmarks and the like: per request one measured step's, by depth, on each
        parent's top child (depths past the profile's take its deepest); a lower-ranked child draws from the
        profile's ``ranks`` or, without them, uniformly in [0, 1/2] (its bound); the engine's root has 1."""
        return self.sample_steps(tree, B, gen)[0]

    def sample_steps(self, tree: DraftTree, B: int, gen) -> tuple["torch.Tensor", "torch.Tensor"]:
        """:meth:`sample`'s confidences and, from the same measured steps, each request's last accepted node
        ``[B]``: the step's accepted drafts taken down the top-ranked children (-1: none, on a tree without root)."""
        import torch

        out = torch.empty(B, tree.num_nodes, dtype=torch.float64)
        accepted = torch.empty(B, dtype=torch.long)
        for b in range(B):
            conf, a = self.steps[int(torch.randint(len(self.steps), (), generator=gen))]
            node = 0 if tree.has_root else -1
            for _ in range(a):
                kids = tree.children(node)
                if not kids:
                    break
                node = kids[0]
            accepted[b] = node
            for t, p in enumerate(tree.parents):
                if tree.has_root and t == 0:
                    out[b, t] = 1.0
                    continue
                rank = [c for c, q in enumerate(tree.parents) if q == p].index(t)
                if rank == 0:
                    out[b, t] = conf[min(tree.depths[t] - int(tree.has_root), len(conf) - 1)]
                elif self.ranks.get(rank):
                    pool = self.ranks[rank]
                    out[b, t] = pool[int(torch.randint(len(pool), (), generator=gen))]
                else:
                    out[b, t] = 0.5 * float(torch.rand((), generator=gen))
        return out, accepted

    def summary(self, threshold: float) -> dict[str, Any]:
        """The fraction of drafts above ``threshold``, overall and per depth (the profile's chain)."""
        per = [sum(c[d] > threshold for c, _ in self.steps) / len(self.steps) for d in range(self.depth)]
        return {"drafter": self.drafter, "threshold": threshold, "steps": len(self.steps),
                "above_by_depth": per, "above": sum(per) / len(per)}


@lru_cache(maxsize=16)
def _load(path: str) -> ConfidenceProfile:
    p = Path(path)
    p = p if p.is_absolute() else ROOT / p
    if not p.is_file():
        raise ValueError(f"strategies.store_selective.confidences={path}: no such file; measure one with `python -m "
                         "harness checkpoints` or point it at results/fork-checkpoint/confidences/*.json")
    try:
        doc = json.loads(p.read_text())
    except ValueError as e:
        raise ValueError(f"strategies.store_selective.confidences={path}: not a confidence profile ({e})") from None
    return ConfidenceProfile.from_doc(doc, str(path))
