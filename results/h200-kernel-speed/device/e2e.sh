#!/usr/bin/env bash
# one end-to-end call: CALL name, then sweep overrides; the folder resumes across calls (tarred to $OUT).
# The preset's anchor (store_all, gmu 0.9, c128) runs first in every call with work, measured again from the
# second call on. Name the same CALL in every call of a campaign so they share one folder.
set -u
CALL=$1; shift
T0=$(date +%s)
source results/h200-kernel-speed/device/env.sh
D=/tmp/e2e-$CALL
# vLLM's and Triton's compile caches from an earlier session, if one was brought back (a server start is then
# ~100 s instead of ~250 s; the caches change what a start compiles, not what a run measures)
[ -f .devcache/compile-cache.tgz ] && tar xzf .devcache/compile-cache.tgz -C ~ && echo "compile caches restored"
timeout ${E2E_TIMEOUT:-540} python3 -m harness sweep sweep=h200_kernel_speed replay.sharegpt=.devdata/sharegpt.jsonl \
   'draft=["chain:3"]' "$@" out=$D > $OUT/sweep-$CALL.log 2>&1
echo "[$(( $(date +%s) - T0 ))s] sweep rc=$?"; tail -15 $OUT/sweep-$CALL.log
tar czf $OUT/e2e-$CALL.tgz -C /tmp e2e-$CALL
# the compile caches, for the next session's calls (carry .devcache): only if they fit one transfer
sz=$(du -smc ~/.cache/vllm ~/.triton/cache 2>/dev/null | tail -1 | cut -f1); echo "compile caches: ${sz:-?} MiB"
if [ "${sz:-999}" -lt 50 ]; then tar czf $OUT/compile-cache.tgz -C ~ .cache/vllm .triton/cache 2>/dev/null; fi
