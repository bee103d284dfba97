"""``engine=vllm``: sweep points against a real vLLM OpenAI server, in the simulator's result schema.

One :class:`VLLMEngine` lives for a whole sweep. For each point it

1. works out the server's settings (model dir, strategy via the plugin, gmu or KV bytes,
   ``max_num_seqs``, ``num_speculative_tokens``, synthetic acceptance rates, prefix caching off),
   reusing the running server when they match and restarting it when they do not;
2. sends warm-up requests (not counted);
3. offers the point's requests with :mod:`.loadgen` while :mod:`.scrape` samples ``/metrics``;
4. diffs the counters (acceptance length, preemptions), checks prefix caching stayed off and the
   server is still alive, and returns per-request records plus telemetry.

A server that fails to start (bad model dir, OOM, port taken, never healthy) or dies mid-run
raises :class:`~.server.ServerFailed`; the sweep records the point as failed with that message
and goes on. Every server is stopped, process group and all, when the sweep ends or is
interrupted. Weights are ``load_format=dummy`` and acceptance is vLLM's synthetic acceptance
(``rejection_sample_method=synthetic``): every result says so.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from workloads import Arrival, Request

from ...telemetry import PERCENTILES
from ..base import Point, PointResult, register_engine
from . import host_state, loadgen, scrape
from .plugin import ENV_KERNELS, SAVES_NOTHING, STRATEGIES, needs_piecewise
from .server import ServerFailed, ServerSettings, VLLMServer, server_tags

DEFAULT_MODEL_ROOT = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "commitbench" / "models"


# Load formats that invent the weights (vLLM's dummy, the plugin's seeded commitbench_random): their outputs mean
# nothing; any other reads the model dir's own weights (the trained Qwen3-Next, results/trained-qwen3next/).
RANDOM_WEIGHTS = ("dummy", "commitbench_random")


def model_dir_for(point: Point, cfg: Mapping[str, Any]) -> Path:
    """``engine.model_dir`` as given, else a generated dir (config.json + tokenizer) per model config."""
    if cfg["model_dir"]:
        return Path(cfg["model_dir"]).expanduser()
    from .model_dir import hf_config, write

    text = json.dumps(hf_config(point.model), sort_keys=True)
    root = Path(cfg["model_root"] or DEFAULT_MODEL_ROOT).expanduser()
    out = root / f"{point.model.name}-{hashlib.sha256(text.encode()).hexdigest()[:10]}"
    if not (out / "tokenizer.json").is_file():
        tmp = out.with_name(out.name + f".tmp{os.getpid()}")
        write(point.model, tmp)
        try:
            tmp.rename(out)
        except OSError:   # another process wrote it first
            shutil.rmtree(tmp, ignore_errors=True)
    return out


def settings_for(point: Point, cfg: Mapping[str, Any], model_dir: Path) -> ServerSettings:
    tree = point.tree
    rates: tuple[float, ...] = ()
    num_spec = 0
    if tree is not None:
        if not tree.is_chain:
            raise ValueError(f"draft={tree.label.removesuffix('+root')}: vLLM's MTP proposer drafts chains only; "
                             "run tree shapes on the simulator (engine=sim) or use draft=chain:K")
        num_spec = tree.num_drafts
        if cfg["synthetic_acceptance"]:
            from ..acceptance_rates import rates_for

            rates = tuple(float(r) for r in rates_for(tree, cfg["acceptance"]))
    env_map = {str(k): str(v) for k, v in (cfg["env"] or {}).items()}
    tp = int(cfg["tensor_parallel_size"])
    if tp > 1:
        env_map.setdefault("NCCL_NVLS_ENABLE", "0")   # NVLink multicast off: the GPU hosts require it
    env = tuple(sorted(env_map.items()))
    strategy = point.strategy if tree is not None else "store_all"
    mode = cfg["cudagraph_mode"]
    if mode is None and needs_piecewise(strategy, env_map.get(ENV_KERNELS)):
        mode = "PIECEWISE"
    capture = cfg["max_cudagraph_capture_size"]
    if capture is not None and (isinstance(capture, bool) or not isinstance(capture, int) or capture < 1):
        raise ValueError(f"engine.max_cudagraph_capture_size={capture!r}: must be a whole number of tokens >= 1, "
                         "or null for vLLM's default")
    return ServerSettings(
        model_dir=str(model_dir), strategy=strategy,
        buffer_len=point.strategy_options.get("buffer_len"), num_spec=num_spec, acceptance_rates=rates,
        gmu=None if cfg["kv_cache_bytes"] else point.gmu,
        kv_cache_bytes=int(cfg["kv_cache_bytes"]) if cfg["kv_cache_bytes"] else None,
        max_model_len=point.max_model_len, max_num_seqs=point.max_num_seqs,
        max_num_batched_tokens=point.max_num_batched_tokens, load_format=cfg["load_format"],
        dtype=point.model.dtype, ssm_cache_dtype=point.model.state_dtype,
        enforce_eager=bool(cfg["enforce_eager"]),
        cudagraph_mode=mode, max_cudagraph_capture_size=capture,
        language_model_only=point.model.architecture.endswith("ForConditionalGeneration"),
        gdn_prefill_backend=cfg["gdn_prefill_backend"], tensor_parallel_size=tp,
        extra_args=tuple(cfg["extra_args"] or ()), env=env)


def device_name() -> str:
    """The GPU's name from nvidia-smi (no torch import in the harness), else the CPU's."""
    if shutil.which("nvidia-smi"):
        try:
            out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                                 text=True, timeout=10).stdout.strip().splitlines()
            if out:
                return f"{out[0]}" + (f" x{len(out)}" if len(out) > 1 else "")
        except (OSError, subprocess.SubprocessError):
            pass
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return f"cpu: {line.split(':', 1)[1].strip()} x{os.cpu_count()}"
    except OSError:
        pass
    return f"cpu: {platform.processor() or platform.machine()} x{os.cpu_count()}"


def _get(url: str, timeout: float = 5.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read().decode()


@register_engine("vllm")
class VLLMEngine:
    """Runs points on a real vLLM server: starts one per :class:`ServerSettings`, waits for its health, drives it
    over HTTP, scrapes ``/metrics``, and stops it (also when a point fails)."""

    @classmethod
    def runs_strategy(cls, name: str) -> str | None:
        """Why vLLM cannot run the registered strategy ``name`` (None: it can): the plugin runs vLLM's own
        store_all and the strategies with a paged stash layout in vLLM's state pool."""
        if name in STRATEGIES:
            return None
        if name in SAVES_NOTHING:
            return SAVES_NOTHING[name]
        return (f"vLLM runs {', '.join(STRATEGIES)} (the plugin needs a paged stash layout in vLLM's state pool, "
                f"strategies/paged.py, which {name} does not have); run it with engine=sim, or in `memory`, "
                "`bench strategies` and the acceptance gate")

    def __init__(self, cfg: Mapping[str, Any], log_dir: Path | None = None):
        self.cfg = dict(cfg)
        self.log_dir = Path(log_dir) if log_dir else Path(self.cfg["log_dir"] or "results/engine-logs")
        self.server: VLLMServer | None = None
        self.settings: ServerSettings | None = None
        self.starts = 0
        self.startup: dict[str, Any] = {}
        self.failed: dict[ServerSettings, str] = {}   # settings whose server would not start: fail fast
        # where run() is: "idle", "starting", "warm-up" or "measured run" (for watchers: the tests that kill or
        # stop the server wait for "measured run" rather than guessing how long the warm-up takes)
        self.phase = "idle"

    # -- lifecycle ---------------------------------------------------------------------------
    def _ensure_server(self, settings: ServerSettings) -> VLLMServer:
        if self.server is not None and self.settings == settings and self.server.alive():
            return self.server
        self.close()
        if settings in self.failed:
            raise ServerFailed(f"not retried in this sweep: {self.failed[settings]}")
        self.starts += 1
        tag = f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}-{self.starts}-{settings.strategy}"
        server = VLLMServer(settings, self.log_dir / f"vllm-{tag}.log", port=self.cfg["port"],
                            startup_timeout_s=float(self.cfg["startup_timeout_s"]))
        what = (f"strategy={settings.strategy} k={settings.num_spec} "
                + (f"kv_cache_bytes={settings.kv_cache_bytes}" if settings.kv_cache_bytes else f"gmu={settings.gmu}")
                + f" max_num_seqs={settings.max_num_seqs}")
        print(f"starting vLLM ({what}); log {server.log_path}", file=sys.stderr, flush=True)
        try:
            server.start()
        except ServerFailed as e:
            self.failed[settings] = str(e).splitlines()[0]
            raise
        print(f"vLLM healthy after {server.started_s:.0f} s on {server.url}", file=sys.stderr, flush=True)
        self.server, self.settings = server, settings
        self.startup = self._describe_start(server)
        return server

    def _describe_start(self, server: VLLMServer) -> dict[str, Any]:
        s = scrape.parse_metrics(_get(server.url + "/metrics"))
        info = scrape.cache_config(s)
        if info.get("enable_prefix_caching", "False") != "False":
            server.stop()
            raise ServerFailed(f"prefix caching is on (cache_config_info enable_prefix_caching="
                               f"{info.get('enable_prefix_caching')}) although the server was started with "
                               "--no-enable-prefix-caching; check engine.extra_args")
        try:
            version = json.loads(_get(server.url + "/version")).get("version")
        except Exception:
            version = None
        facts = scrape.startup_facts(server.log_path.read_text(errors="replace"))
        return {"vllm_version": version, "device": device_name(), "cache_config": info,
                "startup_s": server.started_s, "log": str(server.log_path),
                "argv": server.settings.argv(server.port, server.served_name)[1:], **facts}

    def close(self) -> None:
        if self.server is not None:
            self.server.stop()
        self.server, self.settings = None, None

    # -- one point -----------------------------------------------------------------------------
    def run(self, point: Point) -> PointResult:
        try:
            return self._run(point)
        finally:
            self.phase = "idle"

    def _run(self, point: Point) -> PointResult:
        model_dir = model_dir_for(point, self.cfg)
        settings = settings_for(point, self.cfg, model_dir)
        self.phase = "starting"
        server = self._ensure_server(settings)
        vocab = int(point.model.vocab_size)
        self.phase = "warm-up"
        warm = self._warm_up(server, point, vocab)
        log_at = _log_size(server.log_path)
        before = scrape.counters(scrape.parse_metrics(_get(server.url + "/metrics")))
        watch = host_state.HostWatch(_other_servers(server))    # the /proc scan before the sampler's clock starts
        sampler = scrape.Sampler(server.url, float(self.cfg["metrics_hz"]))
        watch.start()
        self.phase = "measured run"
        res = loadgen.run(server.url, server.served_name, list(point.requests), point.arrival, vocab=vocab,
                          seed=point.seed, request_timeout_s=float(self.cfg["request_timeout_s"]),
                          during=sampler.loop, watchdog=self._watchdog(server), progress=self._progress(point))
        host = watch.stop()
        if res.aborted:
            finished = sum(r.finish_s is not None for r in res.records)
            self._abandon(server, f"{res.aborted}; {finished} of {len(point.requests)} requests had finished")
        if not server.alive():
            rc = server.process.returncode() if server.process else None
            failed = sum(r.error is not None for r in res.records)
            self._abandon(server, f"vLLM died during the run (exit code {rc}); {failed} of {len(point.requests)} "
                                  "requests failed")
        timeouts = sum(1 for r in res.records if (r.error or "").startswith("timeout"))
        if timeouts and not server.healthy():
            self._abandon(server, f"vLLM stopped answering: {timeouts} of {len(point.requests)} requests got no data "
                                  f"for {self.cfg['request_timeout_s']} s (engine.request_timeout_s) and "
                                  "/health did not answer")
        after = scrape.counters(scrape.parse_metrics(_get(server.url + "/metrics")))
        diff = scrape.counter_diff(before, after)
        jit = scrape.jit_compiles(_log_since(server.log_path, log_at))
        if jit:
            print(f"  note: vLLM compiled {', '.join(f'{k} x{v}' for k, v in sorted(jit.items()))} during the "
                  f"measured run of {point.strategy} {point.arrival.describe()}: each compile stalls the batch "
                  "(recorded as telemetry.jit_compiles_during_run)", file=sys.stderr, flush=True)
        hits = diff.get("vllm:prefix_cache_hits_total")
        if hits:
            raise ServerFailed(f"prefix caching served {hits:.0f} cached tokens during the run although it should "
                               "be off; results would not measure the KV pool")
        return PointResult(engine="vllm", requests=res.records, telemetry=self._telemetry(point, res, sampler, diff,
                                                                                          warm, jit, host))

    def _watchdog(self, server: VLLMServer):
        """Beside the load: the server's process and /health; a reason to stop the run, or never returns."""
        every = float(self.cfg["health_every_s"])
        timeout = float(self.cfg["health_timeout_s"])
        allowed = int(self.cfg["health_failures"])

        async def watch() -> str | None:
            import asyncio

            import aiohttp

            fails = 0
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as session:
                while True:
                    await asyncio.sleep(every)
                    if not server.alive():
                        rc = server.process.returncode() if server.process else None
                        return f"vLLM died during the run (exit code {rc})"
                    try:
                        async with session.get(server.url + "/health") as r:
                            ok = r.status == 200
                    except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
                        ok = False
                    fails = 0 if ok else fails + 1
                    if fails >= allowed:
                        return (f"vLLM stopped answering: /health failed {fails} times in a row ({timeout:g} s "
                                "each; engine.health_timeout_s, engine.health_failures)")

        return watch

    def _abandon(self, server: VLLMServer, reason: str) -> None:
        """Stop the server (its whole process group) and fail the point with ``reason`` and the log's tail."""
        log, tail = server.log_path, server.log_tail()
        self.close()
        raise ServerFailed(f"{reason}; its process group is killed. Log {log}:\n{tail}")

    def _progress(self, point: Point):
        """A line on stderr every engine.progress_s seconds of a measured run: long points show life."""
        every = float(self.cfg["progress_s"])
        n, done, t0 = len(point.requests), [0], time.perf_counter()
        last = [t0]
        label = f"{point.strategy} {point.arrival.describe()}"

        def tick() -> None:
            done[0] += 1
            now = time.perf_counter()
            if every > 0 and now - last[0] >= every and done[0] < n:
                last[0] = now
                print(f"  {label}: {done[0]}/{n} requests done after {now - t0:.0f} s", file=sys.stderr, flush=True)

        return tick

    def _warm_up(self, server: VLLMServer, point: Point, vocab: int) -> dict[str, Any]:
        """Short requests before the measured level, not counted: one per slot of the level's concurrency
        (the engine's batch cap for open-loop arrivals), at least engine.warmup_requests.

        Filling the batch matters: whatever runs once per new batch shape (e.g. a Triton kernel compiled
        for a new specialisation of its integer arguments) would otherwise land in the first wave's TTFT.
        On the H200 the first 64 requests of a c64 level waited 2.7 s for it against <= 0.65 s for the
        other 192 (results/h200-vllm-treewy-fused, warmed with 4 requests).
        """
        n = int(self.cfg["warmup_requests"])
        if n <= 0:
            return {"requests": 0}
        conc = min(point.arrival.max_concurrency or point.max_num_seqs, point.max_num_seqs)
        n = max(n, conc)   # the extra requests wait for a slot, as the level's own do
        reqs = [Request(prompt_len=min(64, point.requests[i % len(point.requests)].prompt_len), output_len=16)
                for i in range(n)]
        t0 = time.perf_counter()
        res = loadgen.run(server.url, server.served_name, reqs, Arrival(kind="closed", max_concurrency=conc),
                          vocab=vocab, seed=point.seed + 7919,
                          request_timeout_s=float(self.cfg["request_timeout_s"]))
        errors = [r.error for r in res.records if r.error]
        if len(errors) == n:
            raise ServerFailed(f"every warm-up request failed (first: {errors[0]}); log {server.log_path}:\n"
                               f"{server.log_tail()}")
        return {"requests": n, "seconds": time.perf_counter() - t0, "errors": len(errors)}

    def _telemetry(self, point: Point, res: loadgen.LoadResult, sampler: scrape.Sampler, diff: dict[str, Any],
                   warm: dict[str, Any], jit: dict[str, int], host: dict[str, Any] | None) -> dict[str, Any]:
        st = self.startup
        info = st.get("cache_config", {})
        num_blocks = int(info["num_gpu_blocks"]) if info.get("num_gpu_blocks", "None") not in ("None", "") else None
        block_size = int(info["block_size"]) if str(info.get("block_size", "")).isdigit() else None
        itl = res.itl_s
        # the memory-bound evidence is the samples' (scrape.Sampler.summary): requests waiting, seats free and
        # the pool's usage in one /metrics sample, and the preemption counter
        samples = sampler.summary(point.max_num_seqs)
        s = self.settings
        return {
            "engine": "vllm",
            "vllm_version": st.get("vllm_version"),
            "device": st.get("device"),
            "weights": (f"load_format={s.load_format} (random weights: outputs are meaningless, timings are real)"
                        if s.load_format in RANDOM_WEIGHTS else f"load_format={s.load_format} ({s.model_dir})"),
            "acceptance": ("synthetic " + json.dumps(list(s.acceptance_rates))) if s.acceptance_rates
            else ("measured: the model's own MTP drafts" if s.num_spec else "none (no speculation)"),
            "server": {"argv": st.get("argv"), "startup_s": st.get("startup_s"), "log": st.get("log"),
                       "strategy": s.strategy, "buffer_len": s.buffer_len, "restarts": self.starts,
                       "gdn_commit": _gdn_commit(s.strategy, dict(s.env), st.get("device") or "", st.get("log")),
                       "graph_mode": st.get("graph_mode"),
                       "graph_capture": st.get("graph_capture"),
                       "max_cudagraph_capture_size_requested": "none (enforce_eager)" if s.enforce_eager
                       else s.max_cudagraph_capture_size or "vLLM's default",
                       "cudagraph_mode_requested": s.cudagraph_mode or ("none (enforce_eager)" if s.enforce_eager
                                                                        else "vLLM's default"),
                       "cache_config": info},
            "num_blocks": num_blocks,
            "block_size": block_size,
            "kv_cache_tokens": st.get("kv_cache_tokens"),
            "blocks_per_request_max_len": -(-point.max_model_len // block_size) if block_size else None,
            "max_concurrency_max_len": st.get("max_concurrency_max_len"),
            **samples,
            # None where the server exported no counter: unknown, not "never"
            "preemptions": (None if diff.get("vllm:num_preemptions_total") is None
                            else int(diff["vllm:num_preemptions_total"])),
            "requests_waited_for_memory": None,    # vLLM exports no per-request wait for blocks
            "spec_decode": diff["spec_decode"],
            "counters": {k: v for k, v in diff.items() if k != "spec_decode"},
            "prefix_caching": "off (cache_config_info enable_prefix_caching=False; "
                              f"{int(diff.get('vllm:prefix_cache_hits_total') or 0)} hits)",
            "spec_state_bytes": None,
            # vllm bench serve's ITL: the gaps between streamed chunks (one chunk may carry several tokens under
            # speculative decoding), over every request's chunks
            "itl_s": ({"mean": float(itl.mean()), **{f"p{p}": float(np.percentile(itl, p)) for p in PERCENTILES}}
                      if len(itl) else {"mean": None, **{f"p{p}": None for p in PERCENTILES}}),
            "loadgen": res.check,
            "warmup": warm,
            # Triton kernels vLLM's JIT monitor saw compiled inside the measured run ({} = none): the warm-up
            # did not cover a specialisation, and the point's timings include the compile.
            "jit_compiles_during_run": jit,
            # the host's CPUs and GPUs over the measured run (host_state.py says why a vLLM point records them)
            "host": host,
            "duration_s": res.duration_s,
            # The measured run on time.time() (s since the epoch): where a clock in the server (the H200
            # probes' step clock) finds the point's steps; provenance.time_utc is whole seconds, after analysis.
            "run_wall_s": (None if res.started_wall is None
                           else [res.started_wall, res.started_wall + res.duration_s]),
        }


def _log_size(path: Path | None) -> int:
    try:
        return path.stat().st_size if path is not None else 0
    except OSError:
        return 0


def _log_since(path: Path | None, offset: int) -> str:
    """The server log's text from byte ``offset`` on ('' when there is no log)."""
    if path is None:
        return ""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def _gdn_commit(strategy: str, env: dict[str, str], device: str, log: str | None = None) -> str:
    """Which code ran the GDN verify/commit in the server: what the plugin wrote in the server's log
    (its COMMITBENCH_GDN_PATH line), else what its settings imply, said so. ``device`` is
    :func:`device_name`'s answer, which names a CPU as ``cpu: ...``."""
    if strategy == "store_all":
        return "vLLM's own kernel (store_all)"
    if log:
        try:
            said = scrape.gdn_path(Path(log).read_text(errors="replace"))
        except OSError:
            said = None
        if said:
            return said["code"]
    choice = env.get("COMMITBENCH_KERNELS", "auto")
    on_gpu = bool(device) and not device.startswith("cpu: ")
    if choice == "triton" or (choice == "auto" and on_gpu):
        code = "Triton paged op (strategies/kernels/paged)" + ("" if on_gpu else ", interpreted")
    else:
        code = "torch reference (strategies/paged)"
    return code + " (inferred from the settings: the server's log does not say)"


def _other_servers(server: VLLMServer) -> int | None:
    """Live processes of vLLM servers other than ``server`` (a stopped server's leftovers, or another
    harness's), by the tag every server's processes inherit; None off Linux."""
    if not Path("/proc").is_dir():
        return None
    return sum(tag != server.served_name for tag in server_tags().values())
