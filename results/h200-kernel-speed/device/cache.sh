#!/usr/bin/env bash
# vLLM's compile caches (torch.compile + Inductor + Triton under ~/.cache/vllm, and ~/.triton/cache) between
# GPU hosts. A server start on a fresh host takes 300-370 s, of which ~200-260 s is compiling what the cache
# holds; with the cache there it takes ~100 s (the fifth and sixth sessions' engine logs: "Initial
# profiling/warmup run took 86-108 s" and "torch.compile took 40-50 s" cold, 3 s and 5 s warm). The cache
# folder of one strategy (vLLM's hash of the config and the traced code, e.g. torch_compile_cache/1aab200f30
# for store_all with the MTP drafter) is the same on every host and for every gmu, so a cache brought back from
# one host serves the next. The caches change what a start compiles, not what a run measures.
#
# It is ~250 MiB per strategy compiled, and what comes back from a call is at most 8 files of 16 MiB, 64 MiB
# in all (../../../../.library/device/README.md, "Limits"), so it travels as snapshots: each the files new on a
# host since its last pack or restore (on a fresh host, all; on one that restored, only what it compiled since),
# as one gzip archive cut into parts of PART_MIB, each part named cc-<snapshot>-<NN>of<TT>-<sha256 of the
# archive>.part (the name is the manifest: no file of its own). Restoring every snapshot, oldest first, rebuilds
# the whole cache; a host that compiles one more strategy sends ~50 MiB, not the whole cache again.
#   host:  cache.sh pack          where files are new since this host's last pack or restore, snapshot them
#                                 into /tmp/devcache-out, then bring back what fits of its snapshots' parts not
#                                 sent yet into $OUT/devcache/ (e2e.sh calls it last, within the call's time left)
#          cache.sh out [NN..]    bring back more parts (of every snapshot, all not sent yet by default; NN: of
#                                 the newest) - a call of its own, seconds, while that host is still up
#   here:  cache.sh collect DIR   move DIR/devcache/*.part (a call's files_at) into .devcache/<snapshot>-<NN>/,
#                                 one folder per part to carry; drops an older snapshot once a newer complete one
#                                 holds all its files, keeps one still arriving, and lists what is missing
#   host:  cache.sh stash         in a call that carries .devcache/<snapshot>-<NN> folders: keep their parts in
#                                 /tmp/devcache-parts (up to 3 parts per call beside the checkout)
#          cache.sh restore       unpack into ~ the snapshots whose parts are all stashed and whose checksum
#                                 holds, oldest first, up to the first that is not (a newer one waits for it,
#                                 since it may replace the older one's files); e2e.sh calls it first; a missing
#                                 or bad part costs a cold start of what that snapshot and the newer ones held
set -euo pipefail
shopt -s nullglob
PART_MIB=${PART_MIB:-15}                       # < 16 MiB: a bigger file does not come back
OUT_FILES=${OUT_FILES:-8}                      # files back from one call, at most
OUT_MIB=${OUT_MIB:-62}                         # MiB back from one call, at most (the limit is 64)
PACK=${DEVCACHE_PACK:-/tmp/devcache-out}       # the host's snapshots: PACK/<snapshot>/, and PACK/base (the files
                                               # already in a snapshot, packed or restored, as listing() lists them)
STASH=${DEVCACHE_STASH:-/tmp/devcache-parts}   # the host's carried parts
HERE=${DEVCACHE:-$(git rev-parse --show-toplevel 2>/dev/null || pwd)/.devcache}   # the checkout's parts
DIRS=(.cache/vllm .triton/cache)

present() { for x in "${DIRS[@]}"; do [ -d ~/"$x" ] && echo "$x"; done; }   # the cache folders this host has
# the caches' files, one "path<TAB>size<TAB>mtime" per line, sorted: a file written or rewritten is a new line
# (tar keeps mtimes to the second; restore rebuilds the base from this host's own listing, so that is enough)
listing() { local d; mapfile -t d < <(present); [ ${#d[@]} -gt 0 ] || return 0
  (cd ~ && find "${d[@]}" -type f -printf '%p\t%s\t%T@\n' | LC_ALL=C sort); }
host_snapshots() { local d; for d in "$PACK"/2*Z; do [ -d "$d" ] && basename "$d"; done | LC_ALL=C sort; }
# a part's name: cc-<snapshot>-<NN>of<TT>-<sha>.part; field 2 the snapshot, 3 NNofTT, 4 the sha
field() { basename "$1" .part | cut -d- -f"$2"; }
total() { echo $((10#$(field "$1" 3 | cut -c5-))); }          # how many parts the snapshot of part $1 has
snapshots() { for f in "$@"; do field "$f" 2; done | LC_ALL=C sort -u; }

send() {                                       # send PART...: copy what fits the call's limits into $OUT
  [ -n "${OUT:-}" ] || { echo "cache.sh: \$OUT is not set (run it on the GPU host)" >&2; exit 2; }
  mkdir -p "$OUT/devcache"; local brought=() left=()
  for f in "$@"; do
    local files bytes; files=$(find "$OUT" -type f | wc -l); bytes=$(du -sbc "$OUT" | tail -1 | cut -f1)
    if [ $((files + 1)) -le "$OUT_FILES" ] && [ $((bytes + $(stat -c %s "$f"))) -le $((OUT_MIB << 20)) ]; then
      cp "$f" "$OUT/devcache/.incoming" && mv "$OUT/devcache/.incoming" "$OUT/devcache/$(basename "$f")"
      touch "$f.sent"; brought+=("$(field "$f" 3)")
    else left+=("$(field "$f" 3 | cut -c1-2)"); fi
  done
  echo "compile cache parts brought back: ${brought[*]:-none}; still on the host: ${left[*]:-none}"
  if [ ${#left[@]} -gt 0 ]; then echo "  next: a call running 'bash results/h200-kernel-speed/device/cache.sh out'"; fi
}

send_unsent() {                                # send_unsent ID...: the parts of snapshots ID not sent yet
  local todo=() f id; for id in "$@"; do for f in "$PACK/$id"/*.part; do [ -f "$f.sent" ] || todo+=("$f"); done; done
  if [ ${#todo[@]} -eq 0 ]; then echo "compile cache: every part of this host's snapshots sent"; else send "${todo[@]}"; fi
}

case "${1:-}" in
pack)
  rm -rf "$PACK"/.new-*; mkdir -p "$PACK"; touch "$PACK/base"
  listing > "$PACK/.now"
  [ -s "$PACK/.now" ] || { echo "compile cache: none on this host"; exit 0; }
  LC_ALL=C comm -23 "$PACK/.now" "$PACK/base" > "$PACK/.delta"
  if [ -s "$PACK/.delta" ]; then
    t0=$(date +%s); id=$(date -u +%Y%m%dT%H%M%S%NZ); tmp=$PACK/.new-$id; mkdir -p "$tmp"
    cut -f1 "$PACK/.delta" > "$PACK/.files"
    # a file gone since the listing (a temporary one) is no failure: tar says so and goes on (rc 1)
    { tar -cf - -C ~ --ignore-failed-read --verbatim-files-from -T "$PACK/.files" || [ $? -eq 1 ]; } \
      | gzip -1 | split -b "${PART_MIB}M" -d -a 2 - "$tmp/p-"
    sha=$(cat "$tmp"/p-* | sha256sum | cut -d' ' -f1); p=("$tmp"/p-*); tt=$(printf %02d ${#p[@]})
    for f in "${p[@]}"; do mv "$f" "$tmp/cc-$id-${f##*p-}of$tt-$sha.part"; done
    mv "$tmp" "$PACK/$id"
    LC_ALL=C sort -u "$PACK/base" "$PACK/.delta" > "$PACK/.base" && mv "$PACK/.base" "$PACK/base"
    echo "compile cache snapshot $id: $(wc -l < "$PACK/.delta") new file(s)," \
         "$(awk -F'\t' '{s += $2} END {printf "%.0f", s / 1048576}' "$PACK/.delta") MiB, in ${#p[@]} part(s)" \
         "of <= $PART_MIB MiB ($(du -sm "$PACK/$id" | cut -f1) MiB packed), $(( $(date +%s) - t0 )) s; new by folder:"
    (cut -d/ -f1-4 "$PACK/.files" | LC_ALL=C sort | uniq -c | sort -rn | head -8 | sed 's/^/    /') || true
  else
    echo "compile cache unchanged since this host's last pack or restore"
  fi
  # every snapshot of this host's not wholly sent yet; none where it restored and compiled nothing since
  mapfile -t mine < <(host_snapshots)
  [ ${#mine[@]} -eq 0 ] || send_unsent "${mine[@]}"
  ;;

out)
  shift; mapfile -t mine < <(host_snapshots)
  [ ${#mine[@]} -gt 0 ] || { echo "cache.sh out: this host packed no snapshot (a fresh one, or one that restored and compiled nothing since)" >&2; exit 3; }
  [ $# -gt 0 ] || { send_unsent "${mine[@]}"; exit 0; }
  id=${mine[-1]}; todo=()
  for n in "$@"; do f=("$PACK/$id"/cc-"$id"-"$n"of*.part)
    [ ${#f[@]} -eq 1 ] || { echo "cache.sh out: snapshot $id has no part $n" >&2; exit 3; }; todo+=("${f[0]}"); done
  send "${todo[@]}"
  ;;

collect)
  src="${2:?cache.sh collect DIR: a call files_at folder}"/devcache
  if [ -z "${DEVCACHE:-}" ]; then              # the checkout's own .devcache: keep it out of git
    x=$(git rev-parse --git-path info/exclude); mkdir -p "$(dirname "$x")"
    grep -qxF "/.devcache/" "$x" 2>/dev/null || echo "/.devcache/" >> "$x"
  fi
  mkdir -p "$HERE"
  for f in "$src"/cc-*.part; do
    d="$HERE/$(field "$f" 2)-$(field "$f" 3 | cut -c1-2)"; mkdir -p "$d" && cp "$f" "$d/"
  done
  have=("$HERE"/*/cc-*.part); complete=()
  for id in $(snapshots "${have[@]}"); do
    mine=("$HERE/$id"-*/cc-*.part)
    [ ${#mine[@]} -eq "$(total "${mine[0]}")" ] && complete+=("$id")
  done
  newest=""; for id in "${complete[@]}"; do newest=$id; done      # snapshots() sorts them
  # an older snapshot is of no more use once the newest complete one holds every file it holds (a host that
  # compiled without restoring first snapshots only its own strategies: then both stay)
  files_of() { cat "$HERE/$1"-*/cc-*.part | tar tzf - | LC_ALL=C sort; }
  if [ -n "$newest" ]; then
    for id in $(snapshots "${have[@]}"); do
      [[ "$id" < "$newest" ]] || continue
      if [ -z "$(LC_ALL=C comm -23 <(files_of "$id") <(files_of "$newest"))" ]; then rm -rf "$HERE/$id"-*
      else echo "compile cache snapshot $id: kept, it holds files that $newest lacks"; fi
    done
  fi
  for id in $(snapshots "$HERE"/*/cc-*.part); do
    mine=("$HERE/$id"-*/cc-*.part); tt=$(total "${mine[0]}"); missing=()
    for n in $(seq -f %02g 0 $((tt - 1))); do [ -d "$HERE/$id-$n" ] || missing+=("$n"); done
    echo "compile cache snapshot $id: ${#mine[@]} of $tt part(s) here, $(du -smc "$HERE/$id"-* | tail -1 | cut -f1) MiB" \
         "${missing[*]:+(missing ${missing[*]}: 'cache.sh out' on the host that packed it, while it is up; once that host is gone, rm -rf $HERE/$id-*, since newer snapshots wait for it on restore)}"
  done
  ;;
stash)
  mkdir -p "$STASH"; parts=("$HERE"/*/cc-*.part)
  for f in "${parts[@]}"; do cp "$f" "$STASH/"; done
  echo "compile cache: stashed ${#parts[@]} part(s); $STASH holds $(ls "$STASH" | grep -c '\.part$' || true)"
  ;;
restore)
  parts=("$STASH"/cc-*.part)
  [ ${#parts[@]} -gt 0 ] || { echo "compile cache: none stashed (a fresh host compiles every strategy)"; exit 0; }
  # whole snapshots, oldest first, up to the first that is not: a newer snapshot may rewrite an older one's files
  # (and name kinds whose graphs are in the older one), so it is unpacked only after all older ones
  restored=0; earlier=0; waiting=""; mkdir -p "$PACK"; listing > "$PACK/.before"
  for id in $(snapshots "${parts[@]}"); do
    [ -f "$STASH/restored-$id" ] && { earlier=$((earlier + 1)); continue; }
    [ -z "$waiting" ] || { echo "compile cache snapshot $id: waits for $waiting"; continue; }
    mine=("$STASH"/cc-"$id"-*.part); tt=$(total "${mine[0]}"); sha=$(field "${mine[0]}" 4)
    if [ ${#mine[@]} -ne "$tt" ]; then
      echo "compile cache snapshot $id: ${#mine[@]} of $tt parts stashed"; waiting=$id; continue; fi
    if [ "$(cat "${mine[@]}" | sha256sum | cut -d' ' -f1)" != "$sha" ]; then
      echo "compile cache snapshot $id: checksum mismatch, not restored"; waiting=$id; continue; fi
    t0=$(date +%s); tmp=~/.devcache-unpack; rm -rf "$tmp" && mkdir -p "$tmp"
    # unpacked aside and copied in whole, so a failure leaves no half-written cache entry for vLLM to load
    # --update: where this host has a newer copy of a file (a newer snapshot restored in an earlier call, before
    # this older one's parts were all here, or its own compile), that copy stays
    if ! { cat "${mine[@]}" | tar xzf - -C "$tmp" && cp -a --update "$tmp"/. ~/; }; then
      rm -rf "$tmp"; echo "compile cache snapshot $id: unpacking failed"; waiting=$id; continue; fi
    rm -rf "$tmp"; touch "$STASH/restored-$id"; restored=$((restored + 1))
    echo "compile cache snapshot $id restored in $(( $(date +%s) - t0 )) s"
  done
  if [ $restored -gt 0 ]; then
    # what the snapshots brought is in one already: the next pack sends only what this host compiles after
    touch "$PACK/base"
    LC_ALL=C comm -13 "$PACK/.before" <(listing) | LC_ALL=C sort -u - "$PACK/base" > "$PACK/.base"
    mv "$PACK/.base" "$PACK/base"
    echo "compile cache: strategies' folders now here: $(ls ~/.cache/vllm/torch_compile_cache 2>/dev/null | tr '\n' ' ')"
  elif [ $earlier -gt 0 ]; then echo "compile cache: restored earlier on this host"
  elif [ -n "$waiting" ]; then echo "compile cache: nothing restored (from $waiting on, the snapshots wait for it)"
  else echo "compile cache: nothing restored"; fi
  ;;
*)
  echo "usage: cache.sh pack | out [NN...] | collect DIR | stash | restore" >&2; exit 2;;
esac
