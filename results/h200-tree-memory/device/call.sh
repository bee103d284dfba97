#!/usr/bin/env bash
# One device call of the tree-memory plan (../plan.json): unpack vLLM where this host has not yet, then as many
# startups as the call's time allows, resuming what earlier calls finished (on this host in /tmp/tree-memory-<plan>,
# on a fresh one from ../runs*/ when it was brought back here). Brings every run's record and log back as one
# archive, $OUT/runs-<plan>.tgz: a call returns at most 8 files, and a plan's runs make 20 or more.
#   PLAN (plan.json; plan-h100.json where no H200 is lent): which startups, their records in runs/ (runs-h100/)
#   CALL_LIMIT (560): seconds this call may take; RUN_TIMEOUT (400): seconds per startup
set -u
T0=$(date +%s)
LIMIT=${CALL_LIMIT:-560}
HERE=results/h200-tree-memory
PLAN=${PLAN:-plan.json}
NAME=$(basename "$PLAN" .json)                 # plan -> runs, plan-h100 -> runs-h100
KEEP=$HERE/runs${NAME#plan}
if [ ! -f /tmp/vllm-site/vllm_env.sh ]; then
  last=$(ls -d .vllm-bundle/c* 2>/dev/null | sort -V | tail -1)
  [ -n "$last" ] && [ -f "$last/unpack.sh" ] \
    || { echo "no vLLM on this host and no .vllm-bundle/cN/unpack.sh carried"; exit 3; }
  bash "$last/unpack.sh" || exit 3
fi
source results/h200-kernel-speed/device/env.sh
echo "[$(( $(date +%s) - T0 ))s] env ready"
RUNS=/tmp/tree-memory-$NAME
mkdir -p $RUNS
if [ ! -f $RUNS/summary.json ] && [ -f $KEEP/summary.json ]; then
  cp $KEEP/*.json $KEEP/*.log $RUNS/ 2>/dev/null
  echo "resuming from $KEEP ($(python3 -c "import json; print(len(json.load(open('$RUNS/summary.json'))))") runs)"
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > $RUNS/gpu.txt
python3 -m harness.engines.vllm.offline_plan $HERE/$PLAN $RUNS --skip-done --timeout ${RUN_TIMEOUT:-400} \
  --budget-s $(( LIMIT - ($(date +%s) - T0) - 20 ))
cp $OUT/versions.txt $RUNS/ 2>/dev/null
(cd $RUNS && tar czf $OUT/runs-$NAME.tgz *.json *.log gpu.txt versions.txt 2>/dev/null)
echo "[$(( $(date +%s) - T0 ))s] done: $(ls $RUNS/*.json | wc -l) files in $OUT/runs-$NAME.tgz"
