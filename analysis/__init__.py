"""Per-point metrics, memory-bound classification and regime-split ratios (engine-independent)."""
