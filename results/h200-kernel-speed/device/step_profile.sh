#!/usr/bin/env bash
# Where an engine step's GPU time goes, by batch size: vLLM's torch profiler over PROFILE_STEPS engine steps of
# the offline engine (`python -m harness.engines.vllm.offline --profile-dir`), one fresh process per (strategy,
# batch). Each batch is admitted at once (prompts = max_num_seqs = B, 256-token prompts, 384 out, gmu 0.9), so
# after PROFILE_DELAY steps every profiled step is a decode step of B requests (k = 3 MTP drafts, synthetic
# acceptance 0.90/0.75/0.59). Why: in e2e/side-by-side the step (ITL) grows from 37.6 ms at 41 running to 81.8
# ms at 100, while the GDN op per layer is known (layer bench): this says what the rest is.
# Eager by default (PROFILE_MODE=eager; a compiled start is a cold 250-370 s per batch size, since the capture
# sizes follow max_num_seqs): kernels are vLLM's, minus Inductor's fusions of the small elementwise ops.
# Brings back per run: the result JSON (its `profile.table_head` is vLLM's table of self CUDA time per op), the
# full table, and the console. CALL_T0 and CALL_LIMIT as in e2e.sh: a run that would not finish is skipped.
# Here: `python results/h200-kernel-speed/device/profile_summary.py <files_at>/profile-*-table.txt` groups each
# table by what the kernels are (MoE, attention, GDN commit, GEMMs, ...), in ms per step.
set -u
T0=${CALL_T0:-$(date +%s)}
LIMIT=${CALL_LIMIT:-600}
case "$T0$LIMIT" in *[!0-9]*) echo "step_profile.sh: CALL_T0=$T0 and CALL_LIMIT=$LIMIT must be whole seconds" >&2; exit 2;; esac
source "${PROFILE_ENV:-results/h200-kernel-speed/device/env.sh}"
mode=(); [ "${PROFILE_MODE:-eager}" = eager ] && mode=(--eager)
M=/tmp/m-profile
if [ ! -d "$M" ]; then      # built under another name first, so a half-built folder is never reused
  rm -rf "$M.tmp" && python3 -m harness.engines.vllm.model_dir "${PROFILE_MODEL:-conf/model/qwen35_35b.yaml}" \
    "$M.tmp" && mv "$M.tmp" "$M" || exit 3
fi
run_s=${RUN_S:-100}; [ "$run_s" -ge 1 ] 2>/dev/null || { echo "step_profile.sh: RUN_S=$run_s must be >= 1 s" >&2; exit 2; }
for S in ${STRATEGIES:-store_all}; do
  for B in ${BATCHES:-40 100}; do
    left=$(( LIMIT - 20 - ($(date +%s) - T0) ))
    if [ "$left" -lt "$run_s" ]; then echo "[$(( $(date +%s) - T0 ))s] $S b$B skipped: ${left} s left"; continue; fi
    P=/tmp/profile-$S-b$B
    rm -rf "$P"
    timeout "$left" python3 -m harness.engines.vllm.offline --model-dir "$M" --strategy "$S" --num-spec 3 \
      --acceptance-rates 0.90,0.75,0.59 --gmu 0.9 --max-num-seqs "$B" --prompts "$B" --prompt-len 256 \
      --output-len 384 --warmup 8 "${mode[@]}" --profile-dir "$P" --profile-delay "${PROFILE_DELAY:-40}" \
      --profile-steps "${PROFILE_STEPS:-10}" --out "$OUT/profile-$S-b$B.json" > "$OUT/profile-$S-b$B.log" 2>&1
    rc=$?; echo "[$(( $(date +%s) - T0 ))s] $S b$B rc=$rc"
    for t in "$P"/*profiler_out*.txt; do [ -e "$t" ] && cp "$t" "$OUT/profile-$S-b$B-table.txt"; done
  done
done
