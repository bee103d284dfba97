"""Memory accounting reproduces the TreeWY paper's figures (ARCHITECTURE.md, reference numbers)."""

from pathlib import Path

import pytest

import strategies
from harness.config import load_model
from strategies import DraftTree, GDNShape, MiB

CHAIN3 = DraftTree.chain(3, root=True)      # the paper's depth-3 MTP chain, with vLLM's root token
TREE333 = DraftTree.from_widths((3, 3, 3), root=True)


@pytest.mark.parametrize("model, state_mib, fp32_mib, store_all_mib", [
    ("qwen35_35b", 30, 60, 120),
    ("qwen35_397b", 90, 180, 360),
])
def test_paper_state_sizes(model, state_mib, fp32_mib, store_all_mib):
    shape = load_model(model).gdn_shape()
    treewy = strategies.get("treewy").memory(shape, CHAIN3, state_dtype="bfloat16")
    assert treewy.recurrent_total_bytes == state_mib * MiB
    assert strategies.get("treewy").memory(shape, CHAIN3, state_dtype="float32").recurrent_total_bytes \
        == fp32_mib * MiB
    store = strategies.get("store_all").memory(shape, CHAIN3, state_dtype="bfloat16")
    assert store.recurrent_total_bytes == store_all_mib * MiB
    assert store.recurrent_total_bytes == 4 * treewy.recurrent_total_bytes


def test_snapshot_blocks_chain_vs_tree():
    store = strategies.get("store_all")
    assert store.footprint(CHAIN3)[0] == 4
    assert store.footprint(TREE333)[0] == 40
    # Without the root convention the count is the same: committed state + one per draft.
    assert store.footprint(DraftTree.from_widths((1, 1, 1)))[0] == 4
    for name in ("replay", "treewy", "treewy_deferred"):
        assert strategies.get(name).footprint(CHAIN3)[0] == 1


def test_stash_and_buffer_bytes_by_hand():
    shape = GDNShape(num_layers=30, num_key_heads=16, num_value_heads=32, key_head_dim=128, value_head_dim=128)
    token = (32 * 128 + 16 * 128 + 32) * 2  # ṽ/u (HV·V) + k (H·K) + g (HV), bf16
    assert shape.token_stash_bytes("bfloat16") == token
    assert strategies.get("treewy").memory(shape, TREE333).stash_bytes == 40 * token
    assert strategies.get("replay").memory(shape, CHAIN3).stash_bytes == 16 * token
    assert strategies.get("replay", buffer_len=8).memory(shape, CHAIN3).stash_bytes == 8 * token
    assert strategies.get("treewy_deferred").memory(shape, TREE333).stash_bytes == (40 + 16) * token
    assert strategies.get("store_all").memory(shape, TREE333).stash_bytes == 0


def test_conv_state_as_vllm_keeps_it():
    shape = load_model("qwen35_35b").gdn_shape()
    assert shape.conv_dim == 2 * 16 * 128 + 32 * 128 == 8192
    mem = strategies.get("store_all").memory(shape, CHAIN3, conv_dtype="bfloat16")
    assert mem.conv_bytes == 8192 * (4 - 1 + 3) * 2  # (conv_dim, K_conv - 1 + k), bf16


def test_speculative_bytes_exclude_the_one_committed_state():
    shape = load_model("qwen35_35b").gdn_shape()
    store = strategies.get("store_all").memory(shape, CHAIN3, state_dtype="bfloat16")
    assert store.speculative_bytes == 90 * MiB
    treewy = strategies.get("treewy").memory(shape, CHAIN3, state_dtype="bfloat16")
    assert treewy.speculative_bytes == 30 * 4 * shape.token_stash_bytes("bfloat16")
    assert treewy.total_bytes < store.total_bytes / 3


def test_bad_shapes_and_dtypes():
    with pytest.raises(ValueError, match="num_value_heads=3 is not a multiple of num_key_heads=2"):
        GDNShape(1, 2, 3, 4, 4)
    with pytest.raises(ValueError, match="num_layers=0"):
        GDNShape(0, 2, 4, 4, 4)
    with pytest.raises(ValueError, match="dtype='int7': unknown"):
        strategies.get("treewy").memory(GDNShape(1, 2, 4, 4, 4), CHAIN3, state_dtype="int7")
    with pytest.raises(ValueError, match=r"missing \['conv_kernel'\]"):
        GDNShape.from_config({"num_layers": 1, "num_key_heads": 1, "num_value_heads": 1,
                              "key_head_dim": 1, "value_head_dim": 1})


def test_the_tree_memory_table_reads_vllm_s_plans_and_failures(tmp_path):
    """results/h200-tree-memory/device/table.py on two real H200 startups (results/h200-plugin: k = 3, gmu 0.9,
    named as the tree-memory plan names them) and a failed start: vLLM's pages per GDN group (store_all 1 + k,
    treewy 1: the paper's 4 and 1), blocks per 4096-token request and pool, the simulator's pool beside them (its
    memory model was fitted to these startups: equal), the failure's error as that row's result."""
    import json
    import shutil
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    runs = tmp_path / "runs"
    runs.mkdir()
    for src, dst in (("start-0.9-store_all", "start-0.9-store_all-k3"), ("start-0.9-treewy", "start-0.9-treewy-k3")):
        shutil.copy(root / "results" / "h200-plugin" / "runs" / f"{src}.json", runs / f"{dst}.json")
    (runs / "summary.json").write_text(json.dumps([{"name": "start-0.6-store_all-k39", "rc": 1, "failure": "exit 1",
                                                    "errors": ["ValueError: not enough KV cache memory"]}]))
    proc = subprocess.run([sys.executable, str(root / "results" / "h200-tree-memory" / "device" / "table.py"),
                           str(runs)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = {r["name"]: r for r in json.loads((tmp_path / "table.json").read_text())}
    sa, tw = rows["start-0.9-store_all-k3"], rows["start-0.9-treewy-k3"]
    assert (sa["pages_per_group"], sa["blocks_per_request"], sa["num_blocks"]) == (4, 16, 2528)
    assert (tw["pages_per_group"], tw["blocks_per_request"], tw["num_blocks"]) == (1, 7, 2386)
    assert (sa["sim_num_blocks"], tw["sim_num_blocks"]) == (2528, 2386)
    assert rows["start-0.6-store_all-k39"]["status"] == "failed"
    assert "not enough KV cache memory" in rows["start-0.6-store_all-k39"]["error"]
    assert rows["start-0.9-store_all-k39"]["status"] == "not run" and rows["start-0.9-store_all-k39"]["sim_pages_per_group"] == 40
    assert "| 0.9 | 3 | store_all | 4 (4) | 16 | 1072 | 2528 | 158.00x |" in (tmp_path / "table.md").read_text()
