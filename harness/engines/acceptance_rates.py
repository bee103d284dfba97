"""Synthetic acceptance rates, both engines': the simulator draws how many drafts each verify step accepts, per
request and step, from a seed (:class:`Acceptance`); the vLLM engine hands the same rates to vLLM's synthetic
rejection sampler (:func:`rates_for`). Not the acceptance-length gate (``harness/acceptance/``).

``rates[d]`` is the unconditional probability that the accepted path reaches draft depth ``d + 1``
(non-increasing; vLLM's ``synthetic_acceptance_rates``). One uniform draw per request-step decides
the depth: ``accepted = #{d : u < rates[d]}``, so ``P(accepted >= d + 1) = rates[d]`` and the mean
acceptance length (root included) is ``1 + Σ rates``: 3.24 for the paper's depth-3 chain with
``[0.90, 0.75, 0.59]``.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from strategies import DraftTree


def rates_for(tree: DraftTree, table: Mapping[str, Any]) -> np.ndarray:
    """Per-depth rates for a draft shape from the config table (by label, e.g. ``chain:3``, ``3,3,3``)."""
    label = tree.label.removesuffix("+root")
    depth = tree.draft_depth
    if label in table:
        rates = np.asarray(table[label], dtype=float)
    elif f"chain:{depth}" in table and tree.is_chain:
        rates = np.asarray(table[f"chain:{depth}"], dtype=float)
    else:  # a geometric fall-off from the first depth's rate
        first, decay = float(table.get("first", 0.9)), float(table.get("decay", 0.8))
        rates = first * decay ** np.arange(depth)
    if len(rates) != depth:
        raise ValueError(f"acceptance[{label!r}]: {len(rates)} rates for a draft of depth {depth}")
    if np.any(np.diff(rates) > 1e-12) or rates.min() < 0 or rates.max() > 1:
        raise ValueError(f"acceptance[{label!r}]={rates.tolist()}: need non-increasing rates in [0, 1]")
    return rates


class Acceptance:
    def __init__(self, rates: np.ndarray, seed: int):
        self.rates = np.asarray(rates, dtype=float)
        self.rng = np.random.default_rng(seed)

    @property
    def mean_length(self) -> float:
        return 1.0 + float(self.rates.sum())

    def accepted(self, shape) -> np.ndarray:
        """Accepted drafts per request-step (ints in [0, depth]), array of ``shape``."""
        u = self.rng.random(shape)
        return (u[..., None] < self.rates).sum(-1)
