#!/usr/bin/env bash
# one end-to-end call: CALL name, then sweep overrides; the folder resumes across calls (tarred to $OUT).
# The preset's anchor (store_all c128: at gmu 0.9 in e2e/final, at gmu 0.6 from capture2048 on) runs first in
# every call with work, measured again from the second call on. Name the same CALL in every call of a campaign
# so they share one folder.
# The sweep gets the call's time left as time_budget_s, so it stops before a server start or point that would
# not finish, rather than being killed with it; `timeout` stays as the backstop. CALL_T0 (epoch seconds): when
# the call began, if it did other work first (the unpack).
set -u
CALL=$1; shift
T0=${CALL_T0:-$(date +%s)}
LIMIT=${CALL_LIMIT:-600}           # the host's per-call limit, s
case "$T0$LIMIT" in *[!0-9]*) echo "e2e.sh: CALL_T0=$T0 and CALL_LIMIT=$LIMIT must be whole seconds" >&2; exit 2;; esac
source results/h200-kernel-speed/device/env.sh
D="/tmp/e2e-$CALL"
# a fresh host resumes the campaign from its committed folder (results/h200-kernel-speed/e2e/CALL), if any
if [ ! -d "$D" ] && [ -d "results/h200-kernel-speed/e2e/$CALL" ]; then
  cp -r "results/h200-kernel-speed/e2e/$CALL" "$D" && echo "resuming from results/h200-kernel-speed/e2e/$CALL"
fi
# vLLM's compile caches from an earlier host, if their parts were carried here (cache.sh: a server start is then
# ~100 s instead of 300-370 s; the caches change what a start compiles, not what a run measures)
[ -d .devcache ] && bash results/h200-kernel-speed/device/cache.sh stash
bash results/h200-kernel-speed/device/cache.sh restore
# leave ~60 s for the analysis, the report, stopping the server and the tar; under 120 s no point fits
BUDGET=$(( LIMIT - 60 - ($(date +%s) - T0) ))
if [ "$BUDGET" -lt 120 ]; then
  echo "only $BUDGET s of the call left: sweep skipped" | tee "$OUT/sweep-$CALL.log"
  (exit 0)
else
  timeout $(( BUDGET + 35 )) python3 -m harness sweep sweep=h200_kernel_speed \
     requests_from.sharegpt=.devdata/sharegpt.jsonl time_budget_s=$BUDGET "$@" "out=$D" > "$OUT/sweep-$CALL.log" 2>&1
fi
rc=$?
echo "[$(( $(date +%s) - T0 ))s] sweep rc=$rc (budget ${BUDGET} s)"; tail -15 "$OUT/sweep-$CALL.log"
[ -d "$D" ] && tar czf "$OUT/e2e-$CALL.tgz" -C /tmp "e2e-$CALL"
# the compile caches, for later hosts: where a strategy compiled in this call, a new snapshot in 15 MiB parts,
# as many brought back beside the results as a call may return (`cache.sh collect <files_at>` here; calls of
# `cache.sh out` bring the rest). Bounded by the call's time left, and after the results are in $OUT
# CACHE_PACK=0 skips it: a new session's checkout holds only what git tracks, so the parts outlive only the
# session that brought them back, and a session that keeps its one host has no use for them
sz=$(du -smc ~/.cache/vllm ~/.triton/cache 2>/dev/null | tail -1 | cut -f1); echo "compile caches: ${sz:-?} MiB"
left=$(( LIMIT - 15 - ($(date +%s) - T0) ))
if [ "${CACHE_PACK:-1}" != 0 ] && [ "$left" -gt 10 ]; then timeout $left bash results/h200-kernel-speed/device/cache.sh pack || echo "cache pack stopped (rc $?)"; fi
echo "[$(( $(date +%s) - T0 ))s] done"
