"""Whether a calibration still describes the GDN ops it was fitted to.

A calibration (``conf/calibration/<name>.yaml``) records each strategy's op as it was measured
(``calibration_fit.gdn_ops``): vLLM's version for ``store_all`` (vLLM's own kernel), else a hash of the plugin's op
code. A run whose op differs from that is simulated with constants fitted to another op: the simulator says so in
its telemetry (``calibration_stale``) and the report's setup line repeats it.
"""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path
from typing import Any, Mapping

ROOT = Path(__file__).resolve().parents[3]
#: the code every plugin strategy's GDN op runs, beside its own strategies/<name>.py
OP_FILES = ("strategies/paged.py", "strategies/kernels/paged.py", "strategies/kernels/paged_gluon.py",
            "strategies/kernels/paged_kernels.py", "harness/engines/vllm/plugin.py")


def op_version(strategy: str, commit: str | None = None) -> str | None:
    """A 12-hex hash of the plugin op's code that ``strategy`` runs in vLLM: as it is here, or as it was at git
    ``commit`` (what a measured run recorded in its provenance; None where this checkout cannot read that commit)."""
    digest = hashlib.sha256()
    for f in (*OP_FILES, f"strategies/{strategy}.py"):
        if commit is None:
            p = ROOT / f
            data = p.read_bytes() if p.is_file() else b"absent"
        else:
            data = _at(commit, f)
            if data is None:
                return None
        digest.update(f.encode() + data)
    return digest.hexdigest()[:12]


@functools.lru_cache(maxsize=256)    # a commit's files do not change: read each once per process
def _at(commit: str, path: str) -> bytes | None:
    """``path`` at ``commit`` (b"absent" where the commit has no such file; None: no such commit, or no git)."""
    import subprocess

    try:
        if subprocess.run(["git", "cat-file", "-e", f"{commit}^{{commit}}"], cwd=ROOT, capture_output=True,
                          timeout=30).returncode != 0:
            return None
        got = subprocess.run(["git", "show", f"{commit}:{path}"], cwd=ROOT, capture_output=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return got.stdout if got.returncode == 0 else b"absent"


def stale(engine: Mapping[str, Any], strategy: str, speculative: bool) -> str | None:
    """Why the calibration in ``engine`` no longer describes ``strategy``'s op (None: it does, it records none, or
    the point has no speculation, hence no strategy op)."""
    ops = ((engine.get("calibration_fit") or {}).get("gdn_ops")) or {}
    if not speculative or strategy not in ops or strategy == "store_all":
        return None     # store_all is vLLM's kernel: its version is the vLLM the runs recorded, not code here
    now = op_version(strategy)
    if ops[strategy] != now:
        return (f"{strategy}'s GDN op changed since the calibration was fitted (code hash {ops[strategy]}, now {now}): "
                "its constants describe the old op; run the campaign again and recalibrate")
    return None
