"""Deliberate commit mistakes for the in-engine acceptance gate's mutation tests (``COMMITBENCH_FAULT``).

The gate (``python -m harness acceptance vllm``) must catch a plugin that commits the wrong GDN state. With
``COMMITBENCH_FAULT`` set, the plugin builds its paged op with one of these mistakes (torch path: the CPU
engine; the Triton op does not have them):

* ``commit_off_by_one``: the commit rebuilds the state of the node after the accepted one (the classic
  off-by-one on ``num_accepted_tokens``), where that node exists;
* ``skip_decay``: the commit rebuilds the accepted state without the gates' decays (the stash's log-decay
  columns read as zero);
* ``stale_stash``: every commit reads the stash as it was one step earlier (the verify before the last one's
  pseudo-values, keys and decays), not the one the last verify wrote.

A result run with a fault says so (``fault`` in its JSON); nothing else reads this variable.
"""

from __future__ import annotations

import torch

from strategies.paged import STAGED, PagedCommit

from .plugin import ENV_FAULT

FAULTS = ("commit_off_by_one", "skip_decay", "stale_stash")


class _OffByOne(PagedCommit):
    def _plan(self, header, pages, num_accepted):
        accepted, length = super()._plan(header, pages, num_accepted)
        staged = header[pages, STAGED].long().clamp(0, self.layout.nodes)
        return torch.where(accepted >= 0, torch.minimum(accepted + 1, staged - 1), accepted), length


class _SkipDecay(PagedCommit):
    def _live(self, st, header, pages, length):
        st = super()._live(st, header, pages, length).clone()
        st[..., -self.layout.num_value_heads:] = 0                 # log-decays 0: every decay factor 1
        return st


class _StaleStash(PagedCommit):
    """Swaps in the previous step's stash before each step (which commits, then verifies and writes anew)."""

    _previous: torch.Tensor | None = None

    def step(self, pool, stash, header, *args, **kwargs):
        written = stash.clone()                       # what the last verify wrote
        if self._previous is not None:
            stash.copy_(self._previous)               # the commit reads the step before's instead
        out = super().step(pool, stash, header, *args, **kwargs)
        self._previous = written
        return out


_CLASSES = {"commit_off_by_one": _OffByOne, "skip_decay": _SkipDecay, "stale_stash": _StaleStash}


def faulty(name: str, paged: PagedCommit) -> PagedCommit:
    """``paged``'s layout in the faulty op ``name``, on the torch backend (the mistakes live in its methods; the
    Triton op's tiles and launch do not apply)."""
    if name not in _CLASSES:
        raise ValueError(f"{ENV_FAULT}={name!r}: unknown; use one of {', '.join(FAULTS)} (or unset it)")
    return _CLASSES[name](paged.layout, backend="torch")
