"""Draft trees: the shape a speculative step verifies.

A tree is a tuple of parent indices in DFS preorder: ``parents[t]`` is the node
``t`` hangs under, ``-1`` means "child of the committed state". Preorder makes
every parent precede its children, so one forward sweep visits ancestors first
and every subtree is a contiguous index range.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Sequence

import torch


@dataclass(frozen=True)
class DraftTree:
    """A draft tree (or forest) of ``N`` nodes in DFS preorder.

    ``has_root`` marks the engine convention: node 0 is the last sampled token
    (always accepted) and every draft hangs below it, so vLLM's
    ``num_accepted_tokens`` (which counts the root) maps to
    ``accepted = num_accepted_tokens - 1``.
    """

    parents: tuple[int, ...]
    has_root: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "parents", tuple(int(p) for p in self.parents))
        _validate(self.parents, self.has_root)

    # -- constructors -------------------------------------------------------
    @classmethod
    def from_widths(cls, widths: Sequence[int], root: bool = False) -> "DraftTree":
        """Full tree with ``widths[d]`` children per node at depth ``d``.

        ``(1, 1, 1)`` is a chain of 3 drafts, ``(3, 3, 3)`` the 39-node tree of
        the TreeWY paper (3 + 9 + 27). With ``root=True`` a root node (the
        engine's last sampled token) sits above them: ``N = 1 + drafts``.
        """
        widths = tuple(int(w) for w in widths)
        if not widths:
            raise ValueError("widths=(): a draft tree needs at least one depth, e.g. (1, 1, 1)")
        if any(w < 1 for w in widths):
            raise ValueError(f"widths={widths}: every width must be >= 1")
        parents: list[int] = [-1] if root else []
        # DFS preorder without recursion (a long chain is as deep as it is long): each frame is (parent, depth,
        # children of that parent still to place); a node's children go on top, before its later siblings
        stack = [(0 if root else -1, 0, widths[0])]
        while stack:
            parent, depth, left = stack.pop()
            if left == 0:
                continue
            stack.append((parent, depth, left - 1))
            me = len(parents)
            parents.append(parent)
            if depth + 1 < len(widths):
                stack.append((me, depth + 1, widths[depth + 1]))
        return cls(tuple(parents), has_root=root)

    @classmethod
    def chain(cls, length: int, root: bool = False) -> "DraftTree":
        """A chain of ``length`` drafts (``from_widths((1,) * length, root)``); with ``root``,
        ``length=0`` is the root alone (an engine step that got no drafts)."""
        if length == 0 and root:
            return cls((-1,), has_root=True)
        if length < 1:
            raise ValueError(f"chain length={length}: must be >= 1 (or 0 with root=True)")
        return cls.from_widths((1,) * length, root=root)

    # -- structure ----------------------------------------------------------
    @property
    def num_nodes(self) -> int:
        """N: nodes verified in one step (the root included when present)."""
        return len(self.parents)

    @property
    def num_drafts(self) -> int:
        """Draft tokens: the nodes other than the root."""
        return self.num_nodes - int(self.has_root)

    @cached_property
    def depths(self) -> tuple[int, ...]:
        """Depth of each node; nodes under the committed state have depth 0."""
        d: list[int] = []
        for p in self.parents:
            d.append(0 if p < 0 else d[p] + 1)
        return tuple(d)

    @property
    def max_depth(self) -> int:
        return max(self.depths)

    @property
    def path_length(self) -> int:
        """Most nodes one accepted path can hold (``max_depth + 1``)."""
        return self.max_depth + 1

    @property
    def draft_depth(self) -> int:
        """Draft tokens on the longest path: k for a chain of k (root excluded)."""
        return self.path_length - int(self.has_root)

    @property
    def is_chain(self) -> bool:
        return all(p == t - 1 for t, p in enumerate(self.parents))

    def path_to(self, node: int) -> list[int]:
        """Nodes from the top of the tree down to ``node`` (inclusive); [] for -1."""
        self._check_node(node, allow_none=True)
        path = []
        while node >= 0:
            path.append(node)
            node = self.parents[node]
        return path[::-1]

    def ancestors(self, node: int) -> list[int]:
        """Strict ancestors of ``node``, nearest first."""
        return self.path_to(node)[-2::-1]

    def children(self, node: int) -> list[int]:
        return [t for t, p in enumerate(self.parents) if p == node]

    def ancestor_mask(self, inclusive: bool = True, device=None) -> torch.Tensor:
        """``[N, N]`` bool: ``mask[t, i]`` is True when ``i`` is an ancestor of ``t``
        (``i == t`` included when ``inclusive``). Lower triangular by preorder."""
        n = self.num_nodes
        mask = torch.zeros(n, n, dtype=torch.bool)
        for t in range(n):
            for i in self.path_to(t):
                mask[t, i] = True
        if not inclusive:
            mask.fill_diagonal_(False)
        return mask.to(device) if device is not None else mask

    @cached_property
    def levels(self) -> tuple[tuple[int, ...], ...]:
        """Node indices grouped by depth: ``levels[d]`` are the nodes at depth d."""
        out: list[list[int]] = [[] for _ in range(self.max_depth + 1)]
        for t, d in enumerate(self.depths):
            out[d].append(t)
        return tuple(tuple(x) for x in out)

    def _check_node(self, node: int, allow_none: bool = False) -> None:
        lo = -1 if allow_none else 0
        if not lo <= node < self.num_nodes:
            raise IndexError(f"node={node}: must be in [{lo}, {self.num_nodes - 1}] "
                             f"for this {self.num_nodes}-node tree")

    @cached_property
    def widths(self) -> tuple[int, ...] | None:
        """Children per node at each draft depth when the drafts form a full tree, else None."""
        parents: list[int] = [0] if self.has_root else [-1]
        out = []
        for level in self.levels[1 if self.has_root else 0:]:
            counts = {sum(self.parents[t] == p for t in level) for p in parents}
            if len(counts) != 1:
                return None
            out.append(counts.pop())
            parents = list(level)
        return tuple(out)

    @property
    def label(self) -> str:
        """Short name: ``chain:3``, ``3,3,3`` (a full tree by widths) or ``tree:N``; ``+root`` when rooted."""
        if self.widths == (1,) * self.num_drafts:
            body = f"chain:{self.num_drafts}"
        elif self.widths is not None:
            body = ",".join(map(str, self.widths))
        else:
            body = f"tree:{self.num_drafts}"
        return body + ("+root" if self.has_root else "")

    def describe(self) -> str:
        kind = "chain" if self.is_chain else "tree"
        root = ", root" if self.has_root else ""
        return f"{kind} of {self.num_drafts} drafts (N={self.num_nodes}{root})"


def _validate(parents: tuple[int, ...], has_root: bool) -> None:
    n = len(parents)
    if n == 0:
        raise ValueError("parents=(): a draft tree needs at least one node")
    for t, p in enumerate(parents):
        if p < -1 or p >= n:
            raise ValueError(f"parents[{t}]={p}: must be -1 (the committed state) or a node index in [0, {n - 1}]")
        if p >= t:
            # Name a cycle when there is one: following parents from t comes back to t.
            seen, cur = {t}, p
            while cur >= 0 and cur not in seen:
                seen.add(cur)
                cur = parents[cur]
            if cur == t:
                raise ValueError(f"parents={list(parents)}: node {t} is its own ancestor (a cycle); "
                                 "parents must form a tree")
            raise ValueError(f"parents[{t}]={p}: a parent must come before its child (DFS preorder); "
                             f"renumber the nodes so that parents[t] < t")
    # DFS preorder: node t's parent lies on the path from the top to node t-1.
    on_path: list[int] = []
    for t, p in enumerate(parents):
        if p == -1:
            on_path = []
        else:
            if p not in on_path:
                raise ValueError(f"parents[{t}]={p}: not DFS preorder (node {p}'s subtree was already closed "
                                 f"by node {t - 1}); list each subtree contiguously")
            on_path = on_path[: on_path.index(p) + 1]
        on_path.append(t)
    if has_root and (parents[0] != -1 or any(p == -1 for p in parents[1:])):
        raise ValueError(f"parents={list(parents)}: has_root=True needs node 0 as the only node with parent -1")
