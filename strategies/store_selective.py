"""``store_selective``: store_all that skips the checkpoint of a node the drafter is sure of.

The fork/checkpoint write-up's selective fork: a node whose draft confidence (the drafter's probability of
its token given its parent) is above ``threshold`` (0.95) will almost surely be accepted, and an accepted
node's checkpoint is only ever read when it is the *last* accepted one, so it is not written. Verify computes
every node's state as store_all does and keeps the checkpoints of the other nodes, packed — and, on a branching
tree, of every node with children, whose children fork from it in another program or launch (the Triton kernel
holds one state in registers, a parent's only along a chain; :func:`keep_mask`). For each node without a
checkpoint it keeps what the gated delta rule needs to redo that node from its parent's state: the pseudo-value
``u_t`` with its key and log decay (``h_t = e^{g_t} h_p + k_t ⊗ u_t``, the same stash slot as TreeWY's). Commit
of a node without a checkpoint (a recovery) starts from its nearest checkpointed ancestor, or the committed state,
and redoes the few nodes below it: the same arithmetic as the verify, so in float32/float64 the state is
store_all's bit for bit (a bf16 state recovers from a checkpoint already rounded to bf16: within that rounding).

Memory: a request must still reserve every checkpoint (a step whose drafts are all unsure needs them all):
``footprint`` is store_all's, and vLLM's planner, which fixes the pages per request at ``1 + k``, saves
nothing from it (the plugin refuses the strategy). What a planner that paged checkpoints per step would hold
depends on the drafter: :meth:`StoreSelective.expected_footprint` takes it from a measured distribution of
draft confidences (``confidences``, see :mod:`strategies.confidence`).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import torch

from .base import CommittedState, Verified, register
from .memory import StateMemory, account
from .confidence import ConfidenceProfile
from .inputs import StepShape, compute_dtype, expand_heads
from .store_all import check_fork, fork_states
from .tree import DraftTree


def keep_mask(tree: DraftTree, confidence: torch.Tensor, threshold: float) -> torch.Tensor:
    """``[B, N]`` bool: the nodes that keep their checkpoint: confidence at or under ``threshold``, and on a branching
    tree every node with children (its children read its state back). A chain runs its state down in registers."""
    keep = confidence <= threshold
    if not tree.is_chain:
        keep = keep | _inner_nodes(tree, str(keep.device))[None]
    return keep


@lru_cache(maxsize=256)
def _inner_nodes(tree: DraftTree, device: str) -> torch.Tensor:
    """``[N]`` bool, the nodes with children, made once per tree and device (as the kernels' ``_tree_meta``): a copy
    from the host each step would be a sync that a CUDA graph of the step cannot hold."""
    return torch.tensor([bool(tree.children(t)) for t in range(tree.num_nodes)], device=device)


def recovery_plan(slot: list[int], tree: DraftTree, accepted: int) -> tuple[int, list[int]]:
    """Where a commit of node ``accepted`` starts and what it redoes: (the nearest node on its path that has a
    checkpoint, -1 for the committed state; the nodes below it down to ``accepted``, to redo in order). ``slot``:
    one request's checkpoint index per node (-1: none)."""
    path = tree.path_to(accepted)
    kept = [i for i, n in enumerate(path) if slot[n] >= 0]
    start = kept[-1] if kept else -1
    return (path[start] if kept else -1), path[start + 1:]


@register("store_selective")
class StoreSelective(CommittedState):
    """Carry: the committed state ``[B, HV, K, V]``. Stash: ``checkpoints [M, HV, K, V]`` (the kept nodes' states,
    packed), ``slot [B, N]`` (each node's index there, -1: none), ``u [B, N, HV, V]``, ``k [B, N, HV, K]``, ``g [B,
    N, HV]`` (read only for nodes without a checkpoint; an engine keeps them for those nodes alone)."""

    options = ("threshold", "fork", "confidences")
    uses_confidence = True

    def __init__(self, threshold: float = 0.95, fork: str = "node", confidences: str | None = None):
        threshold = float(threshold)
        if not 0.0 <= threshold <= 1.0:
            raise ValueError(f"strategies.store_selective.threshold={threshold}: a probability in [0, 1] (a node "
                             "above it gets no checkpoint; 1.0 keeps every checkpoint, as store_all)")
        self.threshold = threshold
        self.fork = check_fork(fork, self.name)
        self.confidences = confidences

    def _verify(self, carry, q, k, v, g, beta, tree: DraftTree, s: StepShape, scale: float,
                confidence: torch.Tensor) -> Verified:
        dt = compute_dtype(carry.dtype)
        kh = expand_heads(k, s.HV).to(dt)
        # u_t = β_t (v_t - e^{g_t} h_pᵀk_t): what redoes node t from its parent's state, as the verify did it
        states, o, u = fork_states(carry.to(dt), expand_heads(q, s.HV).to(dt), kh, v.to(dt), g.to(dt),
                                   beta.to(dt), tree, scale, self.fork)
        keep = keep_mask(tree, confidence, self.threshold)          # [B, N]: these nodes get their checkpoint
        slot = torch.full((s.B, s.N), -1, dtype=torch.long, device=carry.device)
        slot[keep] = torch.arange(int(keep.sum()), device=carry.device)
        return Verified(o.to(carry.dtype), tree, s, {"checkpoints": states[keep].to(carry.dtype), "slot": slot,
                                                     "u": u, "k": kh, "g": g.to(dt)})

    def _commit(self, carry, verified: Verified, accepted: torch.Tensor) -> torch.Tensor:
        st = verified.stash
        out = carry.clone()
        dt = st["u"].dtype
        for b, a in enumerate(accepted.tolist()):
            if a < 0:
                continue
            base, redo = recovery_plan(st["slot"][b].tolist(), verified.tree, a)
            h = (carry[b] if base < 0 else st["checkpoints"][int(st["slot"][b, base])]).to(dt)
            for n in redo:                                            # the recovery: nodes below the checkpoint
                h = st["g"][b, n].exp()[:, None, None] * h + st["k"][b, n][:, :, None] * st["u"][b, n][:, None, :]
            out[b] = h.to(carry.dtype)
        return out

    def recovery(self, verified: Verified, accepted) -> dict[str, Any]:
        """What one commit costs: per request, whether its accepted node had no checkpoint (a recovery) and how
        many nodes the recovery redid (rank-1 updates of one state, per GDN layer); the checkpoints kept and
        skipped this step. ``accepted [B]`` as for commit."""
        slot = verified.stash["slot"].cpu()
        tokens = [len(recovery_plan(slot[b].tolist(), verified.tree, a)[1]) if a >= 0 else 0
                  for b, a in enumerate(torch.as_tensor(accepted).tolist())]
        kept = int((slot >= 0).sum())
        return {"nodes": slot.numel(), "checkpoints": kept, "skipped": slot.numel() - kept,
                "recoveries": sum(t > 0 for t in tokens), "recovered_tokens": sum(tokens),
                "recovered_per_request": tokens}

    def footprint(self, tree: DraftTree) -> tuple[int, int]:
        # the reservation: a step whose drafts are all below the threshold checkpoints every node, as store_all
        return tree.num_drafts + 1, 0

    def expected_footprint(self, tree: DraftTree) -> tuple[float, float]:
        """(full state pages, stash token slots) held on average per layer and request, with each node's chance
        of a checkpoint from the measured confidences (``confidences``): the committed state, the checkpointed
        drafts, and a stash slot (u, k, g) per node without one. The engine's root token (confidence 1) is
        checkpointed only at threshold 1, into the committed state's page as store_all's is (its footprint counts
        1 + drafts pages for a rooted tree); below that it is a stash slot."""
        p = self._profile().checkpoint_probabilities(tree, self.threshold)
        drafts = p[1:] if tree.has_root else p
        return 1.0 + float(sum(drafts)), float(sum(1.0 - x for x in p))

    def held_memory(self, shape, tree, state_dtype="bfloat16", stash_dtype=None, conv_dtype="bfloat16"):
        """The expected checkpoints and stash slots (:meth:`expected_footprint`), as a StateMemory whose
        ``state_pages`` may be fractional."""
        pages, slots = self.expected_footprint(tree)
        mem = account(self.name, shape, tree, state_pages=1, stash_tokens=0, state_dtype=state_dtype,
                      stash_dtype=stash_dtype, conv_dtype=conv_dtype)
        stash = slots * shape.token_stash_bytes(state_dtype if stash_dtype is None else stash_dtype)
        return StateMemory(strategy=self.name, tree=tree, num_layers=mem.num_layers, state_pages=pages,
                           state_bytes=int(round(pages * mem.one_state_bytes)), stash_bytes=int(round(stash)),
                           conv_bytes=mem.conv_bytes, one_state_bytes=mem.one_state_bytes)

    def step_traffic(self, tree, state_bytes, token_stash_bytes, mean_tokens) -> float:
        # the committed state read, the kept checkpoints written, the others' stash slots written; commit reads
        # a checkpoint (or the state) plus, on a recovery, the redone nodes' slots, and writes the state. The
        # recoveries come from the profile's measured steps (its drafter's own acceptance, joint with its
        # confidences), not from mean_tokens: a point's synthetic acceptance has no confidences to go with it
        pages, slots = self.expected_footprint(tree)
        recovery = self._profile().expected_recovery(tree, self.threshold)
        return (pages * state_bytes + slots * token_stash_bytes
                + recovery["probability"] * (2 * state_bytes + recovery["tokens"] * token_stash_bytes))

    def _profile(self) -> ConfidenceProfile:
        return ConfidenceProfile.load(self.confidences)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(threshold={self.threshold}, fork={self.fork!r})"
