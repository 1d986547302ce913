#!/usr/bin/env bash
# elastic_run_test.sh — nexar-run --max-restarts: killed ranks come back as joiners of the
# running job, and examples/resilient_loop admits them.
#
#   tests/elastic_run_test.sh [BUILD_DIR]    (default: build)
#
#  (a) nexar-run -n 4 --max-restarts 3 resilient_loop --steps 600 --step-ms 20 (automatic
#      policy): world rank 2 is SIGKILLed at about step 100, then its replacement, then world
#      rank 0 (the rank that prints at the end, had it lived), each once the replacement of
#      the one before has joined (written its pid file: --pid-dir names them by world rank,
#      and a joiner gets a new one). Expects "resilient_loop: steps=600 world=4 failures=3
#      wrong=0" as the only line on stdout, three "restarting it as a joiner (restart K of
#      3)" reports, three replacements that joined, and exit 0.
#  (b) as (a) with --policy manual, 500 steps and one kill: world=4 failures=1.
#  (c) --max-restarts 1, 500 steps, two kills (rank 2, then its replacement): the second is
#      not restarted ("no restarts left"), the others finish (world=3 failures=2) and the
#      exit status is 137 (the latest incarnation of rank 2 was killed by SIGKILL).
# Every nexar-run runs under `timeout` (ER_TIMEOUT seconds, default 60) and everything still
# running is killed on exit. Prints what ran and PASS/FAIL per part; exits 1 on a failure.
set -uo pipefail

# shellcheck source=tests/script_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/script_lib.sh" "${1:-build}"
limit=${ER_TIMEOUT:-60}

script_need "elastic_run test" nexar-run resilient_loop
script_need_option "elastic_run test" nexar-run --max-restarts

script_tmp "elastic_run test" nexar-elastic-run-test

# Do not let the caller's environment pick a seed, rank, launcher or policy for us.
unset NEXAR_SEED_ADDR NEXAR_CLUSTER_TOKEN NEXAR_CLUSTER_TOKEN_FILE NEXAR_SEED_FINGERPRINT \
  NEXAR_SEED_CA NEXAR_RANK NEXAR_WORLD_SIZE NEXAR_BIND_ADDR NEXAR_ADVERTISE_ADDR NEXAR_SOCKET_IFNAME \
  RANK WORLD_SIZE LOCAL_RANK MASTER_ADDR MASTER_PORT OMPI_COMM_WORLD_RANK OMPI_COMM_WORLD_SIZE \
  PMI_RANK PMI_SIZE PMIX_RANK SLURM_PROCID SLURM_NTASKS SLURM_LOCALID SLURM_STEP_NODELIST \
  NEXAR_ON_FAILURE NEXAR_RUN_ON_FAILURE NEXAR_RUN_GRACE_MS NEXAR_ELASTIC

# The pid files in $1, one name a line, sorted.
pid_files() { find "$1" -name 'rank*.pid' -printf '%f\n' | sort; }

# wait_files DIR N LAUNCHER_PID: until DIR holds N pid files; fails when the launcher ended or
# the limit passed.
wait_files() { script_wait "$limit" "$3" script_pid_files_at_least "$1" "$2"; }

# part KEY MAX_RESTARTS STEPS WANT_RC WANT_LINE VICTIMS [resilient_loop args...]
# VICTIMS: world ranks to kill in turn, comma-separated; "new" is the replacement that joined
# after the previous kill. The first kill comes 2 s after every rank wrote its pid file, each
# later one 1.5 s after the previous victim's replacement joined.
part() {
  local key=$1 max=$2 steps=$3 want_rc=$4 want=$5 victims=$6 name="($1)" dir="$tmp/$1.pids"
  local p rc v pid before newest kills=0 joined=0 lines restarts problem=""
  shift 6
  mkdir -p "$dir"
  echo "== $name nexar-run -n 4 --max-restarts $max resilient_loop --steps $steps --step-ms 20 $*;" \
    "kill -9 world rank(s) $victims"
  timeout -k 5 "$limit" "$bin/nexar-run" -n 4 --max-restarts "$max" "$bin/resilient_loop" \
    --steps "$steps" --step-ms 20 --pid-dir "$dir" "$@" >"$tmp/$key.out" 2>"$tmp/$key.err" &
  p=$!
  pids+=("$p")
  if ! wait_files "$dir" 4 "$p"; then
    problem="the ranks did not all start"
  else
    sleep 2  # about 100 steps
    newest=""
    for v in ${victims//,/ }; do
      [ "$v" = new ] && v=$newest
      if [ -z "$v" ] || ! pid=$(cat "$dir/rank$v.pid" 2>/dev/null) || ! kill -9 "$pid" 2>/dev/null; then
        problem="could not kill world rank '$v' (gone already, or no pid file)"
        break
      fi
      kills=$((kills + 1))
      echo "   killed world rank $v (pid $pid)"
      # Its replacement joins as a new world rank; the last kill of (c) has none.
      [ "$kills" -gt "$max" ] && break
      before=$(pid_files "$dir")
      if ! wait_files "$dir" $((4 + kills)) "$p"; then
        problem="no replacement joined after the kill of world rank $v"
        break
      fi
      newest=$(comm -13 <(echo "$before") <(pid_files "$dir") | sed 's/^rank\([0-9]*\)\.pid$/\1/')
      joined=$((joined + 1))
      echo "   world rank $newest joined (pid $(cat "$dir/rank$newest.pid"))"
      sleep 1.5
    done
  fi
  wait "$p"
  rc=$?
  lines=$(grep -c '' "$tmp/$key.out")
  restarts=$(grep -c 'restarting it as a joiner (restart [0-9]* of' "$tmp/$key.err")
  sed 's/^/   stdout: /' "$tmp/$key.out"
  grep '^nexar-run: ' "$tmp/$key.err" | sed 's/^/   /'
  local want_restarts=$((kills < max ? kills : max))
  if [ -z "$problem" ] && [ "$rc" != "$want_rc" ]; then problem="nexar-run exited $rc, expected $want_rc"; fi
  if [ -z "$problem" ] && { [ "$lines" != 1 ] || ! grep -qxE "\[[0-9]+\] $want" "$tmp/$key.out"; }; then
    problem="expected one line \"[R] $want\" on stdout, got $lines line(s)"
  fi
  if [ -z "$problem" ] && [ "$restarts" != "$want_restarts" ]; then
    problem="$restarts restart report(s), expected $want_restarts"
  fi
  if [ -z "$problem" ] && [ "$joined" != "$want_restarts" ]; then
    problem="$joined replacement(s) joined, expected $want_restarts"
  fi
  if [ -z "$problem" ] && [ "$kills" -gt "$max" ] && ! grep -q 'no restarts left' "$tmp/$key.err"; then
    problem="no \"no restarts left\" report"
  fi
  if [ -n "$problem" ]; then
    echo "   $problem; stderr:"
    sed 's/^/     /' "$tmp/$key.err" | tail -n 40
    echo "$name FAIL"
    return 1
  fi
  echo "$name PASS"
}

status=0
part a 3 600 0 "resilient_loop: steps=600 world=4 failures=3 wrong=0" 2,new,0 || status=1
part b 3 500 0 "resilient_loop: steps=500 world=4 failures=1 wrong=0" 2 --policy manual || status=1
part c 1 500 137 "resilient_loop: steps=500 world=3 failures=2 wrong=0" 2,new || status=1
if [ "$status" = 0 ]; then echo "elastic_run test: PASS"; else echo "elastic_run test: FAIL"; fi
exit $status
