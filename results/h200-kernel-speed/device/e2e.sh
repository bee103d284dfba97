#!/usr/bin/env bash
# one end-to-end call: CALL name, then sweep overrides; the folder resumes across calls (tarred to $OUT).
# The preset's anchor (store_all, gmu 0.9, c128) runs first in every call with work, measured again from the
# second call on. Name the same CALL in every call of a campaign so they share one folder.
set -u
CALL=$1; shift
T0=$(date +%s)
source results/h200-kernel-speed/device/env.sh
D=/tmp/e2e-$CALL
timeout ${E2E_TIMEOUT:-540} python3 -m harness sweep sweep=h200_kernel_speed replay.sharegpt=.devdata/sharegpt.jsonl \
   'draft=["chain:3"]' "$@" out=$D > $OUT/sweep-$CALL.log 2>&1
echo "[$(( $(date +%s) - T0 ))s] sweep rc=$?"; tail -15 $OUT/sweep-$CALL.log
tar czf $OUT/e2e-$CALL.tgz -C /tmp e2e-$CALL
du -sh ~/.cache/vllm ~/.triton/cache 2>/dev/null   # compile caches: small enough to carry to the next session?
