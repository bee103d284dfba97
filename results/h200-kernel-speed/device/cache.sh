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
# in all (../../../../.library/device/README.md, "Limits"), so it travels as a snapshot: the whole cache as one
# gzip archive cut into parts of PART_MIB, each part named cc-<snapshot>-<NN>of<TT>-<sha256 of the archive>.part
# (the name is the manifest: no file of its own).
#   host:  cache.sh pack          where the cache changed since this host's last pack or restore, snapshot it
#                                 into /tmp/devcache-out, then bring back what fits of its parts not sent yet
#                                 into $OUT/devcache/ (e2e.sh calls it last, within the call's time left)
#          cache.sh out [NN..]    bring back more parts of the host's snapshot (all not sent yet by default;
#                                 a call of its own, seconds, while that host is still up)
#   here:  cache.sh collect DIR   move DIR/devcache/*.part (a call's files_at) into .devcache/<snapshot>-<NN>/,
#                                 one folder per part to carry; drops an older snapshot once a newer complete one
#                                 holds all its files, keeps one still arriving, and lists what is missing
#   host:  cache.sh stash         in a call that carries .devcache/<snapshot>-<NN> folders: keep their parts in
#                                 /tmp/devcache-parts (up to 3 parts per call beside the checkout)
#          cache.sh restore       unpack into ~ every snapshot whose parts are all stashed and whose checksum
#                                 holds, oldest first (e2e.sh calls it first; a missing or bad part costs a
#                                 cold start of what that snapshot held)
set -euo pipefail
shopt -s nullglob
PART_MIB=${PART_MIB:-15}                       # < 16 MiB: a bigger file does not come back
OUT_FILES=${OUT_FILES:-8}                      # files back from one call, at most
OUT_MIB=${OUT_MIB:-62}                         # MiB back from one call, at most (the limit is 64)
PACK=${DEVCACHE_PACK:-/tmp/devcache-out}       # the host's snapshot: PACK/current, PACK/<snapshot>/
STASH=${DEVCACHE_STASH:-/tmp/devcache-parts}   # the host's carried parts
HERE=${DEVCACHE:-$(git rev-parse --show-toplevel 2>/dev/null || pwd)/.devcache}   # the checkout's parts
DIRS=(.cache/vllm .triton/cache)

present() { for x in "${DIRS[@]}"; do [ -d ~/"$x" ] && echo "$x"; done; }   # the cache folders this host has
# a listing of the caches' files and sizes: equal listings, equal caches (the files are written once)
signature() { local d; mapfile -t d < <(present)
  [ ${#d[@]} -gt 0 ] || { echo none; return; }
  (cd ~ && find "${d[@]}" -type f -printf '%p %s\n' | LC_ALL=C sort) | sha256sum | cut -c1-16; }
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

send_unsent() {                                # send_unsent ID: the parts of snapshot ID not sent yet
  local todo=() f; for f in "$PACK/$1"/*.part; do [ -f "$f.sent" ] || todo+=("$f"); done
  if [ ${#todo[@]} -eq 0 ]; then echo "compile cache snapshot $1: every part sent"; else send "${todo[@]}"; fi
}

case "${1:-}" in
pack)
  rm -rf "$PACK"/.new-*
  sig=$(signature)
  [ "$sig" != none ] || { echo "compile cache: none on this host"; exit 0; }
  if [ "$(cat "$PACK/signature" 2>/dev/null)" != "$sig" ]; then
    t0=$(date +%s); id=$(date -u +%Y%m%dT%H%M%S%NZ); tmp=$PACK/.new-$id; mkdir -p "$tmp"
    mapfile -t d < <(present)
    tar -cf - -C ~ "${d[@]}" | gzip -1 | split -b "${PART_MIB}M" -d -a 2 - "$tmp/p-"
    sha=$(cat "$tmp"/p-* | sha256sum | cut -d' ' -f1); p=("$tmp"/p-*); tt=$(printf %02d ${#p[@]})
    for f in "${p[@]}"; do mv "$f" "$tmp/cc-$id-${f##*p-}of$tt-$sha.part"; done
    old=$(cat "$PACK/current" 2>/dev/null || true)
    mv "$tmp" "$PACK/$id" && echo "$id" > "$PACK/current" && echo "$sig" > "$PACK/signature"
    [ -z "$old" ] || rm -rf "${PACK:?}/$old"
    echo "compile cache snapshot $id: $(du -smc "${d[@]/#/$HOME/}" | tail -1 | cut -f1) MiB in ${#p[@]} part(s)" \
         "of <= $PART_MIB MiB ($(du -sm "$PACK/$id" | cut -f1) MiB packed), $(( $(date +%s) - t0 )) s; by folder:"
    (cd ~ && du -sm .cache/vllm/torch_compile_cache/* .cache/vllm/* .triton/cache 2>/dev/null | sort -rn | head -8 \
      | sed 's/^/    /') || true                # du: a folder this host lacks is no error
  else
    echo "compile cache unchanged since this host's last pack or restore"
  fi
  id=$(cat "$PACK/current" 2>/dev/null || true)
  [ -z "$id" ] || send_unsent "$id"           # none: restored and unchanged, nothing of this host's to send
  ;;
out)
  shift; id=$(cat "$PACK/current" 2>/dev/null || true)
  [ -n "$id" ] || { echo "cache.sh out: this host packed no snapshot (a fresh one, or one that restored and compiled nothing since)" >&2; exit 3; }
  [ $# -gt 0 ] || { send_unsent "$id"; exit 0; }
  todo=()
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
         "${missing[*]:+(missing ${missing[*]}: 'cache.sh out' on the host that packed it, while it is up)}"
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
  # every whole snapshot, oldest first: collect keeps an older one only where it holds files a newer one lacks
  restored=0; earlier=0
  for id in $(snapshots "${parts[@]}"); do
    [ -f "$STASH/restored-$id" ] && { earlier=$((earlier + 1)); continue; }
    mine=("$STASH"/cc-"$id"-*.part); tt=$(total "${mine[0]}"); sha=$(field "${mine[0]}" 4)
    if [ ${#mine[@]} -ne "$tt" ]; then echo "compile cache snapshot $id: ${#mine[@]} of $tt parts stashed"; continue; fi
    if [ "$(cat "${mine[@]}" | sha256sum | cut -d' ' -f1)" != "$sha" ]; then
      echo "compile cache snapshot $id: checksum mismatch, not restored"; continue; fi
    t0=$(date +%s); tmp=~/.devcache-unpack; rm -rf "$tmp" && mkdir -p "$tmp"
    # unpacked aside and copied in whole, so a failure leaves no half-written cache entry for vLLM to load
    if ! { cat "${mine[@]}" | tar xzf - -C "$tmp" && cp -a "$tmp"/. ~/; }; then
      rm -rf "$tmp"; echo "compile cache snapshot $id: unpacking failed"; continue; fi
    rm -rf "$tmp"; touch "$STASH/restored-$id"; restored=$((restored + 1))
    echo "compile cache snapshot $id restored in $(( $(date +%s) - t0 )) s"
  done
  if [ $restored -gt 0 ]; then
    # a host that packed its own snapshot before holds both now: its next pack is to take them together;
    # else the next pack sends only where this host compiles something new
    if [ -f "$PACK/current" ]; then rm -f "$PACK/signature"; else mkdir -p "$PACK" && signature > "$PACK/signature"; fi
    echo "compile cache: strategies' folders now here: $(ls ~/.cache/vllm/torch_compile_cache 2>/dev/null | tr '\n' ' ')"
  elif [ $earlier -gt 0 ]; then echo "compile cache: restored earlier on this host"
  else echo "compile cache: no complete snapshot stashed: not restored"; fi
  ;;
*)
  echo "usage: cache.sh pack | out [NN...] | collect DIR | stash | restore" >&2; exit 2;;
esac
