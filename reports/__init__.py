"""HTML and PDF reports of a sweep: summary, regime-split ratios, figures, per-point table, provenance."""
