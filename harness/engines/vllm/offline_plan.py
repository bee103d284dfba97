"""Run a list of offline vLLM configurations, each in a fresh process, and keep every outcome.

    python -m harness.engines.vllm.offline_plan PLAN.json OUT_DIR [--only NAME ...] [--timeout 420]
        [--skip-done] [--budget-s SECONDS]

PLAN.json: ``{"defaults": {...}, "runs": [{"name": ..., "model": "qwen35_35b", ...}, ...]}``;
each run's keys are :mod:`harness.engines.vllm.offline` options (``num_spec``, ``gmu``,
``strategy``, ...); ``model`` names ``conf/model/<model>.yaml``, written as a model dir under
``OUT_DIR/models``; ``env`` (plan-wide or per run) adds environment variables; a ``probe_dir``
becomes ``OUT_DIR/probe-<name>``. Per run: ``<name>.json`` (the result), ``<name>.log`` (vLLM's output) and a
line in ``summary.json`` (return code, wall time, vLLM's own KV-cache log lines). A run that
fails or hangs is recorded and the next one starts: its process group is killed on timeout.

A plan that takes several device calls: ``--skip-done`` skips the runs ``summary.json`` already records as
ended (rc 0, or an error of the run's own, which is its result: e.g. a configuration vLLM refuses; a run killed
on timeout is tried again), and ``--budget-s`` starts no run it does not expect to finish in
the seconds left (expected: 1.5x the last finished run of this call, else ``--first-run-s``, since a fresh
host's first start compiles vLLM's kernels); a run the budget cuts is killed and recorded as a timeout.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from ...model import ModelSpec
from .model_dir import write
from .server import ManagedProcess

ROOT = Path(__file__).resolve().parents[3]
KV_LINES = re.compile(r"(KV cache size|Maximum concurrency|attention block size|Padding mamba page|"
                      r"commitbench|Available KV cache memory|num_gpu_blocks)", re.I)
TIMED_OUT = -9   # a run's rc when its process group was killed on timeout


def to_argv(run: dict[str, Any], model_dir: Path, out: Path) -> list[str]:
    argv = ["--model-dir", str(model_dir), "--out", str(out)]
    for key, value in run.items():
        if key in ("name", "model", "env") or value is None or value is False:
            continue
        flag = "--" + key.replace("_", "-")
        if value is True:
            argv.append(flag)
        elif isinstance(value, (list, tuple)):
            argv += [flag, ",".join(str(v) for v in value)]
        else:
            argv += [flag, str(value)]
    return argv


def run_one(run: dict[str, Any], out_dir: Path, timeout: float, env_extra: dict[str, str]) -> dict[str, Any]:
    name = run["name"]
    if run.get("probe_dir"):  # probes live beside the results
        run = {**run, "probe_dir": str(out_dir / f"probe-{name}")}
    env_extra = {**env_extra, **{k: str(v) for k, v in run.get("env", {}).items()}}
    model_dir = out_dir / "models" / run["model"]
    if not (model_dir / "config.json").exists():
        write(ModelSpec.from_yaml(ROOT / "conf" / "model" / f"{run['model']}.yaml"), model_dir)
    argv = [sys.executable, "-m", "harness.engines.vllm.offline", *to_argv(run, model_dir, out_dir / f"{name}.json")]
    log_path = out_dir / f"{name}.log"
    t0 = time.time()
    proc = ManagedProcess(argv, name, log_path, env={**os.environ, **env_extra}, cwd=ROOT).start()
    try:
        rc = proc.wait(timeout)
        reason = None if rc == 0 else f"exit {rc}"
    except subprocess.TimeoutExpired:
        rc, reason = TIMED_OUT, f"timeout after {timeout:.0f} s"
    finally:
        proc.stop(grace_s=0)   # the whole group, at once (a no-op once it exited)
    text = log_path.read_text(errors="replace")
    lines = [ln.strip()[:300] for ln in text.splitlines() if KV_LINES.search(ln)]
    err = [ln.strip()[:300] for ln in text.splitlines() if "Error" in ln and "Tokenizer" not in ln][-3:]
    return {"name": name, "rc": rc, "failure": reason, "wall_s": round(time.time() - t0, 1),
            "vllm_log": lines[-12:], "errors": err if rc else []}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m harness.engines.vllm.offline_plan", description=__doc__.split("\n")[0])
    p.add_argument("plan")
    p.add_argument("out_dir")
    p.add_argument("--only", nargs="*", default=None, help="run only these names")
    p.add_argument("--timeout", type=float, default=420.0, help="seconds per run before its process group is killed")
    p.add_argument("--skip-done", action="store_true",
                   help="skip the runs summary.json records as ended (finished or failed, not timed out)")
    p.add_argument("--budget-s", type=float, default=None,
                   help="seconds this call may spend: no run starts that is not expected to end within them")
    p.add_argument("--first-run-s", type=float, default=240.0,
                   help="with --budget-s: the expected length of a run before one has finished in this call")
    args = p.parse_args(argv)
    plan = json.loads(Path(args.plan).read_text())
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    summary_path = out_dir / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else []
    runs = [{**plan.get("defaults", {}), **r} for r in plan["runs"]]
    unknown = set(args.only or ()) - {r["name"] for r in runs}
    if unknown:
        p.error(f"--only {sorted(unknown)}: not in {args.plan}")
    env_extra = {k: str(v) for k, v in plan.get("env", {}).items()}
    done = {s["name"] for s in summary if s["rc"] != TIMED_OUT} if args.skip_done else set()
    t0, expected = time.time(), args.first_run_s
    for run in runs:
        if args.only and run["name"] not in args.only:
            continue
        if run["name"] in done:
            print(f"[offline_plan] {run['name']}: done before, skipped (--skip-done)", flush=True)
            continue
        left = None if args.budget_s is None else args.budget_s - (time.time() - t0)
        if left is not None and left < expected:
            todo = [r["name"] for r in runs if r["name"] not in done and (not args.only or r["name"] in args.only)]
            print(f"[offline_plan] budget: {left:.0f} s left, a run is expected to take {expected:.0f} s; "
                  f"stopping before {run['name']} ({len(todo)} of the plan's runs not done)", flush=True)
            break
        print(f"[offline_plan] {run['name']} ...", flush=True)
        res = run_one(run, out_dir, args.timeout if left is None else min(args.timeout, left), env_extra)
        if res["rc"] == 0:
            done.add(run["name"])
            expected = 1.5 * res["wall_s"]   # the host has compiled what the first run needed
        summary = [s for s in summary if s["name"] != run["name"]] + [res]
        summary_path.write_text(json.dumps(summary, indent=2))
        print(f"[offline_plan] {run['name']}: rc={res['rc']} in {res['wall_s']} s "
              f"{'; '.join(res['vllm_log'][-2:])}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
