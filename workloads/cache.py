"""A disk cache for tokenised datasets: keyed by the source file and the tokenizer, written atomically."""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import tempfile
from pathlib import Path
from typing import Any, Callable

VERSION = 1  # bump when what a loader caches changes


def cache_dir() -> Path:
    base = os.environ.get("COMMITBENCH_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "commitbench")
    return Path(base) / "workloads"


def file_key(path: Path) -> dict[str, Any]:
    st = path.stat()
    return {"path": str(path.resolve()), "size": st.st_size, "mtime_ns": st.st_mtime_ns}


def cached(kind: str, key: dict[str, Any], build: Callable[[], Any]) -> tuple[Any, bool]:
    """``build()``'s result for ``key``, from the cache when present; returns (value, hit)."""
    digest = hashlib.sha256(json.dumps({"v": VERSION, "kind": kind, **key}, sort_keys=True).encode()).hexdigest()
    path = cache_dir() / f"{kind}-{digest[:20]}.pkl"
    if path.is_file():
        try:
            with open(path, "rb") as f:
                return pickle.load(f), True
        except (OSError, pickle.UnpicklingError, EOFError):
            path.unlink(missing_ok=True)  # a torn or stale entry: rebuild it
    value = build()
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    with os.fdopen(fd, "wb") as f:
        pickle.dump(value, f, protocol=pickle.HIGHEST_PROTOCOL)
    os.replace(tmp, path)
    return value, False
