#!/usr/bin/env bash
# last chunk, eighteenth session: unpack vLLM, then the op's host time per call with vLLM's kernel as the
# yardstick (launch_cost.py, no engine), and the in-vLLM shadow check on the current op (eager, store_all +
# three shadows). Results under $OUT/launch/ and $OUT/shadow/. The layer clock's side-by-side is the next call.
# LAUNCH_SPECS="treewy 128;replay 128" picks the (strategy batch) pairs; SHADOW=0 leaves the shadow check out.
set -u
T0=$(date +%s)
bash .vllm-bundle/c3/unpack.sh || exit 3
source results/h200-kernel-speed/device/env.sh
echo "[$(( $(date +%s) - T0 ))s] env ready"
mkdir -p $OUT/launch
lscpu | grep -E "Model name|^CPU\(s\)" > $OUT/launch/cpu.txt
IFS=';' read -ra specs <<< "${LAUNCH_SPECS:-treewy 16;treewy 128;treewy 256;replay 128;treewy_deferred 128}"
for spec in "${specs[@]}"; do
  set -- $spec
  timeout 90 python3 results/h200-kernel-speed/device/launch_cost.py --strategy $1 --batch $2 \
    --out $OUT/launch/launch-$1-b$2.json > $OUT/launch/launch-$1-b$2.log 2>&1
  rc=$?; echo "[$(( $(date +%s) - T0 ))s] launch $1 b$2 rc=$rc"; cat $OUT/launch/launch-$1-b$2.log | tail -7
done
[ "${SHADOW:-1}" = 1 ] && bash results/h200-kernel-speed/shadow-3c14ee8/shadow.sh
echo "[$(( $(date +%s) - T0 ))s] shadow done"
