"""CommitBench orchestration: the CLI (``python -m harness``), configs, engines, benchmarks."""
