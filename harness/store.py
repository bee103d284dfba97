"""The result store: one folder per sweep, one atomic folder per point.

    DIR/sweep.json                     the sweep's composed config (what was asked; its grid the union of the
                                       grids run into the folder) and the experiment's identity (harness.identity)
    DIR/.lock                          held by the sweep writing into the folder (who, since when)
    DIR/points/<point_id>/summary.json status, fully resolved config, provenance, metrics, telemetry
    DIR/points/<point_id>/requests.parquet   one row per request

A point's metrics are derived data: :meth:`Store.summaries` recomputes them from ``requests.parquet`` and the
stored telemetry (``analysis.metrics.point_metrics``), so a fix to a metric reaches every sweep already on disk;
the copy in ``summary.json`` is what the run computed (an ok point without its requests is damaged).

A point is written into a private temporary folder and renamed into place, so a reader (or a
killed sweep) only ever sees whole points, and concurrent writers (parallel or Slurm jobs) never
corrupt each other: the first complete copy of a point wins. A failed point is stored the same
way with its reason; a later run retries it. A point damaged after the fact (a summary.json that does not
parse or lacks its record, an ok point's requests.parquet gone or unreadable) is "damaged": left out of the
analysis, named in it, and redone by the next run.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from contextlib import contextmanager
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
        self.damaged: dict[str, str] = {}     # damaged points the last summaries() met: point id -> why

    def init(self, sweep_cfg: dict[str, Any]) -> None:
        self.points.mkdir(parents=True, exist_ok=True)
        atomic_write(self.root / "sweep.json", json.dumps(sweep_cfg, indent=2, default=str))

    def identity(self) -> dict[str, Any] | None:
        """The identity of the experiment this folder holds (sweep.json's, or for a folder written before
        identities were recorded, its stored points'), or None for an empty folder."""
        from harness.identity import legacy

        sweep = self.sweep_config()
        if sweep.get("identity"):
            return sweep["identity"]
        folders = sorted(self.points.iterdir()) if self.points.is_dir() else []
        return legacy((_read_point(d)[0] or {} for d in folders
                       if not d.name.startswith(".") and (d / "summary.json").is_file()), sweep)

    def check_identity(self, identity: dict[str, Any]) -> None:
        """Raise :class:`IdentityMismatch` if the folder holds another experiment than ``identity``."""
        from harness.identity import differences

        held = self.identity()
        if held is not None and (diff := differences(held, identity)):
            raise IdentityMismatch(self.root, diff)

    @contextmanager
    def lock(self, what: str = "sweep") -> Iterator[None]:
        """Hold the folder for one writer: a second sweep into it fails at once, naming the first, instead of
        running the same points twice. The kernel releases it when the holder dies (flock), so a killed sweep
        leaves no stale lock."""
        import fcntl
        import socket
        import time

        self.root.mkdir(parents=True, exist_ok=True)
        path = self.root / ".lock"
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.pread(fd, 4096, 0).decode(errors="replace").strip() or "another process"
                raise FolderBusy(f"out={self.root}: {holder} is writing into this folder; wait for it to end, "
                                 "or give this command another out=") from None
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{what} (pid {os.getpid()} on {socket.gethostname()}, since "
                          f"{time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())})\n".encode(), 0)
            yield
        finally:
            os.close(fd)      # releases the lock

    # -- points ----------------------------------------------------------------------
    def status(self, point_id: str) -> str | None:
        """'ok', 'failed', 'damaged' (written, but not whole: :meth:`damage`; a rerun redoes it), or None when
        the point has not been written."""
        folder = self.points / point_id
        if not (folder / "summary.json").is_file():
            return None
        summary, why = _read_point(folder)
        return "damaged" if why else summary["status"]

    def damage(self, point_id: str) -> str | None:
        """Why the stored point ``point_id`` is damaged (a summary.json that does not parse or lacks its status,
        config or metrics; an ok point whose requests.parquet is unreadable, or missing where its summary says it
        was stored), or None."""
        folder = self.points / point_id
        return _read_point(folder)[1] if (folder / "summary.json").is_file() else None

    def write(self, point_id: str, summary: dict[str, Any], requests: list[dict[str, Any]] | None) -> Path:
        """Write a whole point atomically; an 'ok' point already there is kept (first wins)."""
        self.points.mkdir(parents=True, exist_ok=True)
        final = self.points / point_id
        tmp = Path(tempfile.mkdtemp(prefix=f".{point_id}.", dir=self.points))
        tmp.chmod(0o755)
        try:
            # whether requests.parquet belongs beside it: a point whose file is gone is then damaged, not "ok"
            record = {**summary, "requests_stored": requests is not None}
            (tmp / "summary.json").write_text(json.dumps(record, indent=1, default=_json_default))
            if requests is not None:
                table = pa.table({c: [r.get(c) for r in requests] for c in REQUEST_COLUMNS})
                pq.write_table(table, tmp / "requests.parquet")
            if final.exists():
                if self.status(point_id) == "ok":     # a damaged one is replaced like a failed one
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
        """Every stored point's summary, in point-id order, its metrics recomputed from its requests. A damaged
        point is left out and named in :attr:`damaged` (point id -> why) once the iteration has passed it."""
        self.damaged = {}
        if not self.points.is_dir():
            return
        for d in sorted(self.points.iterdir()):
            if d.name.startswith(".") or not (d / "summary.json").is_file():
                continue
            summary, why = _read_point(d)
            if why:
                self.damaged[d.name] = why
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

    def summary(self, point_id: str) -> dict[str, Any]:
        """A point's stored summary.json as written (telemetry included); {} where there is none or it is damaged."""
        return _read_point(self.points / point_id)[0] or {}

    def requests(self, point_id: str) -> list[dict[str, Any]]:
        path = self.points / point_id / "requests.parquet"
        return pq.read_table(path).to_pylist() if path.is_file() else []

    def sweep_config(self) -> dict[str, Any]:
        path = self.root / "sweep.json"
        return json.loads(path.read_text()) if path.is_file() else {}


class IdentityMismatch(ValueError):
    """A command's experiment is not the one its out= folder holds."""

    def __init__(self, root: Path, diff: list[str]):
        self.root, self.diff = root, diff
        super().__init__(
            f"out={root} holds another experiment: " + "; ".join(diff[:8])
            + (f" (and {len(diff) - 8} more)" if len(diff) > 8 else "")
            + ". Its points would be relabelled or mixed with this command's, so nothing ran: give another out=, "
            "or identity_mismatch=new_folder to write into the next free <out>-N folder")


class FolderBusy(ValueError):
    """Another sweep holds the folder's lock."""


def _read_point(folder: Path) -> tuple[dict[str, Any] | None, str | None]:
    """(summary, None) for a whole point folder, (None, why) for a damaged one: a kill cannot leave one (points
    are renamed into place whole), but a disk, a copy or a hand can."""
    try:
        summary = json.loads((folder / "summary.json").read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        return None, f"summary.json does not parse ({type(e).__name__}: {str(e)[:120]})"
    if not isinstance(summary, dict):
        return None, "summary.json holds no point record"
    if summary.get("status") not in ("ok", "failed"):
        return None, f"summary.json's status is {summary.get('status')!r}, neither ok nor failed"
    missing = [k for k in ("config", "metrics") if k not in summary and (k == "config" or summary["status"] == "ok")]
    if missing:
        return None, f"summary.json lacks {', '.join(missing)}"
    path = folder / "requests.parquet"
    if summary["status"] == "ok" and path.is_file():
        try:
            pq.read_metadata(path)
        except Exception as e:     # pyarrow raises several kinds for a file that is not parquet
            return None, f"requests.parquet is unreadable ({type(e).__name__})"
    elif summary["status"] == "ok" and summary.get("requests_stored"):
        # (points written before the store recorded this, and hand-made ones, say nothing: a missing file there
        # cannot be told from one never written)
        return None, "requests.parquet is missing"
    return summary, None


def atomic_write(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` whole or not at all (a temporary file beside it, renamed over it)."""
    with atomic_file(path) as tmp:
        tmp.write_text(text)


@contextmanager
def atomic_file(path: Path) -> Iterator[Path]:
    """A temporary path beside ``path`` to write to; renamed over ``path`` when the block ends without an error,
    removed otherwise. A kill mid-write leaves the old file (and a hidden ``.name.*`` temporary), never half a
    new one: for outputs such as report.pdf, which a reader must never find truncated."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=path.suffix)
    os.close(fd)
    try:
        yield Path(tmp)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _json_default(x):
    try:
        import numpy as np

        if isinstance(x, np.generic):
            return x.item()
    except ImportError:  # pragma: no cover
        pass
    return str(x)


class Merged:
    """Several result folders read as one, for one report against one baseline (``report DIR DIR ... out=DIR``).
    Read-only: the report and its analysis go to ``out``, never into an input. A point id found in more than one
    folder keeps its first folder's name; the later ones become ``<id>@<folder>`` and their strategy
    ``<strategy>@<folder>``, so two runs of one strategy (say the torch path and the fused kernel) are two series
    against the same baseline instead of one silently replacing the other (and the later folder's whole strategy
    is renamed, not only its colliding points)."""

    def __init__(self, roots: list[str | Path], out: str | Path, baseline: str | None = None):
        self.stores = [Store(r) for r in roots]
        for s in self.stores:
            if not s.points.is_dir():
                raise FileNotFoundError(f"{s.root}: not a result folder (no points/); each DIR of report must be one")
        names = [s.root.name for s in self.stores]
        if len(set(names)) != len(names):       # the @folder suffix must tell them apart
            names = [str(s.root) for s in self.stores]
        self.names = names
        self.root = Path(out)
        self.points = self.root / "points"      # none: the points stay in their folders
        self.baseline = baseline
        self.renamed: dict[str, str] = {}       # point id here -> the id in its folder
        self._where: dict[str, tuple[Store, str]] = {}
        self.damaged: dict[str, str] = {}
        self._all: list[dict[str, Any]] | None = None

    def _load(self) -> list[dict[str, Any]]:
        """Every folder's summaries once (the report iterates them several times, sometimes only in part). A later
        folder's strategy with any point id already taken is renamed whole, every point of it (repeats too): one
        run's points are one series, never split between two."""
        if self._all is None:
            out: list[dict[str, Any]] = []
            for store, name in zip(self.stores, self.names):
                mine = list(store.summaries())
                taken = {s["config"]["strategy"] for s in mine if s["point_id"] in self._where}
                for s in mine:
                    pid, cfg = s["point_id"], s["config"]
                    if cfg["strategy"] in taken:
                        rep = int(cfg.get("repeat") or 1)
                        suffix = f"-r{rep}" if rep > 1 else ""
                        new = f"{pid.removesuffix(suffix)}@{name}{suffix}"
                        s = {**s, "point_id": new, "config": dict(cfg, strategy=f"{cfg['strategy']}@{name}")}
                        self.renamed[new] = pid
                    self._where[s["point_id"]] = (store, pid)
                    out.append(s)
                self.damaged.update({f"{name}/{k}": v for k, v in store.damaged.items()})
            self._all = out
        return self._all

    def summaries(self) -> Iterator[dict[str, Any]]:
        yield from self._load()

    def _of(self, point_id: str) -> tuple[Store, str]:
        self._load()
        return self._where[point_id]

    def requests(self, point_id: str) -> list[dict[str, Any]]:
        store, pid = self._of(point_id)
        return store.requests(pid)

    def summary(self, point_id: str) -> dict[str, Any]:
        store, pid = self._of(point_id)
        return store.summary(pid)

    def sweep_config(self) -> dict[str, Any]:
        """The folders' sweep settings as one: the baseline given, else the one they share; thresholds they must
        share; no anchor (drift is per campaign: report each folder alone for it)."""
        cfgs = [s.sweep_config() for s in self.stores]
        bases = {c.get("baseline", "store_all") for c in cfgs}
        if self.baseline is None and len(bases) > 1:
            raise ValueError(f"report: the folders' baselines differ ({', '.join(sorted(bases))}); give "
                             "baseline=STRATEGY for the combined report")
        ths = [c.get("thresholds") for c in cfgs if c.get("thresholds")]
        if any(t != ths[0] for t in ths):
            each = "; ".join(f"{n}: {c.get('thresholds')}" for n, c in zip(self.names, cfgs))
            raise ValueError(f"report: the folders classify memory-bound points with different thresholds ({each}); "
                             "report them separately")
        have = sorted({s["config"]["strategy"] for s in self._load()})
        if self.baseline is not None and self.baseline not in have:
            raise ValueError(f"baseline={self.baseline}: no folder has points of it; their strategies: "
                             f"{', '.join(have)}")
        join = lambda key: " + ".join(dict.fromkeys(str(c.get(key)) for c in cfgs if c.get(key) is not None)) or None
        return {"sweep_name": join("sweep_name"), "model": join("model"), "gpu": join("gpu"),
                "baseline": self.baseline or bases.pop(), "thresholds": ths[0] if ths else None,
                "slo": next((c["slo"] for c in cfgs if c.get("slo")), None), "anchor": None,
                "folders": [str(s.root) for s in self.stores]}
