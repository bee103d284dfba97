"""The acceptance gate: exact on correct strategies, and it catches wrong commits (mutation tests)."""

from __future__ import annotations

import copy

import pytest
import torch
import yaml

import strategies
from harness.acceptance.gate import run_gate
from harness.acceptance.model import TinyConfig, TinyHybrid, drafter_of
from harness.acceptance.speculative import Drafter, greedy, speculative
from strategies.treewy import TreeWY

CFG = yaml.safe_load(open("conf/check_acceptance.yaml"))


def small(**over):
    cfg = copy.deepcopy(CFG)
    cfg.update(prompts={"count": 2, "max_tokens": 24, "seed": 0, "categories": None}, max_new_tokens=24,
               dtypes=["float64"], drafts=["chain:3", "2,2,2"], tree_sweep=None, tree_sweep_out=None, baseline=None)
    cfg.update(over)
    return cfg


def test_speculative_decoding_is_lossless_in_float64():
    target = TinyHybrid(TinyConfig(), torch.float64)
    drafter = Drafter(drafter_of(target, 0.03))
    prompt = list(range(5, 30))
    ref = greedy(target, prompt, 24)
    for widths in ((1, 1, 1), (3, 3, 3), (3, 2, 1)):
        for gdn in (None, strategies.get("treewy"), strategies.get("store_all"), strategies.get("treewy_deferred")):
            out = speculative(target, drafter, prompt, 24, widths, gdn)
            assert out.tokens == ref.tokens
            assert sum(out.accepted) > 0  # drafts were accepted, so deep commits were exercised


def test_gate_passes_every_correct_strategy():
    res = run_gate(small(dtypes=["float64", "float32"]))
    assert res.passed, res.failures
    names = {(r.strategy, r.draft) for r in res.rows}
    assert ("replay", "chain:3") in names and ("replay", "2,2,2") not in names  # replay: chains only
    assert all(r.agree == 1.0 for r in res.rows if r.dtype == "float64")


class OffByOne(TreeWY):
    """Commits the node after the accepted one (a classic off-by-one on num_accepted_tokens)."""

    def _commit(self, carry, verified, accepted):
        return super()._commit(carry, verified, (accepted + 1).clamp(max=verified.shape.N - 1))


class SkipDecay(TreeWY):
    """Rebuilds the accepted state without the decays along the path."""

    def _commit(self, carry, verified, accepted):
        v = copy.copy(verified)
        v.stash = {**verified.stash, "G": torch.zeros_like(verified.stash["G"])}
        return super()._commit(carry, v, accepted)


class LastNode(TreeWY):
    """Commits the last draft node whatever was accepted."""

    def _commit(self, carry, verified, accepted):
        return super()._commit(carry, verified, torch.full_like(accepted, verified.shape.N - 1))


@pytest.mark.parametrize("mutant", [OffByOne, SkipDecay, LastNode])
def test_gate_catches_a_wrong_commit_and_names_the_first_diverging_step(mutant):
    res = run_gate(small(strategy=["treewy"]), strategy_factory=lambda name, widths: mutant())
    assert not res.passed
    first = res.failures[0]
    assert "first diverging step" in first or "first diverging token" in first
    assert "prompt 0" in first and "treewy chain:3 float64" in first
    assert any(r.verdict == "FAIL" for r in res.rows)


def test_baseline_drift_is_caught(tmp_path):
    import json

    path = tmp_path / "baseline.json"
    path.write_text(json.dumps({"mean_acceptance_length": {"chain:3": 1.0, "2,2,2": 9.0}}))
    res = run_gate(small(strategy=["store_all"], baseline=str(path)))
    assert any("pinned 1.0000" in f and "the model, drafter or prompts changed" in f for f in res.failures)


class Bf16Drift(TreeWY):
    """Commits a state 10% too large, in bfloat16 only: a precision bug the float64 and float32 rows cannot see."""

    def _commit(self, carry, verified, accepted):
        h = super()._commit(carry, verified, accepted)
        return h * 1.1 if h.dtype == torch.bfloat16 else h


def _bf16(**over):
    cfg = copy.deepcopy(CFG)
    cfg.update(dtypes=["bfloat16"], drafts=["chain:3"], tree_sweep=None, tree_sweep_out=None, baseline=None)
    cfg.update(over)
    return cfg


def test_bf16_rows_follow_the_reference_path_and_pass_the_correct_strategies():
    """bf16 runs decode along the bf16 reference's tokens (free-running, one flipped near-tie changes the text
    and the acceptance length with it): every correct strategy passes, store_all and treewy agreeing at every
    step, the deferred ones differing only at choices within bf16_tie_ulps of a tie."""
    res = run_gate(_bf16())
    assert res.passed, res.failures
    rows = {r.strategy: r for r in res.rows}
    assert rows["store_all"].agree == 1.0 and rows["treewy"].agree == 1.0
    assert all(abs(r.length - r.ref_length) < CFG["bf16_tolerance"] / 2 for r in res.rows)


def test_bf16_drift_is_caught_at_a_choice_rounding_cannot_flip():
    res = run_gate(_bf16(strategy=["treewy"]), strategy_factory=lambda name, widths: Bf16Drift())
    assert not res.passed
    assert "bf16 ulps from a tie (at most 8)" in res.failures[0], res.failures
    # the mean length alone would have passed it: the rule that catches it is the per-step one
    assert abs(res.rows[0].length - res.rows[0].ref_length) < CFG["bf16_tolerance"]


def test_a_followed_decode_is_the_reference_s_text():
    target = TinyHybrid(TinyConfig(), torch.bfloat16)
    drafter = Drafter(drafter_of(TinyHybrid(TinyConfig(), torch.float64), 0.03))
    prompt = list(range(5, 30))
    ref = speculative(target, drafter, prompt, 24, (2, 2, 2), None)
    out = speculative(target, drafter, prompt, 24, (2, 2, 2), Bf16Drift(), follow=ref)
    assert out.tokens == ref.tokens and out.nodes == ref.nodes and len(out.accepted) == len(ref.accepted)
