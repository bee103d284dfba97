#!/usr/bin/env bash
# The in-engine acceptance gate on the GPU host (vLLM 0.26, staged with ../shared/device/stage_vllm.sh), in the call
# that unpacks vLLM's last chunk or any later call on the same host (carry .whl and .devrun):
#   bash .vllm-bundle/cN/unpack.sh && bash results/trained-qwen3next/device/gate.sh eager     # ~3-5 min
#   bash results/trained-qwen3next/device/gate.sh graphs                                    # next call
#   bash results/trained-qwen3next/device/gate.sh sweep      # sweep=trained_qwen3next -> $OUT/trained-sweep.tgz
# Every strategy runs the plugin's Triton op (COMMITBENCH_KERNELS auto on CUDA) on the committed trained weights,
# real MTP drafts, greedy: `eager` as on CPU (every strategy, speculation off, the torch reference on the host's
# CPU); `graphs` store_all and treewy in vLLM's default CUDA-graph mode. Results under $OUT/gate-<mode>/ (gate.json
# and every engine run's JSON and log).
set -uo pipefail
source /tmp/vllm-site/vllm_env.sh
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/cbsite .whl/*.whl
export PYTHONPATH=/tmp/cbsite:${PYTHONPATH:-}
source harness/engines/vllm/device_setup.sh
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$OUT/gpu.txt" 2>&1
python3 -c 'import vllm, torch, triton, transformers; print(vllm.__version__, torch.__version__, triton.__version__, transformers.__version__)' > "$OUT/versions.txt" 2>&1
# Two eager engines at a time share the GPU (0.2 of its memory each is ample for a 2.6 M-parameter model); compiled
# ones run one at a time: two profiling at once left the second no memory for its KV cache (H100, 2026-12-07).
case "${1:-eager}" in
  eager) timeout 540 python3 -m harness acceptance vllm kv_cache_bytes=null gmu=0.2 out="$OUT/gate-eager" 2>&1 \
           | tee "$OUT/gate-eager.txt" ;;
  graphs) timeout 540 python3 -m harness acceptance vllm kv_cache_bytes=null gmu=0.2 eager=false parallel=1 \
            'strategy=[store_all,treewy]' spec_off=false reference=false out="$OUT/gate-graphs" 2>&1 \
            | tee "$OUT/gate-graphs.txt" ;;
  sweep) gpu=h200; grep -q "H100" "$OUT/gpu.txt" && gpu=h100         # the GPU's constants for the KV plan
         [ -d results/trained-qwen3next/gpu-sweep ] && [ ! -d /tmp/trained-sweep ] \
           && cp -r results/trained-qwen3next/gpu-sweep /tmp/trained-sweep           # resume a committed part
         timeout 540 python3 -m harness sweep sweep=trained_qwen3next gpu=$gpu report=false time_budget_s=480 \
           out=/tmp/trained-sweep 2>&1 | tee "$OUT/trained-sweep.txt"
         tar czf "$OUT/trained-sweep.tgz" -C /tmp trained-sweep ;;
  *) echo "gate.sh: eager, graphs or sweep, not $1" >&2; exit 2 ;;
esac
exit "${PIPESTATUS[0]}"            # the gate's verdict (the sweep: its tar's status)
