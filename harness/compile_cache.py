"""What vLLM's compile caches on this host hold, as the sweep notes it: the kinds of server (compile keys,
:func:`harness.sweep.compile_key`: draft and strategy) that finished a point with these caches in place.

The note lives in vLLM's cache root beside the graphs, so it travels with them: a host that restores another
host's caches (results/h200-kernel-speed/device/cache.sh) has that host's note, and its time budget expects
those kinds to start warm (~90 s on the H200) instead of compiling (250-370 s). It only schedules: a wrong note
makes an estimate short or long, never a result different.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Iterable

NOTE = "commitbench-compiled-kinds.json"    # a JSON list of [draft, strategy] pairs


def vllm_cache_root() -> Path:
    """Where vLLM keeps its compile caches here: VLLM_CACHE_ROOT, else $XDG_CACHE_HOME/vllm, else
    ~/.cache/vllm (as vLLM's envs.py resolves it, in 0.26 and 0.32)."""
    root = os.environ.get("VLLM_CACHE_ROOT") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "vllm")
    return Path(root).expanduser()


def compiled_kinds(root: Path | None = None) -> set[tuple[str, str]]:
    """The kinds the note in ``root`` (vLLM's cache root) names; none where there is no readable note."""
    try:
        rows = json.loads(((root or vllm_cache_root()) / NOTE).read_text())
    except (OSError, ValueError):
        return set()
    if not isinstance(rows, list):
        return set()
    return {(r[0], r[1]) for r in rows
            if isinstance(r, list) and len(r) == 2 and all(isinstance(x, str) for x in r)}


def note_compiled(kinds: Iterable[tuple[str, str]], root: Path | None = None) -> None:
    """Add ``kinds`` to the note in ``root``, after their points finished. Rewritten only when it grows, so an
    unchanged cache keeps its file listing (cache.sh packs a new snapshot only when that changes)."""
    root = root or vllm_cache_root()
    have = compiled_kinds(root)
    new = have | {tuple(k) for k in kinds}
    if new == have:
        return
    try:
        root.mkdir(parents=True, exist_ok=True)
        tmp = root / (NOTE + ".tmp")
        tmp.write_text(json.dumps(sorted(list(k) for k in new)))
        tmp.replace(root / NOTE)
    except OSError:
        pass        # a read-only cache root: the budget then counts only this boot's starts as warm
