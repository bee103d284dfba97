"""The result store: one folder per sweep, one atomic folder per point.

    DIR/sweep.json                     the sweep's composed config (what was asked)
    DIR/points/<point_id>/summary.json status, fully resolved config, provenance, metrics, telemetry
    DIR/points/<point_id>/requests.parquet   one row per request

A point's metrics are derived data: :meth:`Store.summaries` recomputes them from ``requests.parquet`` and the
stored telemetry (``analysis.metrics.point_metrics``), so a fix to a metric reaches every sweep already on disk;
the copy in ``summary.json`` is what the run computed, kept for a point whose requests were not stored.

A point is written into a private temporary folder and renamed into place, so a reader (or a
killed sweep) only ever sees whole points, and concurrent writers (parallel or Slurm jobs) never
corrupt each other: the first complete copy of a point wins. A failed point is stored the same
way with its reason; a later run retries it.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Iterator

import pyarrow as pa
import pyarrow.parquet as pq

from analysis.metrics import point_metrics

REQUEST_COLUMNS = ("id", "arrival_s", "first_token_s", "finish_s", "prompt_len", "output_len",
                   "output_tokens", "preemptions", "error")


class Store:
    def __init__(self, root: str | Path):
        self.root = Path(root)
        self.points = self.root / "points"
        self._metrics: dict[tuple[str, int], dict[str, Any]] = {}    # (requests.parquet, mtime) -> metrics

    def init(self, sweep_cfg: dict[str, Any]) -> None:
        self.points.mkdir(parents=True, exist_ok=True)
        _atomic_write(self.root / "sweep.json", json.dumps(sweep_cfg, indent=2, default=str))

    # -- points ----------------------------------------------------------------------
    def status(self, point_id: str) -> str | None:
        """'ok', 'failed', or None when the point has not been written."""
        path = self.points / point_id / "summary.json"
        if not path.is_file():
            return None
        try:
            return json.loads(path.read_text()).get("status")
        except (OSError, json.JSONDecodeError):
            return None

    def write(self, point_id: str, summary: dict[str, Any], requests: list[dict[str, Any]] | None) -> Path:
        """Write a whole point atomically; an 'ok' point already there is kept (first wins)."""
        self.points.mkdir(parents=True, exist_ok=True)
        final = self.points / point_id
        tmp = Path(tempfile.mkdtemp(prefix=f".{point_id}.", dir=self.points))
        tmp.chmod(0o755)
        try:
            (tmp / "summary.json").write_text(json.dumps(summary, indent=1, default=_json_default))
            if requests is not None:
                table = pa.table({c: [r.get(c) for r in requests] for c in REQUEST_COLUMNS})
                pq.write_table(table, tmp / "requests.parquet")
            if final.exists():
                if self.status(point_id) == "ok":
                    return final           # someone else finished it first
                shutil.rmtree(final, ignore_errors=True)  # replace a failed attempt
            try:
                os.rename(tmp, final)
            except OSError:                # a concurrent writer renamed first
                if self.status(point_id) != "ok":
                    raise
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
        return final

    def summaries(self) -> Iterator[dict[str, Any]]:
        """Every stored point's summary, in point-id order, its metrics recomputed from its requests."""
        if not self.points.is_dir():
            return
        for d in sorted(self.points.iterdir()):
            f = d / "summary.json"
            if d.name.startswith(".") or not f.is_file():
                continue
            try:
                summary = json.loads(f.read_text())
            except (OSError, json.JSONDecodeError):
                continue
            yield self._with_metrics(d, summary)

    def _with_metrics(self, folder: Path, summary: dict[str, Any]) -> dict[str, Any]:
        """``summary`` with ``metrics`` from ``requests.parquet`` (an ok point that has it); cached per file."""
        path = folder / "requests.parquet"
        if summary.get("status") != "ok" or not path.is_file():
            return summary
        key = (str(path), path.stat().st_mtime_ns)
        if key not in self._metrics:
            self._metrics[key] = point_metrics(pq.read_table(path).to_pylist(), summary.get("telemetry"))
        return {**summary, "metrics": dict(self._metrics[key])}

    def requests(self, point_id: str) -> list[dict[str, Any]]:
        path = self.points / point_id / "requests.parquet"
        return pq.read_table(path).to_pylist() if path.is_file() else []

    def sweep_config(self) -> dict[str, Any]:
        path = self.root / "sweep.json"
        return json.loads(path.read_text()) if path.is_file() else {}


def _atomic_write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


def _json_default(x):
    try:
        import numpy as np

        if isinstance(x, np.generic):
            return x.item()
    except ImportError:  # pragma: no cover
        pass
    return str(x)
