"""Benchmarks: ``python -m harness bench <name>``. Ratios measured side by side in one run."""
