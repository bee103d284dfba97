#!/usr/bin/env bash
# last chunk: unpack vLLM, then the layer benchmark (vLLM's kernel as baseline), gluon's GPU tests at its
# new default tiles, and the in-vLLM shadow check (eager, store_all + three shadows)
set -u
T0=$(date +%s)
bash .vllm-bundle/c3/unpack.sh || exit 3
[ -n "${UNPACK_ONLY:-}" ] && exit 0
source results/h200-kernel-speed/device/env.sh
echo "[$(( $(date +%s) - T0 ))s] env ready"
timeout ${LAYER_TIMEOUT:-260} python3 -m harness bench kernels 'sections=[layer]' out=$OUT/layer.json > $OUT/layer.log 2>&1
rc=$?; echo "[$(( $(date +%s) - T0 ))s] layer rc=$rc"; tail -3 $OUT/layer.log
timeout ${TEST_TIMEOUT:-110} python3 -m pytest -q tests/test_paged.py -k "gpu and gluon" -s > $OUT/tests-gpu.log 2>&1
rc=$?; echo "[$(( $(date +%s) - T0 ))s] tests rc=$rc"; tail -3 $OUT/tests-gpu.log
bash results/h200-kernel-speed/shadow-3c14ee8/shadow.sh
echo "[$(( $(date +%s) - T0 ))s] shadow done"
