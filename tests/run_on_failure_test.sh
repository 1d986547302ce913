#!/usr/bin/env bash
# run_on_failure_test.sh — nexar-run --on-failure fail-fast|continue, with real processes.
#
#   tests/run_on_failure_test.sh [BUILD_DIR]    (default: build)
#
# The ranks are shells: rank 1 dies (kill -9 on itself, or exit 3) early, the others sleep
# and then print "rank R done". Shells never join a seed, so the cases that expect exit 0
# point the ranks at an external seed (--seed) that nobody contacts; (d) runs real nexar
# ranks against the launcher's own seed.
#  (a) continue, rank 1 SIGKILLed: the others finish, the launcher reports rank 1 and
#      SIGKILL at once, exit 0.
#  (b) continue (from NEXAR_RUN_ON_FAILURE), rank 1 exits 3: the others finish, exit 3.
#  (c) default (fail-fast), rank 1 SIGKILLed: the others are terminated, exit 137.
#  (d) continue with the embedded seed: 3 nexar-cluster-check --quick form a cluster, then
#      rank 1 kills itself: exit 0 and no seed failure reported.
#  (e) continue, every rank SIGKILLed: exit 137, never success.
#  (f) NEXAR_RUN_ON_FAILURE=bogus: exit 2 naming the value.
#  (g) continue, then SIGINT to nexar-run: rank 0 dies of it, rank 1 ignores it and is
#      stopped as under fail-fast (NEXAR_RUN_GRACE_MS, then SIGTERM); exit 130.
#  (h) continue, embedded seed, shell ranks that never join: the seed's formation timeout
#      still stops them all; exit 1.
# Every nexar-run runs under `timeout` (MP_TIMEOUT seconds, default 60). Prints PASS/FAIL
# per part; exits 1 on a failure.
# The ranks' scripts are single-quoted on purpose; the check helpers run through expect.
# shellcheck disable=SC2016,SC2317
set -uo pipefail

# shellcheck source=tests/script_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/script_lib.sh" "${1:-build}"
limit=${MP_TIMEOUT:-60}

for exe in nexar-run nexar-cluster-check; do
  if [ ! -x "$bin/$exe" ]; then
    echo "run_on_failure test: FAIL: $bin/$exe not found (build it first)"
    exit 1
  fi
done

script_tmp "run_on_failure test" nexar-run-failure-test

unset NEXAR_SEED_ADDR NEXAR_CLUSTER_TOKEN NEXAR_CLUSTER_TOKEN_FILE NEXAR_SEED_FINGERPRINT \
  NEXAR_SEED_CA NEXAR_RANK NEXAR_WORLD_SIZE NEXAR_RUN_ON_FAILURE NEXAR_RUN_GRACE_MS \
  RANK WORLD_SIZE LOCAL_RANK MASTER_ADDR MASTER_PORT OMPI_COMM_WORLD_RANK OMPI_COMM_WORLD_SIZE \
  PMI_RANK PMI_SIZE PMIX_RANK SLURM_PROCID SLURM_NTASKS SLURM_LOCALID SLURM_STEP_NODELIST

# Rank 1 does $1 after 0.2 s; the others print "rank R done" after $2 s.
rank_script() {
  echo "if [ \"\$NEXAR_LOCAL_RANK\" = 1 ]; then sleep 0.2; $1; fi; sleep $2; echo \"rank \$NEXAR_LOCAL_RANK done\""
}
# nexar-run with shell ranks and an external seed nobody contacts; output in $log, status in $rc.
run_shells() {
  log="$tmp/$1.log"
  shift
  NEXAR_CLUSTER_TOKEN=not-used timeout -k 5 "$limit" "$bin/nexar-run" --seed 127.0.0.1:9 "$@" >"$log" 2>&1
  rc=$?
}

status=0
problems=()
expect() {  # expect DESCRIPTION COMMAND...: records DESCRIPTION when COMMAND fails
  local what=$1
  shift
  "$@" || problems+=("$what")
}
has() { grep -qE -- "$1" "$log"; }
lacks() { ! grep -qE -- "$1" "$log"; }
# Line number of the first line matching $1 (0 if none).
line_of() { grep -nE -- "$1" "$log" | head -n 1 | cut -d: -f1 | grep . || echo 0; }
before() { local a b; a=$(line_of "$1"); b=$(line_of "$2"); [ "$a" -gt 0 ] && [ "$a" -lt "$b" ]; }
verdict() {
  if [ "${#problems[@]}" = 0 ]; then
    echo "($1) PASS"
  else
    echo "   nexar-run exited $rc; wrong: $(printf '%s; ' "${problems[@]}")"
    echo "   output:"
    sed 's/^/     /' "$log" | tail -n 30
    echo "($1) FAIL"
    status=1
  fi
  problems=()
}

echo "== (a) --on-failure continue, rank 1 killed by SIGKILL"
run_shells a -n 3 --on-failure continue -- bash -c "$(rank_script 'kill -9 $$' 1.5)"
expect "exit status 0" [ "$rc" = 0 ]
expect "rank 0 finished" has '^\[0\] rank 0 done$'
expect "rank 2 finished" has '^\[2\] rank 2 done$'
expect "report of rank 1's SIGKILL" \
  has '^nexar-run: rank 1 \(pid [0-9]+\) killed by signal SIGKILL; continuing with 2 rank\(s\) \(--on-failure continue\)$'
expect "report before the survivors finished" before 'rank 1 .*SIGKILL' 'rank [02] done'
expect "no SIGTERM/SIGKILL sent" lacks 'sending SIG'
verdict a

echo "== (b) NEXAR_RUN_ON_FAILURE=continue, rank 1 exits 3"
NEXAR_RUN_ON_FAILURE='continue' run_shells b -n 3 -- bash -c "$(rank_script 'exit 3' 1.5)"
expect "exit status 3" [ "$rc" = 3 ]
expect "rank 0 finished" has '^\[0\] rank 0 done$'
expect "rank 2 finished" has '^\[2\] rank 2 done$'
expect "report of rank 1's status" \
  has '^nexar-run: rank 1 \(pid [0-9]+\) exited with status 3; continuing with 2 rank\(s\)'
expect "no SIGTERM/SIGKILL sent" lacks 'sending SIG'
verdict b

echo "== (c) default (fail-fast), rank 1 killed by SIGKILL, NEXAR_RUN_GRACE_MS=200"
NEXAR_RUN_GRACE_MS=200 run_shells c -n 3 -- bash -c "$(rank_script 'kill -9 $$' 3)"
expect "exit status 137" [ "$rc" = 137 ]
expect "report of rank 1's SIGKILL" has '^nexar-run: rank 1 killed by signal SIGKILL$'
expect "SIGTERM to the others" has '^nexar-run: sending SIGTERM to 2 remaining rank\(s\)$'
expect "the others did not finish" lacks 'rank [02] done'
verdict c

echo "== (d) --on-failure continue, embedded seed, 3 x nexar-cluster-check --quick, then rank 1 killed"
log="$tmp/d.log"
timeout -k 5 "$limit" "$bin/nexar-run" -n 3 --on-failure continue -- bash -c \
  '"$0" --quick || exit 9; if [ "$NEXAR_RANK" = 1 ]; then kill -9 $$; fi; sleep 0.5; echo "rank $NEXAR_RANK done"' \
  "$bin/nexar-cluster-check" >"$log" 2>&1
rc=$?
expect "exit status 0" [ "$rc" = 0 ]
expect "3 ranks passed their checks" [ "$(grep -cE '\] rank [0-9]/3: [0-9]+ checks passed' "$log")" = 3 ]
expect "rank 0 finished" has '^\[0\] rank 0 done$'
expect "rank 2 finished" has '^\[2\] rank 2 done$'
expect "report of rank 1's SIGKILL" has '^nexar-run: rank 1 \(pid [0-9]+\) killed by signal SIGKILL; continuing'
expect "no seed failure" lacks '^nexar-run: seed'
verdict d

echo "== (e) --on-failure continue, every rank killed by SIGKILL"
run_shells e -n 2 --on-failure continue -- bash -c 'sleep 0.$NEXAR_LOCAL_RANK; kill -9 $$'
expect "exit status 137" [ "$rc" = 137 ]
expect "report of the last loss" has '^nexar-run: rank [01] \(pid [0-9]+\) killed by signal SIGKILL; no rank left$'
verdict e

echo "== (f) NEXAR_RUN_ON_FAILURE=bogus"
log="$tmp/f.log"
NEXAR_RUN_ON_FAILURE=bogus timeout -k 5 "$limit" "$bin/nexar-run" -n 1 true >"$log" 2>&1
rc=$?
expect "exit status 2" [ "$rc" = 2 ]
expect "message naming the value" has "NEXAR_RUN_ON_FAILURE must be fail-fast or continue, not 'bogus'"
verdict f

echo "== (g) --on-failure continue, then SIGINT to nexar-run; rank 1 ignores it"
log="$tmp/g.log"
# --foreground: timeout passes the signal to nexar-run only; without it, it also sends it
# to its whole process group, and nexar-run would see a second SIGINT (which kills).
NEXAR_CLUSTER_TOKEN=not-used NEXAR_RUN_GRACE_MS=300 timeout --foreground -k 5 "$limit" "$bin/nexar-run" -n 2 \
  --seed 127.0.0.1:9 --on-failure continue -- bash -c \
  'if [ "$NEXAR_LOCAL_RANK" = 1 ]; then trap "echo ignoring SIGINT" INT; fi
   for i in $(seq 50); do sleep 0.1; done; echo "rank $NEXAR_LOCAL_RANK done"' >"$log" 2>&1 &
p=$!
sleep 0.5
kill -INT "$p"  # timeout passes it on
wait "$p"
rc=$?
expect "exit status 130" [ "$rc" = 130 ]
expect "SIGINT forwarded" has '^nexar-run: forwarding SIGINT to 2 rank\(s\)'
expect "rank 0 killed by it" has '^nexar-run: rank 0 killed by signal SIGINT$'
expect "rank 1 got SIGTERM" has '^nexar-run: sending SIGTERM to 1 remaining rank\(s\)$'
expect "nobody finished" lacks 'rank [01] done'
verdict g

echo "== (h) --on-failure continue, embedded seed, --timeout-ms 300, ranks that never join"
log="$tmp/h.log"
NEXAR_RUN_GRACE_MS=200 timeout -k 5 "$limit" "$bin/nexar-run" -n 2 --timeout-ms 300 \
  --on-failure continue -- bash -c 'sleep 3; echo "rank $NEXAR_LOCAL_RANK done"' >"$log" 2>&1
rc=$?
expect "exit status 1" [ "$rc" = 1 ]
expect "seed failure reported" has '^nexar-run: seed: .*did not form'
expect "SIGTERM to both" has '^nexar-run: sending SIGTERM to 2 remaining rank\(s\)$'
expect "reported as stopped, not continuing" lacks 'continuing with'
expect "nobody finished" lacks 'rank [01] done'
verdict h

if [ "$status" = 0 ]; then echo "run_on_failure test: PASS"; else echo "run_on_failure test: FAIL"; fi
exit $status
