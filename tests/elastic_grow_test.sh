#!/usr/bin/env bash
# elastic_grow_test.sh — an elastic nexar cluster of separate processes on 127.0.0.1 grows
# by two late joiners.
#
#   tests/elastic_grow_test.sh [BUILD_DIR]    (default: build)
#
# nexar-seed --elastic --listen 127.0.0.1:0 -n 4 --env-file F runs in the background. Four
# members (nexar-cluster-check --quick --grow 2, the variables of F, no rank or world size:
# the seed assigns them) form the cluster; once the seed says it formed, two more processes
# with the same variables and arguments start: the elastic seed admits them into the running
# job, the members grow() them in, and all six run the battery on the grown communicator.
# Passes when every process exits 0 and reports "rank R/6: N checks passed", the ranks 0..5
# each once, and the seed, stopped with SIGTERM afterwards, says it formed with 4 ranks and
# exits 143 (stopped by SIGTERM; an elastic seed runs until stopped).
# Every process runs under `timeout` (ELASTIC_TIMEOUT seconds, default 60) and everything
# still running is killed on exit. Prints what ran and PASS/FAIL; exits 1 on a failure.
set -uo pipefail

# shellcheck source=tests/script_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/script_lib.sh" "${1:-build}"
limit=${ELASTIC_TIMEOUT:-60}
members=4
joiners=2
world=$((members + joiners))

script_need "elastic grow test" nexar-seed nexar-cluster-check

script_tmp "elastic grow test" nexar-elastic-test

# Do not let the caller's environment pick a seed, rank or launcher for us.
unset NEXAR_SEED_ADDR NEXAR_CLUSTER_TOKEN NEXAR_CLUSTER_TOKEN_FILE NEXAR_SEED_FINGERPRINT \
  NEXAR_SEED_CA NEXAR_RANK NEXAR_WORLD_SIZE NEXAR_BIND_ADDR NEXAR_ADVERTISE_ADDR NEXAR_SOCKET_IFNAME \
  NEXAR_ELASTIC RANK WORLD_SIZE LOCAL_RANK MASTER_ADDR MASTER_PORT OMPI_COMM_WORLD_RANK \
  OMPI_COMM_WORLD_SIZE PMI_RANK PMI_SIZE PMIX_RANK SLURM_PROCID SLURM_NTASKS SLURM_LOCALID \
  SLURM_STEP_NODELIST TORCHELASTIC_RUN_ID

show_log() { sed 's/^/     /' "$1" | tail -n "${2:-30}"; }
why() { [ "$1" = 124 ] || [ "$1" = 137 ] && echo " (timed out after $limit s)"; }
fail() {
  echo "   $*"
  echo "elastic grow test: FAIL"
  exit 1
}

envf="$tmp/seed.env"
seed_log="$tmp/seed.log"
echo "== nexar-seed --elastic --listen 127.0.0.1:0 -n $members; $members members + $joiners" \
  "late joiners of nexar-cluster-check --quick --grow $joiners"
timeout -k 5 "$limit" "$bin/nexar-seed" --elastic --listen 127.0.0.1:0 -n "$members" --env-file "$envf" \
  --formation-timeout-ms $((limit * 1000 / 2)) >"$seed_log" 2>&1 &
seed=$!
pids+=("$seed")

if ! script_wait 10 "$seed" script_seed_env "$envf"; then
  echo "   nexar-seed wrote no env file within 10 s; its output:"
  show_log "$seed_log"
  fail "no seed"
fi
mapfile -t vars < <(grep -E '^NEXAR_[A-Z0-9_]+=' "$envf")
echo "   seed env: $(printf '%s ' "${vars[@]}" | sed 's/NEXAR_CLUSTER_TOKEN=[^ ]*/NEXAR_CLUSTER_TOKEN=.../')"

wp=()
start() {  # start NAME: one nexar-cluster-check with the seed's variables
  env "${vars[@]}" timeout -k 5 "$limit" "$bin/nexar-cluster-check" --quick --grow "$joiners" \
    >"$tmp/$1.log" 2>&1 &
  wp+=($!)
  pids+=($!)
  names+=("$1")
}
names=()
t0=$(date +%s%N)
for ((i = 0; i < members; i++)); do start "member$i"; done

# The joiners come once the members formed: they join the running job, not its formation.
script_wait "$limit" "$seed" grep -q 'cluster formed with' "$seed_log"
if ! grep -q "cluster formed with $members ranks" "$seed_log"; then
  echo "   the seed did not report formation with $members ranks; its output:"
  show_log "$seed_log"
  for ((i = 0; i < members; i++)); do echo "   ${names[i]}:"; show_log "$tmp/${names[i]}.log" 15; done
  fail "no formation"
fi
echo "   formed with $members ranks after $(( ($(date +%s%N) - t0) / 1000000 )) ms; starting $joiners joiners"
for ((j = 0; j < joiners; j++)); do start "joiner$j"; done

ok=0
for ((i = 0; i < world; i++)); do
  wait "${wp[i]}"
  rc=$?
  line=$(grep -E '^rank [0-9]+/[0-9]+:' "$tmp/${names[i]}.log" | tail -n 1)
  grew=$(grep -E '^rank [0-9]+: grew from' "$tmp/${names[i]}.log" | tail -n 1)
  if [ "$rc" = 0 ] && [[ "$line" =~ ^rank\ [0-9]+/$world:\ [0-9]+\ checks\ passed$ ]]; then
    echo "   ${names[i]}: $line${grew:+ ($grew)}"
  else
    echo "   ${names[i]}: exit $rc$(why "$rc"); ${line:-no summary line}; output:"
    show_log "$tmp/${names[i]}.log"
    ok=1
  fi
done
# Every rank of the grown world exactly once.
got=$(cat "$tmp"/member*.log "$tmp"/joiner*.log | sed -nE 's/^rank ([0-9]+)\/[0-9]+:.*/\1/p' | sort -n | tr '\n' ' ')
if [ "$ok" = 0 ] && [ "$got" != "$(seq -s ' ' 0 $((world - 1))) " ]; then
  echo "   ranks reported: $got; expected each of 0..$((world - 1)) once"
  ok=1
fi
# The joiners must hold the new ranks (members keep theirs through a grow).
if [ "$ok" = 0 ]; then
  jr=$(cat "$tmp"/joiner*.log | sed -nE 's/^rank ([0-9]+)\/[0-9]+:.*/\1/p' | sort -n | tr '\n' ' ')
  if [ "$jr" != "$(seq -s ' ' "$members" $((world - 1))) " ]; then
    echo "   joiners got ranks $jr; expected $(seq -s ' ' "$members" $((world - 1)))"
    ok=1
  fi
fi

# An elastic seed runs until stopped: it must still be running, and stop on SIGTERM.
if kill -0 "$seed" 2>/dev/null; then
  kill -TERM "$seed"
  wait "$seed"
  seed_rc=$?
  if [ "$seed_rc" != 143 ]; then
    echo "   nexar-seed: exit $seed_rc after SIGTERM (expected 143); output:"
    show_log "$seed_log"
    ok=1
  fi
else
  wait "$seed"
  echo "   nexar-seed exited ($?) before it was stopped; output:"
  show_log "$seed_log"
  ok=1
fi
echo "   total $(( ($(date +%s%N) - t0) / 1000000 )) ms"
if [ "$ok" = 0 ]; then echo "elastic grow test: PASS"; else echo "elastic grow test: FAIL"; fi
exit $ok
