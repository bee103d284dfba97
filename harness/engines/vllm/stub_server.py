"""A stand-in OpenAI completions server that answers at once: for load-generator benchmarks and tests.

``POST /v1/completions`` streams ``chunks`` SSE chunks (one token each), a usage chunk and
``[DONE]`` with no delay; ``GET /health`` answers 200; ``GET /metrics`` serves a few vLLM gauges.
A raw asyncio protocol (uvloop when installed) rather than a web framework, so the stub, not the
server, is never what limits a benchmark of the client.

    python -m harness.engines.vllm.stub_server --port 8011 [--chunks 16] [--status 200] [--delay-ms 0]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal

HEADERS_SSE = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n"
               b"Connection: keep-alive\r\n\r\n")


METRICS = b'vllm:kv_cache_usage_perc{engine="0"} 0.0\nvllm:num_requests_running{engine="0"} 0\n'


def _chunk(payload: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(payload), payload)


def _plain(status: int, body: bytes, ctype: bytes = b"text/plain") -> bytes:
    reason = {200: b"OK", 404: b"Not Found", 500: b"Internal Server Error", 503: b"Service Unavailable"}
    return (b"HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %d\r\nConnection: keep-alive\r\n\r\n%s"
            % (status, reason.get(status, b"Error"), ctype, len(body), body))


class Stub(asyncio.Protocol):
    def __init__(self, chunks: int, status: int, delay_s: float = 0.0):
        self.chunks, self.status, self.delay_s = chunks, status, delay_s
        self.buf = b""
        self.served = 0

    def connection_made(self, transport) -> None:
        self.t = transport

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while True:
            head_end = self.buf.find(b"\r\n\r\n")
            if head_end < 0:
                return
            head = self.buf[:head_end].decode("latin-1")
            length = 0
            for line in head.split("\r\n")[1:]:
                k, _, v = line.partition(":")
                if k.strip().lower() == "content-length":
                    length = int(v.strip())
            if len(self.buf) < head_end + 4 + length:
                return
            body = self.buf[head_end + 4: head_end + 4 + length]
            self.buf = self.buf[head_end + 4 + length:]
            self.answer(head.split(" ", 2), body)

    def answer(self, request_line: list[str], body: bytes) -> None:
        method, path = request_line[0], request_line[1] if len(request_line) > 1 else "/"
        if path == "/health":
            self.t.write(_plain(200, b""))
        elif path == "/metrics":
            self.t.write(_plain(200, METRICS))
        elif method == "POST" and path == "/v1/completions":
            if self.status != 200:
                self.t.write(_plain(self.status, b'{"error": "stub configured to fail"}', b"application/json"))
                return
            req = json.loads(body or b"{}")
            n = min(self.chunks, int(req.get("max_tokens") or self.chunks))
            piece = b'data: {"object":"text_completion","choices":[{"index":0,"text":" t1","finish_reason":null}]}\n\n'
            usage = (b'data: {"object":"text_completion","choices":[],"usage":{"prompt_tokens":%d,'
                     b'"completion_tokens":%d}}\n\n' % (len(req.get("prompt") or []), n))
            out = [HEADERS_SSE] + [_chunk(piece)] * n + [_chunk(usage), _chunk(b"data: [DONE]\n\n"), b"0\r\n\r\n"]
            if self.delay_s > 0:   # a server that takes its time: the first chunk after delay_s
                loop = asyncio.get_running_loop()
                loop.call_later(self.delay_s, self._write_if_open, b"".join(out))
            else:
                self.t.write(b"".join(out))
        else:
            self.t.write(_plain(404, b"not found"))


    def _write_if_open(self, data: bytes) -> None:
        if not self.t.is_closing():
            self.t.write(data)


async def serve(port: int, chunks: int, status: int, delay_s: float = 0.0) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: Stub(chunks, status, delay_s), "127.0.0.1", port, backlog=4096)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print(f"stub server on 127.0.0.1:{port}, {chunks} chunks per request", flush=True)
    async with server:
        await stop.wait()


def spawn(*args: str, timeout_s: float = 30.0):
    """Start the stub in its own process (``args``: this module's flags after --port); returns the
    :class:`~.server.ManagedProcess` (stop it when done) and the stub's base URL."""
    import sys

    from .server import ManagedProcess, free_port

    port = free_port()
    proc = ManagedProcess([sys.executable, "-m", "harness.engines.vllm.stub_server", "--port", str(port), *args],
                          name="stub server", log_path=None)
    proc.start(health_url=f"http://127.0.0.1:{port}/health", timeout_s=timeout_s)
    return proc, f"http://127.0.0.1:{port}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--chunks", type=int, default=16)
    p.add_argument("--status", type=int, default=200, help="answer completions with this HTTP status")
    p.add_argument("--delay-ms", type=float, default=0.0, help="hold each completion this long before answering")
    a = p.parse_args(argv)
    try:
        import uvloop

        uvloop.run(serve(a.port, a.chunks, a.status, a.delay_ms / 1e3))
    except ImportError:
        asyncio.run(serve(a.port, a.chunks, a.status, a.delay_ms / 1e3))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
