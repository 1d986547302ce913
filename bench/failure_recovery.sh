#!/usr/bin/env bash
# failure_recovery.sh — how long nexar takes to notice a lost rank and recover from it.
#
#   bench/failure_recovery.sh [-r REPEATS] [-n "4 8"] [BUILD_DIR]     (default: build)
#
# For each world size (4 and 8) and each fault, builds (tests/netns_lib.sh) a switch
# namespace with a bridge and W+1 host namespaces: host 0 runs nexar-seed, hosts 1..W one rank
# each of
#     resilient_loop --policy manual --steps STEPS --step-ms STEP_MS --count COUNT --report F
# (tests/netns_failure_lib.sh; rank r in host r + 1). WARM seconds after every rank joined,
# rank VICTIM (default W/2) gets the fault:
#   kill:    SIGKILL of its process (the kernel then answers its port with ICMP unreachable)
#   silent:  iptables DROP of everything out of and into its host's namespace (no ICMP: only
#            the failure timeout, NEXAR_FAILURE_TIMEOUT_MS, default 3000, can tell)
# The script takes the fault's CLOCK_REALTIME (`date +%s%N` right after the kill, or once the
# OUTPUT DROP rule is in); every survivor reports (--report) the CLOCK_REALTIME at which its
# operation failed and how long its agree(), its shrink() and its first correct all_reduce
# after them took (namespaces share the kernel's clock, so the times compare). Columns, in ms,
# as a timeline of the run's recovery:
#   detect_first  fault -> the first survivor's operation fails
#   detect_last   fault -> the last survivor's operation fails
#   agree         the last survivor's failure -> every survivor returned from agree()
#   shrink        every survivor returned from agree() -> every one from shrink()
#   first_ar      every survivor returned from shrink() -> every one finished its first
#                 correct all_reduce of COUNT float64 (after a resync: an all_reduce of the
#                 step index)
# With -r REPEATS each cell is the median of the repeats; a run that fails (a survivor exits
# non-zero, or reports nothing) is reported and left out, and the exit status is then 1. Logs
# of every run are in OUT.
#
# Environment: STEPS (default 400), STEP_MS (default 10), COUNT (default 1024), WARM (seconds,
# default 1), VICTIM (rank to fault, default W/2), FAULTS (default "kill silent"), TIMEOUT
# (seconds per process, default 120), PORT (seed port, default 29400), NETNS_SUBNET4 (default
# 10.77.0), OUT (directory for the logs, default a new /tmp directory, kept),
# NEXAR_FAILURE_TIMEOUT_MS (passed on to the ranks).
#
# Needs root, network namespaces and iptables; exits 77 when they are missing. Run it on an
# otherwise idle machine.
set -uo pipefail

# shellcheck source=tests/script_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../tests/script_lib.sh" build
script_bench_opts failure_recovery "4 8" "$@"

steps=${STEPS:-400}
step_ms=${STEP_MS:-10}
count=${COUNT:-1024}
warm=${WARM:-1}
faults=${FAULTS:-kill silent}
NF_LIMIT=${TIMEOUT:-120}
NF_PORT=${PORT:-29400}
export NETNS_IPV6=0

# shellcheck source=tests/netns_lib.sh
source "$repo/tests/netns_lib.sh"
# shellcheck source=tests/netns_failure_lib.sh
source "$repo/tests/netns_failure_lib.sh"

nf_preflight "failure_recovery" 2

out=${OUT:-$(mktemp -d /tmp/nexar-failure-recovery.XXXXXX)}
mkdir -p "$out"
netns_guard "failure_recovery" nexar-failure-bench
netns_cleanup_stale

# One run's timeline from the survivors' reports, as "detect_first detect_last agree shrink
# first_ar" in ms; nothing when a survivor reported no event.
timeline() {
  local fault_ns=$1 victim=$2 world=$3 r
  for ((r = 0; r < world; r++)); do
    [ "$r" = "$victim" ] && continue
    grep -m 1 '^resilient_loop_event ' "$NF_DIR/rank$r.report" 2>/dev/null || echo missing
  done | awk -v f="$fault_ns" '
    function val(k,   i, kv) { for (i = 2; i <= NF; i++) { split($i, kv, "="); if (kv[1] == k) return kv[2] }
                                 return "" }
    $1 == "missing" { bad = 1; next }
    { e = val("error_ns") + 0; a = e + val("agree_ms") * 1e6; s = a + val("shrink_ms") * 1e6
      t = s + val("first_ms") * 1e6
      if (n == 0 || e < emin) emin = e
      if (n == 0 || e > emax) emax = e
      if (n == 0 || a > amax) amax = a
      if (n == 0 || s > smax) smax = s
      if (n == 0 || t > tmax) tmax = t
      n++ }
    END { if (bad || n == 0) exit 1
          printf "%.1f %.1f %.1f %.1f %.1f\n", (emin - f) / 1e6, (emax - f) / 1e6, (amax - emax) / 1e6,
                 (smax - amax) / 1e6, (tmax - smax) / 1e6 }'
}

# run WORLD FAULT REP: one run; appends its timeline to $out/W-FAULT.rows.
run() {
  local world=$1 fault=$2 rep=$3 victim=${VICTIM:-$(($1 / 2))} label fault_ns r ok=1 row
  label="w$world-$fault-$rep"
  if ! nf_start "$label" "$world" --policy manual --steps "$steps" --step-ms "$step_ms" --count "$count"; then
    echo "# $label: the ranks did not start" >&2
    return 1
  fi
  sleep "$warm"
  if ! fault_ns=$(nf_fault "$fault" "$victim") || [ -z "$fault_ns" ]; then
    echo "# $label: could not inject the fault (did the run end before it?)" >&2
    for ((r = 0; r < world; r++)); do nf_stop "$r"; done
    return 1
  fi
  for ((r = 0; r < world; r++)); do
    [ "$r" = "$victim" ] && continue
    nf_wait "$r"
    if [ "${NF_RC[r]}" != 0 ]; then
      echo "# $label: rank $r exited ${NF_RC[r]}; see $out/$label/rank$r.log" >&2
      ok=0
    fi
  done
  nf_stop "$victim"
  [ "$fault" = silent ] && nf_unsilence "$victim"
  wait "$NF_SEED" 2>/dev/null
  if ! row=$(timeline "$fault_ns" "$victim" "$world"); then
    echo "# $label: a survivor reported no failure event; see $out/$label/" >&2
    ok=0
  fi
  cp -r "$NF_DIR" "$out/"
  [ "$ok" = 1 ] || return 1
  echo "$row" >>"$out/w$world-$fault.rows"
  echo "# $label: $row" >&2
}

# Median of each column of a rows file.
medians() {
  local f=$1 c
  for c in 1 2 3 4 5; do
    awk -v c="$c" '{ print $c }' "$f" | sort -g | awk '{ v[NR] = $1 } END {
        if (NR == 0) { printf "-"; exit }
        if (NR % 2) printf "%.1f", v[(NR + 1) / 2]; else printf "%.1f", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
    echo
  done | paste -sd ' '
}

echo "# failure_recovery: manual policy (agree + shrink called by the program), $count float64 per" \
  "all_reduce, step $step_ms ms, failure timeout ${NEXAR_FAILURE_TIMEOUT_MS:-3000} ms, $repeats repeat(s)," \
  "$(nproc) CPUs; logs in $out"
status=0
for world in $sizes; do
  if ! netns_setup $((world + 1)); then
    echo "failure_recovery: could not build the namespaces" >&2
    exit 1
  fi
  # shellcheck disable=SC2119  # the default port
  netns_probe || { echo "failure_recovery: the namespaces cannot reach each other" >&2; exit 1; }
  for fault in $faults; do
    : >"$out/w$world-$fault.rows"
    for ((rep = 1; rep <= repeats; rep++)); do run "$world" "$fault" "$rep" || status=1; done
  done
  netns_cleanup
done

echo
printf "%6s %7s %13s %12s %8s %8s %9s %5s\n" ranks fault detect_first detect_last agree shrink first_ar runs
for world in $sizes; do
  for fault in $faults; do
    f="$out/w$world-$fault.rows"
    read -r d1 d2 ag sh fa <<<"$(medians "$f")"
    printf "%6s %7s %13s %12s %8s %8s %9s %5s\n" "$world" "$fault" "$d1" "$d2" "$ag" "$sh" "$fa" \
      "$(grep -c '' "$f")/$repeats"
  done
done
echo "# ms, median over runs: detect_first/detect_last = fault -> first/last survivor's error;" \
  "agree = last error -> all agreed; shrink = -> all shrunk; first_ar = -> first correct all_reduce done everywhere"
exit $status
