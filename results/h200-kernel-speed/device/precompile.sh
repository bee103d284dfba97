#!/usr/bin/env bash
# one call that only compiles, for a call too short for the campaign's anchor plus a cold start: restore the
# carried compile caches, start STRATEGY's vLLM server once (one small point of the campaign's preset, gmu 0.9,
# c32, into a scratch folder: no anchor, not a result) and pack what it compiled (cache.sh), so a later call
# starts that strategy in ~90 s instead of 300-370 s. vLLM's cache key leaves out gmu and the load, so the
# graphs serve every point of that strategy. STRATEGY "none": the no-speculation server (draft=none).
# CALL_T0 and CALL_LIMIT as in e2e.sh. What it says, the point's log and its summary come back in $OUT.
set -u
S=${1:?precompile.sh STRATEGY: treewy, replay, treewy_deferred, store_all, or none (no speculation)}
T0=${CALL_T0:-$(date +%s)}
LIMIT=${CALL_LIMIT:-600}
case "$T0$LIMIT" in *[!0-9]*) echo "precompile.sh: CALL_T0=$T0 and CALL_LIMIT=$LIMIT must be whole seconds" >&2; exit 2;; esac
source results/h200-kernel-speed/device/env.sh
[ -d .devcache ] && bash results/h200-kernel-speed/device/cache.sh stash
bash results/h200-kernel-speed/device/cache.sh restore
if [ "$S" = none ]; then args=("strategy=[store_all]" "draft=[none]" baseline=store_all)
else args=("strategy=[$S]" "draft=[chain:3]" "baseline=$S"); fi
# the pack needs ~10 s for ~50 MiB; a start cut short still leaves what torch.compile wrote, so pack regardless
left=$(( LIMIT - 25 - ($(date +%s) - T0) ))
timeout "$left" python3 -m harness sweep sweep=h200_kernel_speed replay.sharegpt=.devdata/sharegpt.jsonl \
   "gmu=[0.9]" "concurrency=[32]" "${args[@]}" anchor=null report=false "out=/tmp/precompile-$S" \
   > "$OUT/precompile-$S.log" 2>&1
rc=$?
echo "[$(( $(date +%s) - T0 ))s] sweep rc=$rc (limit $left s)"; tr '\r' '\n' < "$OUT/precompile-$S.log" | grep -E "starting vLLM|ready|ran |failed" | tail -5
# its summary (the server start's seconds, graph mode, GDN path): one file, so 4 parts still fit the 8 back
cp /tmp/precompile-"$S"/points/*/summary.json "$OUT/precompile-$S-summary.json" 2>/dev/null
left=$(( LIMIT - 8 - ($(date +%s) - T0) ))
if [ "$left" -gt 5 ]; then timeout "$left" bash results/h200-kernel-speed/device/cache.sh pack || echo "cache pack stopped (rc $?)"; fi
echo "[$(( $(date +%s) - T0 ))s] done"
