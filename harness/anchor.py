"""The sweep's call log and its anchor point: which sweep command ran which points, and one point measured
again by every command that resumes a campaign, so drift between GPU-host calls (another host, a warmer GPU,
another staging) shows beside the ratios.

    DIR/calls.json                              one record per sweep command that had work: its start and end
                                                (UTC), host and boot, git commit, anchor, the points it finished,
                                                and why it stopped early (time_budget_s) if it did
    DIR/anchors/call-NN/points/<id>/summary.json  the anchor as command NN measured it again (a store of its own,
                                                so the grid's points and their ratios never see it)

A campaign too long for one call (10 minutes on the lent H200 host) runs as the same ``sweep ... out=DIR``
command in several calls: each resumes the grid. With ``anchor=<point id>``, the first command measures the
anchor as an ordinary point, first; every later command that still has points to run measures it again, first,
before the rest. :func:`analysis.sweep.drift` reads all of its measurements back.
"""

from __future__ import annotations

import json
import platform
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from .store import Store, atomic_write

def pick(points: list[dict[str, Any]], anchor: str | None, baseline: str = "store_all") -> dict[str, Any] | None:
    """The grid point whose id is ``anchor`` (None: no anchor); a clear error when it is not in the grid."""
    from .point import point_id

    if anchor is None or anchor == "":
        return None
    ids = {point_id(p): p for p in points}
    if anchor in ids:
        return ids[anchor]
    base = sorted(i for i, p in ids.items() if p["strategy"] == baseline and p.get("draft"))
    some = base or sorted(ids)
    raise ValueError(f"anchor={anchor}: not a point of this sweep's grid; use one of its point ids, e.g. "
                     f"{', '.join(some[:4])}{' ...' if len(some) > 4 else ''} (the baseline's, so drift shows in "
                     "the denominator of every ratio), or anchor=null")


class CallLog:
    """``DIR/calls.json``: appended once per sweep command with work, rewritten (atomically) after each point."""

    def __init__(self, root: str | Path):
        self.path = Path(root) / "calls.json"
        self.calls: list[dict[str, Any]] = self.read(root)

    @staticmethod
    def read(root: str | Path) -> list[dict[str, Any]]:
        path = Path(root) / "calls.json"
        if not path.is_file():
            return []
        try:
            calls = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as e:
            calls = e
        if not isinstance(calls, list):
            raise ValueError(f"{path}: not a list of calls ({calls if isinstance(calls, Exception) else type(calls)}); "
                             "it only lists which command ran which points: move it aside and rerun (the points "
                             "and anchors/ are intact; new calls are numbered after the anchors/ already there)")
        return calls

    def begin(self, anchor: str | None, remeasured: bool) -> dict[str, Any]:
        from .provenance import git_commit

        # After the highest call logged and the highest anchors/call-NN there, so a log moved aside never makes
        # a re-measure land in a folder that holds an older one (the store would keep the older).
        seen = [c.get("call", 0) for c in self.calls] + [
            int(d.name.removeprefix("call-")) for d in (self.path.parent / "anchors").glob("call-*")
            if d.name.removeprefix("call-").isdigit()]
        call = {"call": max(seen, default=0) + 1, "started_utc": _now(), "ended_utc": None, "host": platform.node(),
                "boot_id": boot_id(), "git_commit": git_commit(), "anchor": anchor, "anchor_remeasured": remeasured, "points": []}
        self.calls.append(call)
        self._save()
        return call

    def finished(self, call: dict[str, Any], point_id: str) -> None:
        call["points"].append(point_id)
        self.end(call)

    def end(self, call: dict[str, Any]) -> None:
        """Stamp the command's end (after each point, and once more when it stops, interrupted or not)."""
        call["ended_utc"] = _now()
        self._save()

    def _save(self) -> None:
        atomic_write(self.path, json.dumps(self.calls, indent=1))


def anchor_store(root: str | Path, call: dict[str, Any]) -> Store:
    """Where command ``call`` measures the anchor again."""
    return Store(Path(root) / "anchors" / f"call-{call['call']:02d}")


def boot_id() -> str | None:
    """This boot of this machine (Linux), to tell a lent host's calls apart: every fresh H200 host is named "vm",
    and what a boot keeps (vLLM's and Triton's compile caches) matters to how long a server start takes."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip() or None
    except OSError:
        return None


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")

