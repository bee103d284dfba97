"""A step clock inside vLLM's engine: when each engine step's work was dispatched and how long the host took.
A probe beside the harness, loaded as a second ``vllm.general_plugins`` entry point (this folder's dist-info)
when its folder is on PYTHONPATH; it changes nothing a step computes.

  export PYTHONPATH=results/h200-kernel-speed/device/stepclock:$PYTHONPATH COMMITBENCH_STEPCLOCK=/tmp/clock

Why: vLLM 0.26's per-iteration log stamps steps to the second only, so it cannot tell what makes treewy's mixed
prefill-decode steps slower than store_all's (``e2e/iteration-details-gmu0.9/``): the host launching each
eager layer (PIECEWISE mode runs attention and the GDN layers outside the graphs), or the device. Per step,
in the worker's process, this records (``time.perf_counter`` seconds, and ``time.time`` at the step's start for
matching a point's run):

- ``t0``/``t1``: ``GPUModelRunner.execute_model`` entered / returned (it builds the step's inputs and metadata
  and launches the forward pass; the CPU model runner subclasses it);
- ``tb``: the first GDN metadata build of the step returned (``GDNAttentionMetadataBuilder.build``; None
  without GDN layers). vLLM's build copies device tensors with CPU masks, which waits for the device: from
  ``t0`` to ``tb`` the host mostly waits for the previous step's device work, and from ``tb`` on the device is
  idle until the host launches this step's kernels;
- ``t2``/``t3``: ``sample_tokens`` entered / returned (sampling, rejection, the drafter's proposal);
- the step's shape from the scheduler: requests, tokens, requests with drafts (decodes) and prompt tokens
  (the tokens of requests without drafts that schedule more than one).

One JSON object per line in ``$COMMITBENCH_STEPCLOCK/steps-<pid>.jsonl``, appended every 64 steps or second
(a server is stopped with signals, so the rows must not wait for the process's exit).
``step_clock.py`` beside this folder reads them. Recording costs two ``perf_counter`` calls and a dict per step.
"""
from __future__ import annotations

import atexit
import functools
import json
import os
import threading
import time

ENV = "COMMITBENCH_STEPCLOCK"
FLUSH_EVERY = 64       # steps
FLUSH_AFTER_S = 1.0    # or seconds since the last append

_lock = threading.Lock()
_rows: list[dict] = []
_current: dict | None = None
_path: str | None = None
_flushed = 0.0


def _flush() -> None:
    global _rows, _flushed
    with _lock:
        rows, _rows, _flushed = _rows, [], time.perf_counter()
    if rows and _path:
        with open(_path, "a") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)


def shape(scheduler_output) -> dict:
    """Requests, tokens, decoding requests (those with drafts) and prompt tokens of one scheduled step."""
    n = dict(getattr(scheduler_output, "num_scheduled_tokens", {}) or {})
    spec = dict(getattr(scheduler_output, "scheduled_spec_decode_tokens", {}) or {})
    prompt = sum(t for rid, t in n.items() if rid not in spec and t > 1)
    return {"reqs": len(n), "tokens": int(getattr(scheduler_output, "total_num_scheduled_tokens", sum(n.values()))),
            "decode_reqs": len(spec), "prompt_tokens": int(prompt),
            "new_reqs": len(getattr(scheduler_output, "scheduled_new_reqs", []) or [])}


def _wrap_execute(fn):
    @functools.wraps(fn)
    def execute_model(self, scheduler_output, *args, **kwargs):
        global _current
        row = {"wall": time.time(), "t0": time.perf_counter(), "tb": None, **shape(scheduler_output)}
        _current = row
        try:
            return fn(self, scheduler_output, *args, **kwargs)
        finally:
            row["t1"] = time.perf_counter()
            if not row["tokens"]:            # nothing scheduled: no step (no sample_tokens follows)
                _current = None
    return execute_model


def _wrap_sample(fn):
    @functools.wraps(fn)
    def sample_tokens(self, *args, **kwargs):
        global _current
        row, t2 = _current, time.perf_counter()
        try:
            return fn(self, *args, **kwargs)
        finally:
            if row is not None:
                row["t2"], row["t3"] = t2, time.perf_counter()
                _current = None
                with _lock:
                    _rows.append(row)
                    full = len(_rows) >= FLUSH_EVERY or row["t3"] - _flushed > FLUSH_AFTER_S
                if full:
                    _flush()
    return sample_tokens


def _wrap_build(fn):
    @functools.wraps(fn)
    def build(*args, **kwargs):
        out = fn(*args, **kwargs)
        row = _current
        if row is not None and row["tb"] is None:
            row["tb"] = time.perf_counter()
        return out
    return build


def register() -> None:
    """vLLM calls this in every process it starts; only a process with the model runner is patched, and only
    where $COMMITBENCH_STEPCLOCK names a folder."""
    global _path
    folder = os.environ.get(ENV)
    if not folder:
        return
    try:
        from vllm.v1.worker import gpu_model_runner
    except Exception:          # a process without the worker's dependencies: nothing to clock here
        return
    cls = gpu_model_runner.GPUModelRunner
    if getattr(cls, "_commitbench_stepclock", False):
        return
    os.makedirs(folder, exist_ok=True)
    _path = os.path.join(folder, f"steps-{os.getpid()}.jsonl")
    cls.execute_model = _wrap_execute(cls.execute_model)
    cls.sample_tokens = _wrap_sample(cls.sample_tokens)
    try:
        from vllm.v1.attention.backends import gdn_attn

        gdn_attn.GDNAttentionMetadataBuilder.build = _wrap_build(gdn_attn.GDNAttentionMetadataBuilder.build)
    except Exception:          # a vLLM without GDN metadata (no hybrid models): the clock runs without tb
        pass
    cls._commitbench_stepclock = True
    atexit.register(_flush)
