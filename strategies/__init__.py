"""State-commit strategies for speculative decoding on Gated DeltaNet layers.

Engine-independent PyTorch: the literal recurrence (the oracle), ``store_all``,
``replay``, ``treewy``, ``treewy_deferred`` and the fork/checkpoint refinements ``store_selective`` and
``store_delta`` behind one interface, and the memory
accounting of each. A leaf package: it imports nothing from the rest of CommitBench.
"""

from .base import Strategy, Verified, configured, get, names
from .history import History
from .memory import GDNShape, MiB, StateMemory, as_dtype, dtype_bytes
from .recurrence import accepted_state, delta_rule_step, tree_recurrence
from .tree import DraftTree

from . import store_all, replay, treewy, treewy_deferred, store_selective, store_delta  # noqa: E402,F401  (register)

__all__ = [
    "DraftTree", "GDNShape", "History", "MiB", "StateMemory", "Strategy", "Verified",
    "accepted_state", "as_dtype", "configured", "delta_rule_step", "dtype_bytes", "get", "names", "tree_recurrence",
]
