#!/usr/bin/env bash
# scale.sh — what a world of N ranks costs under each topology: time to form it, connections
# and memory per rank, and small-message latency.
#
#   bench/scale.sh [-r REPEATS] [-n "16 64 128 256"] [BUILD_DIR]     (default: build)
#
# For each world size N and each topology T of TOPOLOGIES (NEXAR_TOPOLOGY=T; "full_mesh+lazy"
# is a full mesh with NEXAR_LAZY_CONNECT=1, connections opened on first use), two runs of
# nexar-bench on this host:
#     nexar-bench all_reduce --form-stats -b 8 -e 8 -n ITERS -w WARMUP -c 1
#     nexar-bench barrier -n ITERS -w WARMUP
# Processes where the machine allows, threads beyond: with N <= PROC_MAX every rank is a
# process of its own (nexar-run -n N --bind-to none), above it the N ranks are threads of one
# nexar-bench (--ranks N: bootstrap_local). Prints a markdown table, one row per N and T:
#   mode        processes or threads
#   form (ms)   forming the world, from the all_reduce run: the slowest rank's join_from_env()
#               call (processes, the call starts when the rank process starts) or the whole
#               bootstrap_local(N) call (threads)
#   peers/rank  direct connections per rank (Communicator::neighbours()); "min-max" when they
#               differ (hypercube at N not a power of two); the other peers are relayed. For
#               full_mesh+lazy: the connections opened by the end of the all_reduce run
#   RSS/rank    resident memory per rank right after formation, MiB, median / max: each rank
#               process's VmRSS, or for threads the process's VmRSS / N (the binary and the
#               libraries then count once for all ranks, so threads look cheaper per rank)
#   all_reduce 8 B, barrier (us): median over ITERS iterations of the slowest rank's time
# With -r REPEATS every cell is the median over the runs that succeeded. A run that fails or
# outlives TIMEOUT shows FAIL in its cells and makes the exit status 1; every log is in OUT.
#
# Environment: TOPOLOGIES (default "full_mesh k_regular:4 hypercube"), PROC_MAX (default 64),
# ITERS (default 20), WARMUP (default 5), TIMEOUT (seconds per run, default 600), OUT
# (directory for the logs, default a new /tmp directory, kept). NEXAR_* settings pass through
# (a large world on few cores may need a longer NEXAR_CONNECT_TIMEOUT_MS).
#
# Every rank runs on this host: with N far above the CPU count the latencies measure the
# scheduler as much as nexar, so compare rows of one machine with each other.
set -uo pipefail

# shellcheck source=tests/script_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../tests/script_lib.sh" build
script_bench_opts scale "16 64 128 256" "$@"

read -r -a topologies <<<"${TOPOLOGIES:-full_mesh k_regular:4 hypercube}"
proc_max=${PROC_MAX:-64}
iters=${ITERS:-20}
warmup=${WARMUP:-5}
limit=${TIMEOUT:-600}

script_need scale nexar-run nexar-bench
grep -q -- --form-stats <<<"$("$bin/nexar-bench" all_reduce --help 2>&1)" ||
  { echo "scale: FAIL: $bin/nexar-bench all_reduce has no --form-stats option (rebuild it)"; exit 1; }
script_tmp scale nexar-scale-bench
out=${OUT:-$(mktemp -d /tmp/nexar-scale.XXXXXX)}
mkdir -p "$out"

# Do not let the caller's environment pick a seed, rank or launcher for us (a launched
# nexar-bench would ignore --ranks).
unset NEXAR_SEED_ADDR NEXAR_CLUSTER_TOKEN NEXAR_CLUSTER_TOKEN_FILE NEXAR_SEED_FINGERPRINT \
  NEXAR_SEED_CA NEXAR_RANK NEXAR_WORLD_SIZE NEXAR_LOCAL_RANK NEXAR_LOCAL_WORLD_SIZE RANK WORLD_SIZE \
  LOCAL_RANK MASTER_ADDR MASTER_PORT OMPI_COMM_WORLD_RANK OMPI_COMM_WORLD_SIZE PMI_RANK PMI_SIZE \
  PMIX_RANK SLURM_PROCID SLURM_NTASKS SLURM_LOCALID SLURM_STEP_NODELIST NEXAR_TOPOLOGY

# field KEY: the value of KEY=... on each line of stdin.
field() { sed -n "s/.* $1=\([^ ]*\).*/\1/p"; }
# time_of LOG: the time column (us) of the log's first nccl-tests data row.
time_of() { awk '$1 ~ /^[0-9]+$/ && NF >= 9 { print $6; exit }' "$1" 2>/dev/null; }
median() { script_median "$1"; }

# run_bench N TOPOLOGY LOG ARGS...: nexar-bench ARGS with N ranks (processes up to PROC_MAX,
# else threads) under NEXAR_TOPOLOGY, output in LOG; returns its exit status (124: timeout).
run_bench() {
  local n=$1 topo=$2 log=$3 cmd p
  shift 3
  if [ "$n" -le "$proc_max" ]; then
    cmd=("$bin/nexar-run" -n "$n" --bind-to none --no-prefix --timeout-ms "$((limit * 1000))"
      "$bin/nexar-bench" "$@" --timeout "$limit")
  else
    cmd=("$bin/nexar-bench" "$@" --ranks "$n" --timeout "$limit")
  fi
  local lazy=0
  [ "${topo%+lazy}" != "$topo" ] && lazy=1
  echo "\$ NEXAR_TOPOLOGY=${topo%+lazy} NEXAR_LAZY_CONNECT=$lazy ${cmd[*]}" >"$log"
  NEXAR_TOPOLOGY=${topo%+lazy} NEXAR_LAZY_CONNECT=$lazy timeout -k 5 "$((limit + 10))" "${cmd[@]}" >>"$log" 2>&1 </dev/null &
  p=$!
  pids+=("$p")
  wait "$p"
}

# cell N TOPOLOGY REP: one all_reduce and one barrier run; appends
# "form_ms peers_min peers_max rss_kib_median rss_kib_max ar_us" to $out/<cell>.ar and "bar_us"
# to $out/<cell>.bar for the runs that succeeded.
cell() {
  local n=$1 topo=$2 rep=$3 key log rc stats lazy row t
  key="n$n-${topo//:/-}"
  log="$out/$key-r$rep-all_reduce.log"
  run_bench "$n" "$topo" "$log" all_reduce --form-stats -b 8 -e 8 -n "$iters" -w "$warmup" -c 1
  rc=$?
  stats=$(grep '^# form-stats ranks=' "$log" | head -n 1)
  lazy=$(grep '^# lazy-connections ' "$log" | head -n 1)
  t=$(time_of "$log")
  if [ "$rc" = 0 ] && [ -n "$stats" ] && [ -n "$t" ]; then
    if [ -n "$lazy" ]; then
      row="$(field form_ms <<<"$stats") $(field conn_min <<<"$lazy") $(field conn_max <<<"$lazy")"
    else
      row="$(field form_ms <<<"$stats") $(field peers_min <<<"$stats") $(field peers_max <<<"$stats")"
    fi
    row+=" $(field rss_kib_median <<<"$stats") $(field rss_kib_max <<<"$stats") $t"
    echo "$row" >>"$out/$key.ar"
    echo "# N=$n $topo rep $rep all_reduce: form_ms peers_min peers_max rss_kib_median rss_kib_max us = $row" >&2
  else
    echo "# N=$n $topo rep $rep all_reduce: FAIL (exit $rc); see $log" >&2
    status=1
  fi
  log="$out/$key-r$rep-barrier.log"
  run_bench "$n" "$topo" "$log" barrier -n "$iters" -w "$warmup"
  rc=$?
  t=$(time_of "$log")
  if [ "$rc" = 0 ] && [ -n "$t" ]; then
    echo "$t" >>"$out/$key.bar"
    echo "# N=$n $topo rep $rep barrier: $t us" >&2
  else
    echo "# N=$n $topo rep $rep barrier: FAIL (exit $rc); see $log" >&2
    status=1
  fi
}

# cell_median FILE C FORMAT: the median of column C of FILE, or FAIL when no run succeeded.
cell_median() {
  if [ -s "$1" ]; then awk -v c="$2" '{ print $c }' "$1" | median "$3"; else printf FAIL; fi
}

echo "# scale: nexar-bench all_reduce (8 B) and barrier, -n $iters -w $warmup, N in \"$sizes\"," \
  "topologies ${topologies[*]}, processes up to PROC_MAX=$proc_max ranks, threads beyond;" \
  "$repeats repeat(s), $(nproc) CPUs; logs in $out" >&2
status=0
for n in $sizes; do
  for topo in "${topologies[@]}"; do
    key="n$n-${topo//:/-}"
    : >"$out/$key.ar"
    : >"$out/$key.bar"
    for ((rep = 1; rep <= repeats; rep++)); do cell "$n" "$topo" "$rep"; done
  done
done

echo "| N | topology | mode | form (ms) | peers/rank | RSS/rank (MiB, median / max) | all_reduce 8 B (us) | barrier (us) | runs |"
echo "|---:|---|---|---:|---:|---:|---:|---:|---:|"
for n in $sizes; do
  mode=processes
  [ "$n" -gt "$proc_max" ] && mode=threads
  for topo in "${topologies[@]}"; do
    key="n$n-${topo//:/-}"
    ar="$out/$key.ar"
    if [ -s "$ar" ]; then
      pmin=$(cell_median "$ar" 2 %d)
      pmax=$(cell_median "$ar" 3 %d)
      peers=$pmin
      [ "$pmin" != "$pmax" ] && peers="$pmin-$pmax"
      rss="$(awk '{ print $4 / 1024 }' "$ar" | median %.1f) / $(awk '{ print $5 / 1024 }' "$ar" | median %.1f)"
    else
      peers=FAIL
      rss=FAIL
    fi
    printf "| %s | %s | %s | %s | %s | %s | %s | %s | %s |\n" "$n" "$topo" "$mode" "$(cell_median "$ar" 1 %.1f)" \
      "$peers" "$rss" "$(cell_median "$ar" 6 %s)" "$(cell_median "$out/$key.bar" 1 %s)" \
      "$(grep -c '' "$ar"),$(grep -c '' "$out/$key.bar")/$repeats"
  done
done
echo
echo "nexar-bench -n $iters -w $warmup on $(nproc) CPUs; ranks as processes up to PROC_MAX=$proc_max, threads" \
  "beyond. form: join_from_env() of the slowest rank process, or bootstrap_local(N) for threads; peers: direct" \
  "connections per rank (the rest relayed); RSS: VmRSS per rank process after formation, or the process's / N" \
  "for threads; latencies: median over iterations of the slowest rank; runs: all_reduce,barrier runs that" \
  "succeeded / repeats. Logs in $out."
exit $status
