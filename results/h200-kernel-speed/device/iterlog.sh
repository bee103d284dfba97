#!/usr/bin/env bash
# A probe beside a campaign, not part of it: points of the campaign's preset with vLLM's per-iteration log
# (--enable-logging-iteration-details: prompt and decode requests and tokens of every engine step), into their
# own folder /tmp/iterlog-NAME, tarred to $OUT/iterlog-NAME.tgz. Each further argument is one sweep's grid
# (space-separated overrides in one word), run in turn while the call has time, into /tmp/iterlog-NAME/gN
# (N: the grid's place in the list); a folder resumes on the same host. `python results/h200-kernel-speed/device/iteration_log.py <engine log>` reads the step times back.
#   CACHE_PACK=0 bash results/h200-kernel-speed/device/iterlog.sh gmu0.9-c256 \
#     "strategy=[store_all,treewy] gmu=[0.9] concurrency=[256] baseline=store_all"
# STEPCLOCK=1: the step clock (stepclock/) rides along into /tmp/iterlog-NAME/stepclock-gN, read with step_clock.py;
# with COMMITBENCH_STEPCLOCK_LAYERS=1 also its layer clock (host and device time of the GDN layers' parts per step).
# CALL_T0 and CALL_LIMIT as in e2e.sh.
set -u
NAME=$1; shift
T0=${CALL_T0:-$(date +%s)}
LIMIT=${CALL_LIMIT:-600}
case "$T0$LIMIT" in *[!0-9]*) echo "iterlog.sh: CALL_T0=$T0 and CALL_LIMIT=$LIMIT must be whole seconds" >&2; exit 2;; esac
source results/h200-kernel-speed/device/env.sh
# the host around each sweep: the second server of a call ran its host-paced steps 1.2-1.5x slower than the
# first, in either order (../e2e/layer-clock-eager2/); this says whether the first one's processes were still
# there, the CPUs busy or clocked down
host_state() {
  date -u; uptime
  awk '/MHz/ {s += $4; n++} END {if (n) printf "cpu MHz mean %.0f over %d\n", s / n, n}' /proc/cpuinfo
  ps -eo pid,ppid,pcpu,rss,etime,comm --sort=-pcpu | head -12
  nvidia-smi --query-gpu=memory.used,utilization.gpu,clocks.sm,temperature.gpu --format=csv,noheader 2>&1
}
D="/tmp/iterlog-$NAME"
bash results/h200-kernel-speed/device/cache.sh restore
n=0
for grid in "$@"; do
  n=$((n + 1))
  BUDGET=$(( LIMIT - 45 - ($(date +%s) - T0) ))   # the tar and stopping the server after the last sweep
  if [ "$BUDGET" -lt 120 ]; then echo "only $BUDGET s left: grid $n ($grid) skipped"; continue; fi
  read -ra overrides <<< "$grid"
  mkdir -p "$D"; host_state > "$D/host-g$n-before.txt"
  if [ "${STEPCLOCK:-0}" = 1 ]; then
    export PYTHONPATH="$PWD/results/h200-kernel-speed/device/stepclock:$PYTHONPATH" COMMITBENCH_STEPCLOCK="$D/stepclock-g$n"
  fi
  timeout $(( BUDGET + 30 )) python3 -m harness sweep sweep=h200_kernel_speed requests_from.sharegpt=.devdata/sharegpt.jsonl \
     'draft=[chain:3]' anchor=null report=false time_budget_s=$BUDGET \
     "engine.extra_args=[--enable-logging-iteration-details]" "${overrides[@]}" "out=$D/g$n" \
     > "$OUT/iterlog-$NAME-$n.log" 2>&1
  rc=$?; host_state > "$D/host-g$n-after.txt"
  echo "[$(( $(date +%s) - T0 ))s] grid $n ($grid): rc=$rc"; tail -6 "$OUT/iterlog-$NAME-$n.log"
done
[ -d "$D" ] && tar czf "$OUT/iterlog-$NAME.tgz" -C /tmp "iterlog-$NAME"
echo "[$(( $(date +%s) - T0 ))s] done"
