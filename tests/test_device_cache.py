"""The compile-cache carrier between GPU hosts (results/h200-kernel-speed/device/cache.sh), run here on fake
caches: packed into parts, brought back over several calls' $OUT, collected into the checkout's part folders,
stashed and restored on a "fresh host" (another HOME) byte for byte; a corrupt or missing part is refused, not
unpacked, and a newer pack replaces the parts of an older one."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "results" / "h200-kernel-speed" / "device" / "cache.sh"

pytestmark = pytest.mark.skipif(
    any(shutil.which(t) is None for t in ("bash", "tar", "gzip", "split", "sha256sum", "find")),
    reason="cache.sh needs bash, tar, gzip, split, sha256sum and GNU find")


def _caches(home: Path, seed: int) -> dict[str, bytes]:
    """A vLLM-like cache tree under ``home``: 3.5 MiB of incompressible bytes, so it packs into 4 parts of 1 MiB."""
    rnd = __import__("random").Random(seed)
    files = {".cache/vllm/torch_compile_cache/1aab200f30/triton_cache/k.cubin": rnd.randbytes(3 << 20),
             ".cache/vllm/modelinfos/qwen3_5.json": b'{"ok": true}',
             ".triton/cache/abc/kernel.json": rnd.randbytes(1 << 19)}
    for rel, data in files.items():
        (home / rel).parent.mkdir(parents=True, exist_ok=True)
        (home / rel).write_bytes(data)
    return files


def _run(tmp: Path, home: Path, *args: str, out: Path | None = None) -> str:
    env = {**os.environ, "HOME": str(home), "PART_MIB": "1", "OUT_MIB": "3",
           "DEVCACHE": str(tmp / "checkout-devcache"), "DEVCACHE_PACK": str(tmp / "host-pack"),
           "DEVCACHE_STASH": str(tmp / "host-stash")}
    if out is not None:
        env["OUT"] = str(out)
    p = subprocess.run(["bash", str(SCRIPT), *args], env=env, capture_output=True, text=True, cwd=tmp)
    assert p.returncode == 0, p.stdout + p.stderr
    return p.stdout


def _bring_back(tmp: Path, home: Path, call: int, *args: str) -> str:
    """One device call: a fresh $OUT, the command, then its files collected into the checkout."""
    out = tmp / f"call-{call}"
    out.mkdir()
    said = _run(tmp, home, *args, out=out)
    if (out / "devcache").exists():
        said += _run(tmp, home, "collect", str(out))
    return said


def test_caches_travel_in_parts_and_come_back_byte_for_byte(tmp_path):
    host1 = tmp_path / "host1"
    files = _caches(host1, seed=1)
    said = _bring_back(tmp_path, host1, 1, "pack")
    assert "in 4 part(s)" in said
    left = re.search(r"still on the host: ([0-9 ]+)\n", said)
    assert left, said                       # 4 MiB of parts do not fit one call's 3 MiB
    said = _bring_back(tmp_path, host1, 2, "out", *left.group(1).split())
    assert "compile cache: 4 of 4 part(s) here" in said, said
    # the same host packs again only where the caches changed
    assert "unchanged" in _run(tmp_path, host1, "pack", out=tmp_path / "call-3")

    host2 = tmp_path / "host2"
    host2.mkdir()
    assert "none stashed" in _run(tmp_path, host2, "restore")
    assert "4 part(s)" in _run(tmp_path, host2, "stash")
    assert "restored" in _run(tmp_path, host2, "restore")
    for rel, data in files.items():
        assert (host2 / rel).read_bytes() == data, rel
    assert "earlier on this host" in _run(tmp_path, host2, "restore")


def test_a_corrupt_or_missing_part_is_refused_and_a_newer_pack_replaces_an_older(tmp_path):
    host1 = tmp_path / "host1"
    _caches(host1, seed=2)
    said = _bring_back(tmp_path, host1, 1, "pack")
    assert "missing part" in said           # only what fitted came back
    host2 = tmp_path / "host2"
    host2.mkdir()
    _run(tmp_path, host2, "stash")
    assert "not restored" in _run(tmp_path, host2, "restore")
    left = re.search(r"still on the host: ([0-9 ]+)\n", said).group(1).split()
    _bring_back(tmp_path, host1, 2, "out", *left)
    _run(tmp_path, host2, "stash")
    stashed = sorted((tmp_path / "host-stash").glob("part-*"))
    data = bytearray(stashed[1].read_bytes())
    data[100] ^= 0xFF
    stashed[1].write_bytes(bytes(data))
    assert "checksum mismatch" in _run(tmp_path, host2, "restore")
    assert not (host2 / ".cache").exists()

    # the caches change on the host (another strategy compiled): the new pack's parts replace the old ones
    (host1 / ".cache/vllm/torch_compile_cache/fb6e831b3f").mkdir(parents=True)
    (host1 / ".cache/vllm/torch_compile_cache/fb6e831b3f/x").write_bytes(b"replay")
    old = (tmp_path / "checkout-devcache/p00/manifest.txt").read_text()
    said = _bring_back(tmp_path, host1, 3, "pack")
    assert "packed" in said and "fb6e831b3f" in (tmp_path / "checkout-devcache/p00/manifest.txt").read_text()
    assert all((d / "manifest.txt").read_text() != old for d in (tmp_path / "checkout-devcache").glob("p*"))
