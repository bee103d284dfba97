"""What vLLM's compile caches on this host hold, as the sweep notes it: the kinds of server that started with
these caches in place and finished a point (or, in ``precompile.sh``, got healthy).

A kind is what decides the graphs a start compiles (:func:`compile_key`: the draft and the strategy, whose
page shape is in vLLM's cache key) for one model and graph mode. The note lives in vLLM's cache root beside the
graphs, one small file per kind, so it travels with them and two hosts' notes merge by copying: a host that
restores other hosts' caches (results/h200-kernel-speed/device/cache.sh) has their notes, and its time budget
expects those kinds to start warm (~90 s on the H200) instead of compiling (250-370 s). It only schedules: a
wrong note makes an estimate short or long, never a result different.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Iterable

NOTES = "commitbench-compiled-kinds"    # a folder in vLLM's cache root: <sha1 of the kind>.json per kind
_GRAPH_SETTINGS = ("cudagraph_mode", "max_cudagraph_capture_size")   # engine settings in vLLM's compile hash


def compile_key(p: dict[str, Any]) -> tuple:
    """What decides the graphs a vLLM start compiles: the draft (the MTP head or none) and the strategy (the
    plugin's page shape). Not gmu: vLLM leaves gpu_memory_utilization out of its compile-cache hash."""
    # a sub-grid's variant (harness.grid.sub_grids) changes engine settings, graph settings among them: its own kind
    return (p.get("draft") or "", p["strategy"], p.get("variant") or "")


def _scope(p: dict[str, Any]) -> dict[str, Any]:
    """The rest of what a kind's graphs depend on that a sweep can vary: the model and the graph settings (vLLM
    hashes its whole compilation config, capture sizes included). A setting at its default is left out, so the
    notes written before it was a setting still match. Keyed on the settings asked for, not the sizes vLLM
    resolves from them (at the default those depend on max_num_seqs too): a note only schedules, so a miss costs
    an estimate, never a result."""
    engine = p.get("engine") or {}
    scope = {"model": (p.get("model") or {}).get("name"), "enforce_eager": bool(engine.get("enforce_eager"))}
    for key in _GRAPH_SETTINGS:
        if engine.get(key) is not None:
            scope[key] = engine[key]
    return scope


def vllm_cache_root() -> Path:
    """Where vLLM keeps its compile caches here: VLLM_CACHE_ROOT, else $XDG_CACHE_HOME/vllm, else
    ~/.cache/vllm (as vLLM's envs.py resolves it, in 0.26 and 0.32)."""
    root = os.environ.get("VLLM_CACHE_ROOT") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "vllm")
    return Path(root).expanduser()


def note_compiled(points: Iterable[dict[str, Any]], root: Path | None = None) -> None:
    """Note each point's kind in ``root`` (vLLM's cache root), after its server started there. A kind's file
    is written once, whole (a temporary file renamed), so concurrent writers and readers never see half a note."""
    folder = (root or vllm_cache_root()) / NOTES
    for p in points:
        draft, strategy, _ = compile_key(p)     # the scope below holds the variant's graph settings
        kind = {**_scope(p), "draft": draft, "strategy": strategy}
        text = json.dumps(kind, sort_keys=True)
        path = folder / (hashlib.sha1(text.encode()).hexdigest()[:16] + ".json")
        if path.exists():
            continue
        tmp = None
        try:
            folder.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-")
            with os.fdopen(fd, "w") as f:
                f.write(text)
            os.replace(tmp, path)
        except OSError:     # a read-only or full cache root: the budget then counts only this boot's starts
            if tmp is not None:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)


def compiled_kinds(p: dict[str, Any], root: Path | None = None) -> set[tuple]:
    """The kinds (:func:`compile_key`) noted in ``root`` for point ``p``'s model and graph mode; an unreadable
    note counts as none."""
    scope = _scope(p)
    found = set()
    for path in ((root or vllm_cache_root()) / NOTES).glob("*.json"):
        try:
            kind = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if (isinstance(kind, dict) and all(kind.get(k) == scope.get(k) for k in {*scope, *_GRAPH_SETTINGS})
                and isinstance(kind.get("draft"), str) and isinstance(kind.get("strategy"), str)):
            found.add((kind["draft"], kind["strategy"], p.get("variant") or ""))
    return found
