"""One offline vLLM run (in-process engine) under a commit strategy; prints and writes a JSON result.

    python -m harness.engines.vllm.offline --model-dir DIR --strategy treewy --num-spec 3 \\
        --acceptance-rates 0.90,0.75,0.59 --prompts 256 --prompt-len 1024 --output-len 256 \\
        --gmu 0.6 --out result.json

What it reports comes from vLLM itself: the KV-cache plan its scheduler uses (blocks,
block sizes, pages per request, the maximum concurrency it logs), its spec-decode
counters, and, sampled at every scheduler step, running/waiting requests, KV-pool
usage and preemptions. Token-id prompts (seeded), greedy, ignore-EOS. The engine
side imports only vLLM, torch and ``strategies``.

``--profile-dir DIR`` turns the timed run into a diagnostic: vLLM's torch profiler records
``--profile-steps`` engine steps after ``--profile-delay`` of them (a trace, and vLLM's table of
self time per op, whose head the result keeps under ``profile``), e.g. to compare where two
strategies' steps spend their time at equal batch.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import random
import sys
import time
from math import ceil
from pathlib import Path
from typing import Any

from .plugin import (ENV_BUFFER_LEN, ENV_FAULT, ENV_KERNELS, ENV_PROBE, ENV_SHADOW, ENV_STRATEGY, STRATEGIES,
                     needs_piecewise)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m harness.engines.vllm.offline", description=__doc__.split("\n")[0])
    p.add_argument("--model-dir", required=True, help="HF model dir (python -m harness.engines.vllm.model_dir)")
    p.add_argument("--strategy", choices=STRATEGIES, default="store_all")
    p.add_argument("--buffer-len", type=int, default=None,
                   help="replay / treewy_deferred ring buffer (tokens; default conf/strategies/<strategy>.yaml's)")
    p.add_argument("--num-spec", type=int, default=3, help="MTP draft tokens k (0: no speculation)")
    p.add_argument("--acceptance-rates", default="",
                   help="synthetic acceptance: unconditional per-position rates, e.g. 0.90,0.75,0.59")
    p.add_argument("--load-format", default="dummy", help="dummy | commitbench_random (seeded N(0, 1/fan_in))")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--max-model-len", type=int, default=4096)
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--max-num-batched-tokens", type=int, default=None)
    p.add_argument("--gmu", type=float, default=None, help="gpu_memory_utilization (GPU)")
    p.add_argument("--kv-cache-bytes", type=int, default=None, help="kv_cache_memory_bytes (CPU: the KV pool)")
    p.add_argument("--eager", action="store_true", help="enforce_eager (no torch.compile, no CUDA graphs)")
    p.add_argument("--prompts", type=int, default=64)
    p.add_argument("--prompt-len", type=int, default=1024)
    p.add_argument("--output-len", type=int, default=256)
    p.add_argument("--warmup", type=int, default=0, help="requests generated (and not timed) first, e.g. one "
                   "batch's worth, so Triton's JIT and the first shapes stay out of the timing")
    p.add_argument("--logprobs", type=int, default=0, help="top logprobs per output token (near-tie checks)")
    p.add_argument("--logprobs-mode", default=None, help="vLLM's logprobs_mode, e.g. raw_logits: the target's own "
                   "logits (in the model dtype), so a near tie can be measured in units in the last place")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--prompt-ids", default=None, help="a JSON file of token-id prompts (a list of lists) to run "
                   "instead of --prompts random ones of --prompt-len")
    p.add_argument("--tokens", action="store_true", help="include every request's output token ids")
    p.add_argument("--probe-dir", default=None, help="record committed GDN states per step (plugin probe)")
    p.add_argument("--shadow", default="", help="with store_all and --probe-dir: strategies to run beside "
                   "vLLM's kernel on the same inputs, e.g. treewy,replay,treewy_deferred")
    p.add_argument("--fault", default="", help="a deliberate commit mistake (harness/engines/vllm/faults.py): "
                   "the in-engine acceptance gate's mutation tests only")
    p.add_argument("--skip-generate", action="store_true", help="start, report the KV plan, stop")
    p.add_argument("--profile-dir", default=None,
                   help="torch-profile engine steps of the timed run into DIR (traces and vLLM's table of self time "
                        "per op: CUDA time on a GPU, CPU time on CPU); the run is then a diagnostic, not a timing")
    p.add_argument("--profile-steps", type=int, default=20, help="with --profile-dir: engine steps to record")
    p.add_argument("--profile-delay", type=int, default=50,
                   help="with --profile-dir: engine steps of the timed run to skip first (the batch filling up)")
    p.add_argument("--out", default=None, help="also write the JSON result here")
    args = p.parse_args(argv)
    if args.num_spec < 0:
        p.error(f"--num-spec={args.num_spec}: must be >= 0")
    rates = [float(x) for x in args.acceptance_rates.split(",") if x.strip()]
    if rates and (len(rates) != args.num_spec or any(not 0 <= r <= 1 for r in rates)
                  or any(b > a for a, b in zip(rates, rates[1:]))):
        p.error(f"--acceptance-rates={args.acceptance_rates}: need {args.num_spec} non-increasing rates in [0, 1]")
    args.rates = rates
    return args


def ssm_state_dtype(model_dir: str) -> str | None:
    """The GDN state dtype the model's config asks for (``mamba_ssm_dtype``). vLLM applies it by itself
    only to Qwen3.5 architectures; Qwen3-Next's states would otherwise take the model dtype (bf16)."""
    try:
        cfg = json.loads((Path(model_dir) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    return cfg.get("mamba_ssm_dtype") or cfg.get("text_config", {}).get("mamba_ssm_dtype")


def engine_kwargs(args: argparse.Namespace, architecture: str, on_cpu: bool) -> dict[str, Any]:
    kw: dict[str, Any] = dict(
        model=args.model_dir, load_format=args.load_format, skip_tokenizer_init=True, dtype=args.dtype,
        max_model_len=args.max_model_len, max_num_seqs=args.max_num_seqs, enable_prefix_caching=False,
        seed=args.seed, enforce_eager=args.eager, disable_log_stats=False,
        jit_monitor_verbose=True,   # one log record per Triton compile after the warm-up (JitCounter counts them)
    )
    if args.max_num_batched_tokens:
        kw["max_num_batched_tokens"] = args.max_num_batched_tokens
    if args.logprobs_mode:
        kw["logprobs_mode"] = args.logprobs_mode
    if args.gmu is not None:
        kw["gpu_memory_utilization"] = args.gmu
    if args.kv_cache_bytes is not None:
        kw["kv_cache_memory_bytes"] = args.kv_cache_bytes
    state_dtype = ssm_state_dtype(args.model_dir)
    if state_dtype:
        kw["mamba_ssm_cache_dtype"] = state_dtype
    if "ConditionalGeneration" in architecture:
        kw["language_model_only"] = True
    if not on_cpu:
        kw["gdn_prefill_backend"] = "triton"  # FlashInfer is not staged on the H200 host
        if not args.eager and needs_piecewise(args.strategy, os.environ.get(ENV_KERNELS)):
            kw["compilation_config"] = {"cudagraph_mode": "PIECEWISE"}
    if args.profile_dir:
        kw["profiler_config"] = profiler_config(args, on_cpu)
    if args.num_spec:
        spec: dict[str, Any] = {"method": "mtp", "num_speculative_tokens": args.num_spec}
        if args.rates:
            spec.update(rejection_sample_method="synthetic", synthetic_acceptance_rates=args.rates)
        kw["speculative_config"] = spec
    return kw


def profiler_config(args: argparse.Namespace, on_cpu: bool) -> dict[str, Any]:
    """vLLM's profiler settings (``ProfilerConfig``, the same fields in 0.26 and 0.32) for ``--profile-dir``: the
    torch profiler over ``--profile-steps`` engine steps after ``--profile-delay`` of the timed run, no Python
    stacks (they dominate a trace's size), the per-kernel CUDA-time table where there is CUDA."""
    if args.profile_steps < 1 or args.profile_delay < 0:
        raise ValueError(f"--profile-steps {args.profile_steps} / --profile-delay {args.profile_delay}: record at "
                         "least one step, after zero or more")
    return {"profiler": "torch", "torch_profiler_dir": str(Path(args.profile_dir).resolve()),
            "torch_profiler_with_stack": False, "torch_profiler_dump_cuda_time_total": not on_cpu,
            "delay_iterations": args.profile_delay, "max_iterations": args.profile_steps,
            "ignore_frontend": True}   # the offline engine's steps are the engine core's; no frontend to trace


class JitCounter(logging.Handler):
    """Counts vLLM's JIT-monitor records (a Triton kernel compiled after the engine's warm-up) by kernel,
    from the moment :meth:`start` is called: a compile inside the timed run is in its elapsed time."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.counts: dict[str, int] | None = None

    def start(self) -> "JitCounter":
        self.counts = {}
        return self

    def emit(self, record: logging.LogRecord) -> None:
        if self.counts is None:
            return
        from .scrape import jit_compiles

        for name, n in jit_compiles(record.getMessage()).items():
            self.counts[name] = self.counts.get(name, 0) + n


def kv_plan_report(llm, tokens_per_request: int) -> dict[str, Any]:
    """The KV-cache plan vLLM's scheduler holds: blocks, groups, pages per request, concurrency."""
    from vllm.v1.core.kv_cache_utils import get_max_concurrency_for_kv_cache_config

    core = llm.llm_engine.engine_core.engine_core
    kcc = core.scheduler.kv_cache_config
    vcfg = llm.llm_engine.vllm_config
    groups, per_request = [], 0
    for g in kcc.kv_cache_groups:
        s = g.kv_cache_spec
        spec_blocks = getattr(s, "num_speculative_blocks", None)
        need = (1 + spec_blocks) if spec_blocks is not None else ceil(tokens_per_request / s.block_size)
        per_request += need
        groups.append({"type": type(s).__name__, "layers": len(g.layer_names), "block_size": s.block_size,
                       "page_size_bytes": s.page_size_bytes, "num_speculative_blocks": spec_blocks,
                       "shapes": [list(x) for x in getattr(s, "shapes", ())], "blocks_per_request": need})
    return {
        "num_blocks": kcc.num_blocks,
        "groups": groups,
        "max_concurrency_max_model_len": get_max_concurrency_for_kv_cache_config(vcfg, kcc),
        "blocks_per_request": per_request,
        "tokens_per_request": tokens_per_request,
        "max_concurrency_per_request": kcc.num_blocks / per_request,
        # The attention groups' block size (vLLM raised it so one page covers a GDN page).
        "block_size": next((g["block_size"] for g in groups if g["num_speculative_blocks"] is None),
                           vcfg.cache_config.block_size),
        "mamba_page_size_padded": vcfg.cache_config.mamba_page_size_padded,
    }


class SchedulerSampler:
    """Wraps the in-process scheduler: running/waiting/KV usage at every step, preemptions."""

    def __init__(self, llm):
        self.sched = llm.llm_engine.engine_core.engine_core.scheduler
        self.samples: list[tuple[float, int, int, float]] = []
        self.preemptions = 0
        schedule, preempt = self.sched.schedule, self.sched._preempt_request

        def sampled_schedule(*a, **kw):
            out = schedule(*a, **kw)
            self.samples.append((time.perf_counter(), len(self.sched.running), len(self.sched.waiting),
                                 float(self.sched.kv_cache_manager.usage)))
            return out

        def counted_preempt(*a, **kw):
            self.preemptions += 1
            return preempt(*a, **kw)

        self.sched.schedule = sampled_schedule
        self.sched._preempt_request = counted_preempt

    def summary(self) -> dict[str, Any]:
        if not self.samples:
            return {"steps": 0}
        running = [s[1] for s in self.samples]
        return {"steps": len(self.samples), "peak_running": max(running),
                "mean_running": sum(running) / len(running), "peak_waiting": max(s[2] for s in self.samples),
                "peak_kv_usage": max(s[3] for s in self.samples), "preemptions": self.preemptions}


class AcceptanceRecorder:
    """Wraps the in-process scheduler's ``update_from_output``: the drafts each request's verify steps accepted,
    in step order, as the scheduler counts them (accepted = tokens sampled - 1 on a step that verified drafts), and
    only the steps it counts: not a request's output that arrives after it finished (async scheduling runs a step
    ahead: on vLLM 0.26's GPU path those came back and were counted, 287 steps against vLLM's 276) or a stale one."""

    def __init__(self, llm):
        sched = llm.llm_engine.engine_core.engine_core.scheduler
        self.accepted: dict[str, list[int]] = {}
        self.drafted: dict[str, list[int]] = {}
        update = sched.update_from_output

        def recorded(scheduler_output, model_runner_output, *a, **kw):
            spec = getattr(scheduler_output, "scheduled_spec_decode_tokens", None) or {}
            sampled = getattr(model_runner_output, "sampled_token_ids", None)
            index = getattr(model_runner_output, "req_id_to_index", None) or {}
            if spec and sampled is not None:
                for req_id, drafts in spec.items():
                    req = sched.requests.get(req_id)
                    if req is None or req.is_finished() or getattr(req, "num_stale_output_tokens", 0) > 0:
                        continue                     # update_from_output skips these too
                    if drafts and req_id in index:
                        got = len(sampled[index[req_id]])
                        if got:
                            self.accepted.setdefault(req_id, []).append(got - 1)
                            self.drafted.setdefault(req_id, []).append(len(drafts))
            return update(scheduler_output, model_runner_output, *a, **kw)

        sched.update_from_output = recorded

    @staticmethod
    def of(table: dict[str, list[int]], request_id: str) -> list[int]:
        """A request's list: the scheduler may know it under the output's id plus a suffix (``0-1a2b``)."""
        if request_id in table:
            return table[request_id]
        hits = [v for k, v in table.items() if k.startswith(request_id + "-")]
        if len(hits) > 1:
            raise RuntimeError(f"request {request_id}: {len(hits)} scheduler requests match it")
        return hits[0] if hits else []


def spec_counters(llm) -> dict[str, Any]:
    """vLLM's spec-decode counters; acceptance length = 1 + accepted / drafts (as vllm bench serve)."""
    out: dict[str, Any] = {}
    for m in llm.get_metrics():
        if m.name.startswith("vllm:spec_decode"):
            name = m.name.removeprefix("vllm:")
            if hasattr(m, "values"):
                out[name] = list(m.values)
            elif hasattr(m, "value"):
                out[name] = m.value
    drafts, accepted = out.get("spec_decode_num_drafts"), out.get("spec_decode_num_accepted_tokens")
    if drafts:
        out["acceptance_length"] = 1 + accepted / drafts
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ[ENV_STRATEGY] = args.strategy
    if args.buffer_len is None:                       # the run value of conf/strategies/, else the plugin's default
        from ...strategy_configs import options

        args.buffer_len = options().get(args.strategy, {}).get("buffer_len")
    if args.buffer_len is not None:
        os.environ[ENV_BUFFER_LEN] = str(args.buffer_len)
    if args.fault:
        os.environ[ENV_FAULT] = args.fault
    if args.probe_dir:
        os.environ[ENV_PROBE] = args.probe_dir
    if args.shadow:
        if args.strategy != "store_all" or not args.probe_dir:
            print("--shadow needs --strategy store_all and --probe-dir", file=sys.stderr)
            return 2
        os.environ[ENV_SHADOW] = args.shadow
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # in-process: the sampler can see the scheduler
    config = json.loads((Path(args.model_dir) / "config.json").read_text())
    architecture = config["architectures"][0]

    import torch
    import vllm
    from vllm import LLM, SamplingParams
    from vllm.platforms import current_platform

    from ...provenance import git_commit, package_version

    on_cpu = current_platform.is_cpu()
    kwargs = engine_kwargs(args, architecture, on_cpu)
    t0 = time.perf_counter()
    llm = LLM(**kwargs)
    startup = time.perf_counter() - t0
    result: dict[str, Any] = {
        "engine": "vllm",
        "weights": args.load_format,
        "acceptance": ("synthetic" if args.rates else "model") if args.num_spec else "none",
        "strategy": args.strategy, "buffer_len": args.buffer_len, "num_spec": args.num_spec,
        "fault": args.fault or None,
        "acceptance_rates": args.rates, "architecture": architecture,
        "engine_kwargs": {k: v for k, v in kwargs.items() if k != "model"},
        "model_dir": str(args.model_dir),
        "startup_s": startup,
        "kv_cache": kv_plan_report(llm, args.prompt_len + args.output_len),
        # As the engine resolved it (vLLM may lower the mode it was asked for; the capture lines in its
        # log say what it captured).
        "cudagraph_mode": str(llm.llm_engine.vllm_config.compilation_config.cudagraph_mode),
        "provenance": {
            "vllm": vllm.__version__, "torch": torch.__version__, "triton": package_version("triton"),
            "python": platform.python_version(),
            "device": "cpu" if on_cpu else torch.cuda.get_device_name(0), "host": platform.node(),
            "git_commit": git_commit(), "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        },
    }
    if not args.skip_generate:
        rng = random.Random(args.seed)
        vocab = (config.get("text_config") or config)["vocab_size"]
        if args.prompt_ids:
            prompts = [{"prompt_token_ids": [int(t) for t in ids]}
                       for ids in json.loads(Path(args.prompt_ids).read_text())]
        else:
            prompts = [{"prompt_token_ids": [rng.randrange(10, vocab - 10) for _ in range(args.prompt_len)]}
                       for _ in range(args.prompts)]
        params = SamplingParams(max_tokens=args.output_len, temperature=0.0, ignore_eos=True,
                                logprobs=args.logprobs or None)
        if args.warmup:
            llm.generate(prompts[:args.warmup], params, use_tqdm=False)
        sampler = SchedulerSampler(llm)
        recorder = AcceptanceRecorder(llm) if args.num_spec and args.tokens else None
        jit = JitCounter()
        logging.getLogger("vllm.utils.jit_monitor").addHandler(jit.start())
        if args.profile_dir:
            llm.start_profile()
        t1 = time.perf_counter()
        outs = llm.generate(prompts, params, use_tqdm=False)
        elapsed = time.perf_counter() - t1
        if args.profile_dir:
            llm.stop_profile()
            # vLLM's table of self time per op: profiler_out_<rank>.txt in 0.26, <trace prefix>.profiler_out.txt in 0.32
            tables = sorted(Path(args.profile_dir).glob("*profiler_out*.txt"))
            result["profile"] = {
                "dir": str(args.profile_dir), "steps": args.profile_steps, "delay": args.profile_delay,
                "note": "profiled: the timed run's numbers include the profiler's overhead",
                "files": sorted(p.name for p in Path(args.profile_dir).iterdir()),
                "table_head": tables[0].read_text().splitlines()[:60] if tables else None}
        n_out = sum(len(o.outputs[0].token_ids) for o in outs)
        result.update({
            "elapsed_s": elapsed, "requests": len(outs), "output_tokens": n_out,
            "output_throughput_tok_s": n_out / elapsed,
            "total_throughput_tok_s": (n_out + sum(len(p["prompt_token_ids"]) for p in prompts)) / elapsed,
            "scheduler": sampler.summary(), "spec_decode": spec_counters(llm),
            # Triton compiles inside the timed run ({} = none): their seconds are in elapsed_s. None when the
            # engine core runs in a child process, whose log records this process never sees.
            "jit_compiles_during_run": jit.counts if os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING") == "0"
            else None,
        })
        if jit.counts:
            print(f"note: vLLM compiled {jit.counts} during the timed run (--warmup did not cover them)",
                  file=sys.stderr, flush=True)
        from .plugin import gdn_path
        result["plugin"] = {"gdn_path": gdn_path()}
        if args.tokens:
            result["tokens"] = [list(o.outputs[0].token_ids) for o in outs]
            result["request_ids"] = [o.request_id for o in outs]      # prompt order, as the engine names them
            if recorder is not None:                                  # drafts accepted per verify step
                result["accepted_per_step"] = [recorder.of(recorder.accepted, o.request_id) for o in outs]
                result["drafted_per_step"] = [recorder.of(recorder.drafted, o.request_id) for o in outs]
            if args.logprobs:
                result["logprobs"] = [[{str(t): lp.logprob for t, lp in step.items()} for step in o.outputs[0].logprobs]
                                      for o in outs]
    text = json.dumps(result)
    print("RESULT " + text, flush=True)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=2))
    del llm
    return 0


if __name__ == "__main__":
    sys.exit(main())
