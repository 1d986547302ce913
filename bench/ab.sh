#!/usr/bin/env bash
# ab.sh — one build against another, in the same run: the 8 B all_reduce latency and the
# 16 MiB all_reduce bus bandwidth of 2 ranks (nexar-run -n 2 nexar-bench), on shared memory
# (the default on one host) and on QUIC (NEXAR_SHM=0), the two builds taking turns.
#
#   bench/ab.sh [-r ROUNDS] BEFORE_BUILD AFTER_BUILD      (default: 5 rounds)
#
# A build is a build tree with bin/nexar-run and bin/nexar-bench (for an older commit:
# git worktree add /tmp/before <commit> && cmake -S /tmp/before -B /tmp/before/build -G Ninja
# -DCMAKE_BUILD_TYPE=Release && cmake --build /tmp/before/build --target nexar-run nexar-bench).
# Prints one row per path and metric: each build's median over the rounds with its min-max,
# and after/before. Run it on an idle machine: beside a build or a test suite the spread
# swamps any difference.
#
# Environment: ITERS_SMALL (default 2000 iterations at 8 B), LARGE (the large size, default
# 16M) and ITERS_LARGE (default 30 iterations of it); BEFORE_ENV and AFTER_ENV, variables
# each side runs with (for one build against itself with a setting changed:
# BEFORE_ENV=NEXAR_RECORDER_OPS=0 bench/ab.sh build build).
set -euo pipefail

rounds=5
while [ $# -gt 0 ]; do
  case "$1" in
    -r) rounds=$2; shift 2 ;;
    -h|--help) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) break ;;
  esac
done
[ $# -eq 2 ] || { echo "usage: bench/ab.sh [-r ROUNDS] BEFORE_BUILD AFTER_BUILD" >&2; exit 2; }
before=$1
after=$2
small=${ITERS_SMALL:-2000}
large=${ITERS_LARGE:-30}
large_size=${LARGE:-16M}
read -r -a before_env <<<"${BEFORE_ENV:-}"
read -r -a after_env <<<"${AFTER_ENV:-}"
for b in "$before" "$after"; do
  for t in nexar-run nexar-bench; do
    [ -x "$b/bin/$t" ] || { echo "ab.sh: $b/bin/$t is missing" >&2; exit 2; }
  done
done

# one BUILD PATH BYTES ITERS COLUMN ENV...: a column of nexar-bench's row for BYTES (7: time
# in us, 9: busbw in GB/s), run with the variables ENV.
one() {
  local env=("${@:6}")
  [ "$2" = quic ] && env+=(NEXAR_SHM=0)
  env "${env[@]}" timeout 300 "$1/bin/nexar-run" -n 2 "$1/bin/nexar-bench" all_reduce -b "$3" -e "$3" \
    -n "$4" -w $(( $4 / 10 + 1 )) 2>&1 | awk -v col="$5" '/^\[0\] +[0-9]/ { v = $col } END { print v }'
}

declare -A got
for ((r = 1; r <= rounds; ++r)); do
  for which in before after; do
    b=$before
    vars=("${before_env[@]}")
    [ $which = after ] && b=$after && vars=("${after_env[@]}")
    for path in shm quic; do
      got[$which,$path,lat]+="$(one "$b" $path 8 "$small" 7 "${vars[@]}") "
      got[$which,$path,bw]+="$(one "$b" $path "$large_size" "$large" 9 "${vars[@]}") "
    done
  done
  echo "round $r of $rounds done" >&2
done

# stats "v1 v2 ...": "median min max".
stats() { tr ' ' '\n' <<<"$1" | grep . | sort -g | awk '{ v[NR] = $1 } END {
  m = NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2; print m, v[1], v[NR] }'; }

printf '| path, 2 ranks | metric | before: median [min-max] | after: median [min-max] | after/before |\n'
printf '|---|---|---|---|---|\n'
for path in shm quic; do
  for metric in lat bw; do
    read -r bm bl bh <<<"$(stats "${got[before,$path,$metric]}")"
    read -r am al ah <<<"$(stats "${got[after,$path,$metric]}")"
    name="8 B all_reduce, us"
    [ $metric = bw ] && name="$large_size all_reduce busbw, GB/s"
    label=$path
    [ $path = quic ] && label="quic (NEXAR_SHM=0)"
    printf '| %s | %s | %s [%s-%s] | %s [%s-%s] | %s |\n' "$label" "$name" "$bm" "$bl" "$bh" "$am" "$al" "$ah" \
      "$(awk -v a="$am" -v b="$bm" 'BEGIN { printf (b > 0 ? "%.2f" : "-"), a / b }')"
  done
done
