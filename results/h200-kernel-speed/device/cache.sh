#!/usr/bin/env bash
# vLLM's compile caches (torch.compile + Inductor + Triton under ~/.cache/vllm, and ~/.triton/cache) between
# GPU hosts. A server start on a fresh host takes 300-370 s, of which ~200-260 s is compiling what the cache
# holds; with the cache restored it takes ~100 s (the fifth and sixth sessions' engine logs: "Initial
# profiling/warmup run took 86-108 s" and "torch.compile took 40-50 s" cold, 3 s and 5 s warm). The cache
# directory of one strategy (vLLM's hash of the config and the traced code, e.g. torch_compile_cache/1aab200f30
# for store_all with the MTP drafter) is the same on every host and for every gmu, so a cache brought back from
# one host serves the next. The caches change what a start compiles, not what a run measures.
#
# It is 250+ MiB per strategy: more than one transfer (64 MiB with the checkout), so it travels as numbered
# parts of PART_MIB with a manifest (sha256 of the whole archive), in both directions:
#   host:  cache.sh pack          where the caches changed since this host's last pack (a strategy compiled),
#                                 pack them into /tmp/devcache-out/part-NN (+ manifest.txt) and bring back into
#                                 $OUT/devcache/ the parts that fit beside what $OUT holds (e2e.sh calls it last)
#          cache.sh out NN [NN..] bring back those parts of the last pack (a call of its own, seconds)
#   here:  cache.sh collect DIR   move DIR/devcache/ (a call's files_at) into .devcache/pNN/ folders, one
#                                 part each, with the manifest in each (a later pack replaces an older one)
#   host:  cache.sh stash         in a call that carries .devcache/pNN: keep its part in /tmp/devcache-parts
#          cache.sh restore       once every part of the manifest is stashed and the checksum holds, unpack
#                                 into ~ (e2e.sh calls it first; a miss or a bad part only costs a cold start)
set -euo pipefail
PART_MIB=${PART_MIB:-48}
OUT_MIB=${OUT_MIB:-60}                  # what one call may bring back in all (the limit is 64 MiB)
PACK=${DEVCACHE_PACK:-/tmp/devcache-out}       # the host's packed parts
STASH=${DEVCACHE_STASH:-/tmp/devcache-parts}   # the host's carried parts
HERE=${DEVCACHE:-$(git rev-parse --show-toplevel 2>/dev/null || pwd)/.devcache}   # the checkout's parts
mib() { du -smc "$@" 2>/dev/null | tail -1 | cut -f1; }

case "${1:-}" in
pack)
  [ -n "${OUT:-}" ] || { echo "cache.sh pack: \$OUT is not set (run it on the GPU host)" >&2; exit 2; }
  dirs=(); for d in .cache/vllm .triton/cache; do [ -d ~/"$d" ] && dirs+=("$d"); done
  [ ${#dirs[@]} -gt 0 ] || { echo "cache.sh pack: no compile cache on this host"; exit 0; }
  # a listing of the caches' files and sizes: equal listings mean the last pack still holds them
  sig=$( (cd ~ && find "${dirs[@]}" -type f -printf '%p %s\n' | sort) | sha256sum | cut -c1-16)
  if [ "$(cat $PACK/signature 2>/dev/null)" != "$sig" ]; then
    t0=$(date +%s); rm -rf $PACK && mkdir -p $PACK
    tar czf - -C ~ "${dirs[@]}" | split -b ${PART_MIB}M -d -a 2 - $PACK/part-
    parts=$(ls $PACK | grep -c '^part-')
    sha=$(cat $PACK/part-* | sha256sum | cut -d' ' -f1)
    { echo "sha256 $sha"; echo "parts $parts"; echo "raw_mib $(mib "${dirs[@]/#/$HOME/}")"
      echo "packed_utc $(date -u +%FT%TZ)"; echo "boot_id $(cat /proc/sys/kernel/random/boot_id)"
      echo "git ${COMMITBENCH_GIT_COMMIT:-?}"
      echo "keys $(ls ~/.cache/vllm/torch_compile_cache 2>/dev/null | tr '\n' ' ')"; } > $PACK/manifest.txt
    echo "$sig" > $PACK/signature
    echo "compile caches packed: $(mib "${dirs[@]/#/$HOME/}") MiB in $parts part(s) of <= $PART_MIB MiB, $(( $(date +%s) - t0 )) s"
  else
    # what the last pack brought back is already here (or `cache.sh out` brings the rest): nothing new to send
    echo "compile caches unchanged since this host's last pack ($(grep parts $PACK/manifest.txt)): none brought back"
    exit 0
  fi
  shift; set -- out $(ls $PACK | sed -n 's/^part-//p')
  ;&                                    # bring back what fits
out)
  shift; [ -f $PACK/manifest.txt ] || { echo "cache.sh out: nothing packed on this host (it was reset?)" >&2; exit 3; }
  mkdir -p "$OUT/devcache" && cp $PACK/manifest.txt "$OUT/devcache/"
  brought=(); left=()
  for n in "$@"; do
    f=$PACK/part-$n; [ -f "$f" ] || { echo "cache.sh out: no part $n in $PACK" >&2; exit 3; }
    if [ $(( $(mib "$OUT") + $(mib "$f") )) -le $OUT_MIB ]; then
      cp "$f" "$OUT/devcache/.part-$n" && mv "$OUT/devcache/.part-$n" "$OUT/devcache/part-$n"; brought+=($n); else left+=($n); fi
  done
  echo "compile cache parts brought back: ${brought[*]:-none}; still on the host: ${left[*]:-none}"
  [ ${#left[@]} -eq 0 ] || echo "  next: a call running 'bash results/h200-kernel-speed/device/cache.sh out ${left[*]}'"
  ;;
collect)
  src="${2:?cache.sh collect DIR: a call files_at folder}"/devcache
  [ -f "$src/manifest.txt" ] || { echo "cache.sh collect: $src has no manifest.txt" >&2; exit 2; }
  if [ -z "${DEVCACHE:-}" ]; then     # the checkout's own .devcache: keep it out of git
    x=$(git rev-parse --git-path info/exclude); mkdir -p "$(dirname "$x")"
    grep -qxF "/.devcache/" "$x" 2>/dev/null || echo "/.devcache/" >> "$x"
  fi
  sha=$(grep '^sha256' "$src/manifest.txt")
  # parts of an older pack are useless beside a newer manifest
  for d in "$HERE"/p*; do [ -d "$d" ] && ! grep -qxF "$sha" "$d/manifest.txt" && rm -rf "$d"; done
  for f in "$src"/part-*; do
    [ -f "$f" ] || continue; n=${f##*part-}
    mkdir -p "$HERE/p$n" && cp "$f" "$src/manifest.txt" "$HERE/p$n/"
  done
  want=$(sed -n 's/^parts //p' "$src/manifest.txt"); have=$(ls -d "$HERE"/p* 2>/dev/null | wc -l)
  echo "compile cache: $have of $want part(s) here ($sha)"
  for n in $(seq -f %02g 0 $((want - 1))); do [ -d "$HERE/p$n" ] || echo "  missing part $n"; done
  ;;
stash)
  mkdir -p $STASH; n=0
  for d in "$HERE"/p*; do [ -d "$d" ] || continue; cp "$d"/part-* $STASH/; cp "$d/manifest.txt" $STASH/; n=$((n + 1)); done
  echo "compile cache: stashed $n part folder(s); $STASH holds $(ls $STASH | grep -c '^part-') part(s)"
  ;;
restore)
  [ -f $STASH/manifest.txt ] || { echo "compile cache: none stashed (a fresh host compiles every strategy)"; exit 0; }
  [ -f $STASH/restored ] && { echo "compile cache: restored earlier on this host"; exit 0; }
  want=$(sed -n 's/^parts //p' $STASH/manifest.txt); have=$(ls $STASH | grep -c '^part-' || true)
  [ "$have" -eq "$want" ] || { echo "compile cache: $have of $want parts stashed: not restored"; exit 0; }
  sha=$(cat $STASH/part-* | sha256sum | cut -d' ' -f1)
  grep -qxF "sha256 $sha" $STASH/manifest.txt || { echo "compile cache: checksum mismatch: not restored"; exit 0; }
  t0=$(date +%s); cat $STASH/part-* | tar xzf - -C ~ && touch $STASH/restored
  echo "compile cache restored ($(sed -n 's/^raw_mib //p' $STASH/manifest.txt) MiB, keys: $(sed -n 's/^keys //p' $STASH/manifest.txt)) in $(( $(date +%s) - t0 )) s"
  ;;
*)
  echo "usage: cache.sh pack | out NN... | collect DIR | stash | restore" >&2; exit 2;;
esac
