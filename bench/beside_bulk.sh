#!/usr/bin/env bash
# beside_bulk.sh — what a barrier and an 8-byte all_reduce cost while a bulk transfer runs
# between the same two ranks, against the same operation idle, on every path two ranks can
# take.
#
#   bench/beside_bulk.sh [-r REPEATS] [BUILD_DIR]        (default: build, 1 repeat)
#
# For each path, each operation (barrier; all_reduce of 8 bytes) runs twice in a row:
#   idle    nexar-bench OP -b 8 -e 8 -n ITERS -w 50
#   beside  the same with --bulk 1G: meanwhile rank 0 bulk_sends 1 GiB to rank 1 over and over
# Paths:
#   shm     2 processes on this host (nexar-run -n 2), default settings: shared memory
#   quic    2 processes on this host over QUIC (NEXAR_SHM=0)
#   tcp     the same two processes with their message lanes on the TCP link (NEXAR_SHM=0
#           NEXAR_LINK=tcp, TLS)
#   netNNNN 2 network-namespace hosts joined by tbf-shaped links at RATE, MTU NNNN (1500 and
#           9000; bench/netns_allreduce.sh with HOSTS=2), when run as root with namespaces
#   tcpNNNN the same hosts with the message lanes on the TCP link (TLS)
# Each with the bulk lane's scavenger window on (the default) and, with OFF=1, off too
# (NEXAR_BULK_SCAVENGER=0). Prints one row per path, operation and setting: the median over
# REPEATS of the idle and beside times (us, nexar-bench's median over iterations), their
# ratio (median, min-max), and what the bulk lane moved meanwhile (GB/s, whole transfers,
# mostly alone: the timed loop is short).
#
# Environment: ITERS (default 2000), RATE (default 1gbit), OFF (0 or 1), PATHS (default
# "shm quic tcp net1500 net9000 tcp1500 tcp9000").
set -uo pipefail

# shellcheck source=tests/script_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../tests/script_lib.sh" build
script_bench_opts beside_bulk "" "$@"
script_need beside_bulk nexar-bench nexar-run
script_tmp beside_bulk beside_bulk

iters=${ITERS:-2000}
read -r -a paths <<<"${PATHS:-shm quic tcp net1500 net9000 tcp1500 tcp9000}"
settings=(1)
[ "${OFF:-0}" = 1 ] && settings=(1 0)
status=0

# one PATH OP SCAVENGER EXTRA...: prints "TIME_US BULK_GBS" of one nexar-bench run.
one() {
  local path=$1 op=$2 sc=$3 out t g
  shift 3
  case "$path" in
    shm | quic | tcp)
      local shm=1 link=quic
      [ "$path" != shm ] && shm=0
      [ "$path" = tcp ] && link=tcp
      out=$(NEXAR_SHM=$shm NEXAR_LINK=$link NEXAR_BULK_SCAVENGER=$sc timeout 300 "$bin/nexar-run" -n 2 "$bin/nexar-bench" "$op" \
        -b 8 -e 8 -n "$iters" -w 50 "$@" 2>&1)
      ;;
    net* | tcp*)
      local logs="$tmp/net" payloads=default links=""
      [ "${path#tcp}" != "$path" ] && { payloads=""; links=tcp; }
      rm -rf "$logs"
      mkdir -p "$logs"
      out=$(OUT=$logs HOSTS=2 MTU=${path#[a-z][a-z][a-z]} RATE=${RATE:-1gbit} MPI=0 GLOO=0 PAYLOADS=$payloads LINKS=$links COLL=$op \
        BENCH_ARGS="-b 8 -e 8 -n $iters -w 50 $*" timeout 600 env NEXAR_BULK_SCAVENGER="$sc" \
        "$repo/bench/netns_allreduce.sh" "$build" 2>&1; cat "$logs"/*.log)
      ;;
  esac
  t=$(echo "$out" | grep -E '^(\[0\])? *(0|8) +[0-9]+ +float' | head -1 | awk '{print ($1 == "[0]") ? $7 : $6}')
  g=$(echo "$out" | grep -o 'meanwhile ([0-9.]* GB/s)' | head -1 | tr -dc '0-9.')
  [ -n "$t" ] || { echo "# beside_bulk: $path $op (scavenger $sc): no result" >&2; status=1; t=nan; }
  echo "$t ${g:-nan}"
}

if [ "$(id -u)" != 0 ] || ! ip netns list >/dev/null 2>&1; then
  mapfile -t paths < <(printf '%s\n' "${paths[@]}" | grep -vE '^(net|tcp)[0-9]')
  echo "# beside_bulk: not root or no network namespaces: the net paths are skipped" >&2
fi

echo "# beside_bulk: nexar-bench OP -b 8 -e 8 -n $iters -w 50, idle then beside --bulk 1G; $repeats repeat(s); $(nproc) CPUs"
printf '%-8s %-10s %-9s %10s %10s %8s %14s %10s\n' path op scavenger "idle_us" "beside_us" ratio "ratio_range" "bulk_GB/s"
for path in "${paths[@]}"; do
  for op in barrier all_reduce; do
    for sc in "${settings[@]}"; do
      idle=() beside=() ratios=() bulk=()
      for ((r = 0; r < repeats; r++)); do
        read -r ti _ < <(one "$path" "$op" "$sc")
        read -r tb gb < <(one "$path" "$op" "$sc" --bulk 1G)
        idle+=("$ti") beside+=("$tb") bulk+=("$gb")
        ratios+=("$(awk -v a="$tb" -v b="$ti" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "nan" }')")
      done
      python3 - "$path" "$op" "$([ "$sc" = 1 ] && echo on || echo off)" "${idle[*]}" "${beside[*]}" "${ratios[*]}" "${bulk[*]}" <<'PY'
import statistics, sys
path, op, sc = sys.argv[1:4]
def nums(s): return [float(x) for x in s.split() if x != "nan"]
idle, beside, ratios, bulk = (nums(s) for s in sys.argv[4:8])
med = lambda v: statistics.median(v) if v else float("nan")
rng = f"{min(ratios):.2f}-{max(ratios):.2f}" if ratios else "nan"
print(f"{path:<8} {op:<10} {sc:<9} {med(idle):10.1f} {med(beside):10.1f} {med(ratios):8.2f} {rng:>14} {med(bulk):10.2f}")
PY
    done
  done
done
exit $status
