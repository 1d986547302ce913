#!/usr/bin/env bash
# resilient_loop_test.sh — examples/resilient_loop under nexar-run, with and without a rank
# killed mid-run.
#
#   tests/resilient_loop_test.sh [BUILD_DIR]    (default: build)
#
#  (a) nexar-run -n 3 resilient_loop --steps 50: no failure; expects exactly
#      "resilient_loop: steps=50 world=3 failures=0 wrong=0" on stdout and exit 0.
#  (b) nexar-run -n 4 --on-failure continue resilient_loop --steps 300 --step-ms 20 (the
#      automatic failure policy); rank RL_KILL_RANK (default 2) is SIGKILLed at about step 100
#      (2 s after every rank wrote its pid file); expects exactly
#      "resilient_loop: steps=300 world=3 failures=1 wrong=0" on stdout and exit 0.
#  (c) as (b) with --policy manual (the loop calls agree() and shrink() itself).
# Stdout must hold that one line and nothing else (the program prints diagnostics on stderr).
# Every process runs under `timeout` (RL_TIMEOUT seconds, default 60) and everything still
# running is killed on exit. Prints what ran and PASS/FAIL per part; exits 1 on a failure.
set -uo pipefail

# shellcheck source=tests/script_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/script_lib.sh" "${1:-build}"
limit=${RL_TIMEOUT:-60}
kill_rank=${RL_KILL_RANK:-2}

script_need "resilient_loop test" nexar-run resilient_loop
script_need_option "resilient_loop test" nexar-run --on-failure

script_tmp "resilient_loop test" nexar-rl-test

# Do not let the caller's environment pick a seed, rank, launcher or policy for us.
unset NEXAR_SEED_ADDR NEXAR_CLUSTER_TOKEN NEXAR_CLUSTER_TOKEN_FILE NEXAR_SEED_FINGERPRINT \
  NEXAR_SEED_CA NEXAR_RANK NEXAR_WORLD_SIZE NEXAR_BIND_ADDR NEXAR_ADVERTISE_ADDR NEXAR_SOCKET_IFNAME \
  RANK WORLD_SIZE LOCAL_RANK MASTER_ADDR MASTER_PORT OMPI_COMM_WORLD_RANK OMPI_COMM_WORLD_SIZE \
  PMI_RANK PMI_SIZE PMIX_RANK SLURM_PROCID SLURM_NTASKS SLURM_LOCALID SLURM_STEP_NODELIST \
  NEXAR_ON_FAILURE NEXAR_RUN_ON_FAILURE

# " (timed out ...)" when the run started at $2 (SECONDS) lasted the whole limit: nexar-run's
# own status is 137 too when the first rank to fail was SIGKILLed.
why() { [ $((SECONDS - $2)) -ge "$limit" ] && echo " (timed out after $limit s)"; }

# check NAME RC STDOUT STDERR EXPECTED START: nexar-run (started at START, in SECONDS) exited
# 0 and its stdout is the expected summary line (with nexar-run's "[rank] " prefix) and
# nothing else.
check() {
  local name=$1 rc=$2 out=$3 err=$4 want=$5 start=$6 lines
  lines=$(grep -c '' "$out")
  sed 's/^/   stdout: /' "$out"
  if [ "$rc" = 0 ] && [ "$lines" = 1 ] && grep -qxE "\[[0-9]+\] $want" "$out"; then
    echo "$name PASS"
    return 0
  fi
  echo "   expected exit 0 and one line \"[R] $want\"; nexar-run exited $rc$(why "$rc" "$start"), $lines line(s) on stdout"
  echo "   stderr:"
  sed 's/^/     /' "$err" | tail -n 40
  echo "$name FAIL"
  return 1
}

# ---- (a) no failure --------------------------------------------------------------------------
part_a() {
  local p rc start=$SECONDS
  echo "== (a) nexar-run -n 3 resilient_loop --steps 50"
  timeout -k 5 "$limit" "$bin/nexar-run" -n 3 "$bin/resilient_loop" --steps 50 \
    >"$tmp/a.out" 2>"$tmp/a.err" &
  p=$!
  pids+=("$p")
  wait "$p"
  rc=$?
  check "(a)" "$rc" "$tmp/a.out" "$tmp/a.err" "resilient_loop: steps=50 world=3 failures=0 wrong=0" "$start"
}

# ---- (b), (c) one rank killed ------------------------------------------------------------------
# part_kill KEY [resilient_loop args...]
part_kill() {
  local key=$1 name="($1)" piddir="$tmp/$1.pids" p rc victim start=$SECONDS
  shift
  mkdir -p "$piddir"
  echo "== $name nexar-run -n 4 --on-failure continue resilient_loop --steps 300 --step-ms 20 $*;" \
    "kill -9 rank $kill_rank at about step 100"
  timeout -k 5 "$limit" "$bin/nexar-run" -n 4 --on-failure continue "$bin/resilient_loop" \
    --steps 300 --step-ms 20 --pid-dir "$piddir" "$@" >"$tmp/$key.out" 2>"$tmp/$key.err" &
  p=$!
  pids+=("$p")
  script_wait "$limit" "$p" script_pid_files_at_least "$piddir" 4
  if [ ! -s "$piddir/rank$kill_rank.pid" ]; then
    wait "$p"
    echo "   the ranks did not all start (no $piddir/rank$kill_rank.pid); nexar-run exited $?; stderr:"
    sed 's/^/     /' "$tmp/$key.err" | tail -n 40
    echo "$name FAIL"
    return 1
  fi
  sleep 2  # 100 steps of 20 ms
  victim=$(cat "$piddir/rank$kill_rank.pid")
  if ! kill -9 "$victim" 2>/dev/null; then
    wait "$p"
    echo "   rank $kill_rank (pid $victim) was gone before the kill; nexar-run exited $?; stderr:"
    sed 's/^/     /' "$tmp/$key.err" | tail -n 40
    echo "$name FAIL"
    return 1
  fi
  echo "   killed rank $kill_rank (pid $victim)"
  wait "$p"
  rc=$?
  check "$name" "$rc" "$tmp/$key.out" "$tmp/$key.err" \
    "resilient_loop: steps=300 world=3 failures=1 wrong=0" "$start"
}

status=0
part_a || status=1
part_kill b || status=1
part_kill c --policy manual || status=1
if [ "$status" = 0 ]; then echo "resilient_loop test: PASS"; else echo "resilient_loop test: FAIL"; fi
exit $status
