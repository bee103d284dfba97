"""Memory-bound classification, regime-split ratios, acceptance-length checks. Not built yet."""
