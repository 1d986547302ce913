#!/usr/bin/env bash
# multiprocess_test.sh — a nexar cluster of separate processes on 127.0.0.1.
#
#   tests/multiprocess_test.sh [BUILD_DIR]    (default: build)
#
#  (a) nexar-run -n 4 nexar-cluster-check --quick: the launcher starts the seed and 4 ranks.
#  (b) nexar-seed --listen 127.0.0.1:0 -n 4 --env-file F in the background, then 4
#      nexar-cluster-check --quick started by hand with the variables of F and
#      NEXAR_WORLD_SIZE=4 but no NEXAR_RANK: the seed assigns the ranks.
#  (c) nexar-run --bind-to core / none / auto: each rank's allowed CPUs (the program is a
#      shell printing them; binding needs no nexar program).
#  (d) polite waiting follows how the ranks share CPUs, not the one CPU a bound rank sees:
#      off for as many ranks as CPUs, bound or not; on for one rank more (bound or not).
#  (e) the TCP link: nexar-run -n 4 nexar-cluster-check (the whole battery, big sizes too)
#      with NEXAR_SHM=0 NEXAR_LINK=tcp, once with TLS and once in plaintext; every rank
#      passes and moves its 3 message lanes with each of its 3 peers onto TCP.
# Every process runs under `timeout` (MP_TIMEOUT seconds, default 120) and everything still
# running is killed on exit. Prints what ran and PASS/FAIL per part; exits 1 on a failure.
set -uo pipefail

# shellcheck source=tests/script_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/script_lib.sh" "${1:-build}"
limit=${MP_TIMEOUT:-120}
ranks=4

for exe in nexar-run nexar-seed nexar-cluster-check; do
  if [ ! -x "$bin/$exe" ]; then
    echo "multiprocess test: FAIL: $bin/$exe not found (build it first)"
    exit 1
  fi
done

script_tmp "multiprocess test" nexar-mp-test

# Do not let the caller's environment pick a seed, rank or launcher for us.
unset NEXAR_SEED_ADDR NEXAR_CLUSTER_TOKEN NEXAR_CLUSTER_TOKEN_FILE NEXAR_SEED_FINGERPRINT \
  NEXAR_SEED_CA NEXAR_RANK NEXAR_WORLD_SIZE NEXAR_BIND_ADDR NEXAR_ADVERTISE_ADDR NEXAR_SOCKET_IFNAME \
  RANK WORLD_SIZE LOCAL_RANK MASTER_ADDR MASTER_PORT OMPI_COMM_WORLD_RANK OMPI_COMM_WORLD_SIZE \
  PMI_RANK PMI_SIZE PMIX_RANK SLURM_PROCID SLURM_NTASKS SLURM_LOCALID SLURM_STEP_NODELIST

status=0
show_log() { sed 's/^/     /' "$1" | tail -n "${2:-30}"; }
why() { [ "$1" = 124 ] || [ "$1" = 137 ] && echo " (timed out after $limit s)"; }

# ---- (a) nexar-run ------------------------------------------------------------------------
part_a() {
  local log="$tmp/a.log" p rc
  echo "== (a) nexar-run -n $ranks nexar-cluster-check --quick"
  timeout -k 5 "$limit" "$bin/nexar-run" -n "$ranks" "$bin/nexar-cluster-check" --quick >"$log" 2>&1 &
  p=$!
  pids+=("$p")
  wait "$p"
  rc=$?
  grep -E '(^|\] )rank [0-9]+(/[0-9]+)?:' "$log" | sed 's/^/   /'
  local passed
  passed=$(grep -cE '(^|\] )rank [0-9]+/[0-9]+: [0-9]+ checks passed' "$log")
  if [ "$rc" = 0 ] && [ "$passed" = "$ranks" ]; then
    echo "(a) PASS"
    return 0
  fi
  echo "   nexar-run exited $rc$(why "$rc"); $passed of $ranks ranks reported success; output:"
  show_log "$log" 40
  echo "(a) FAIL"
  return 1
}

# ---- (b) nexar-seed + hand-started workers ---------------------------------------------------
part_b() {
  local envf="$tmp/seed.env" seed_log="$tmp/seed.log" seed t i rc seed_rc ok=0 vars=() wp=()
  echo "== (b) nexar-seed --listen 127.0.0.1:0 -n $ranks --env-file F; $ranks x nexar-cluster-check --quick (no NEXAR_RANK)"
  timeout -k 5 "$limit" "$bin/nexar-seed" --listen 127.0.0.1:0 -n "$ranks" --env-file "$envf" \
    --formation-timeout-ms $((limit * 1000 / 2)) >"$seed_log" 2>&1 &
  seed=$!
  pids+=("$seed")
  for ((t = 0; t < 100; t++)); do
    if grep -q '^NEXAR_SEED_ADDR=' "$envf" 2>/dev/null && grep -q '^NEXAR_CLUSTER_TOKEN' "$envf"; then
      break
    fi
    kill -0 "$seed" 2>/dev/null || break
    sleep 0.1
  done
  if ! grep -q '^NEXAR_SEED_ADDR=' "$envf" 2>/dev/null; then
    echo "   nexar-seed wrote no env file within 10 s; its output:"
    show_log "$seed_log"
    echo "(b) FAIL"
    return 1
  fi
  sleep 0.1  # the file may still be being written
  mapfile -t vars < <(grep -E '^NEXAR_[A-Z0-9_]+=' "$envf")
  echo "   seed env: $(printf '%s ' "${vars[@]}" | sed 's/NEXAR_CLUSTER_TOKEN=[^ ]*/NEXAR_CLUSTER_TOKEN=.../')"
  for ((i = 0; i < ranks; i++)); do
    env "${vars[@]}" NEXAR_WORLD_SIZE="$ranks" \
      timeout -k 5 "$limit" "$bin/nexar-cluster-check" --quick >"$tmp/b.w$i.log" 2>&1 &
    wp[i]=$!
    pids+=("${wp[i]}")
  done
  for ((i = 0; i < ranks; i++)); do
    wait "${wp[i]}"
    rc=$?
    if [ "$rc" = 0 ]; then
      echo "   worker $i: $(grep -E '^rank [0-9]+/[0-9]+:' "$tmp/b.w$i.log" | tail -n 1)"
    else
      echo "   worker $i: exit $rc$(why "$rc"); output:"
      show_log "$tmp/b.w$i.log"
      ok=1
    fi
  done
  # The seed assigned ranks: each of 0..ranks-1 exactly once.
  local got
  got=$(cat "$tmp"/b.w*.log | sed -nE 's/^rank ([0-9]+)\/[0-9]+:.*/\1/p' | sort -n | tr '\n' ' ')
  if [ "$ok" = 0 ] && [ "$got" != "$(seq -s ' ' 0 $((ranks - 1))) " ]; then
    echo "   ranks reported: $got; expected each of 0..$((ranks - 1)) once"
    ok=1
  fi
  wait "$seed"
  seed_rc=$?
  if [ "$seed_rc" != 0 ]; then
    echo "   nexar-seed exited $seed_rc$(why "$seed_rc"); output:"
    show_log "$seed_log"
    ok=1
  fi
  if [ "$ok" = 0 ]; then echo "(b) PASS"; else echo "(b) FAIL"; fi
  return $ok
}

# ---- (c) CPU binding ---------------------------------------------------------------------------
# Each rank prints "<local rank> <allowed CPU list>" (a shell, not a nexar program: the
# launcher's seed then reports that no cluster formed, on stderr, which is expected here).
bound_cpus() {
  timeout -k 5 "$limit" "$bin/nexar-run" -n "$1" --no-prefix --bind-to "$2" -- \
    sh -c 'echo "$NEXAR_LOCAL_RANK $(sed -n "s/^Cpus_allowed_list:[[:space:]]*//p" /proc/self/status)"' \
    2>/dev/null | sort -n
}
# "0-2,5" -> "0 1 2 5"
expand_cpus() {
  local part lo hi out=()
  IFS=, read -ra parts <<<"$1"
  for part in "${parts[@]}"; do
    lo=${part%-*}
    hi=${part#*-}
    for ((c = lo; c <= hi; c++)); do out+=("$c"); done
  done
  echo "${out[*]}"
}
part_c() {
  local mine n out want i ok=0
  mine=$(sed -n 's/^Cpus_allowed_list:[[:space:]]*//p' /proc/self/status)
  n=$(nproc)
  echo "== (c) nexar-run --bind-to: this shell may use CPUs $mine ($n)"
  # core: rank i on the i-th allowed CPU, one each.
  out=$(bound_cpus "$n" core)
  want=$(i=0; for c in $(expand_cpus "$mine"); do echo "$i $c"; i=$((i + 1)); done)
  if [ "$out" != "$want" ]; then
    echo "   --bind-to core with $n ranks gave:"; echo "$out" | sed 's/^/     /'; echo "   expected:"; echo "$want" | sed 's/^/     /'
    ok=1
  fi
  # none, and auto with more ranks than CPUs: left where the launcher may run.
  for mode in "none $n" "auto $((n + 1))"; do
    set -- $mode
    out=$(bound_cpus "$2" "$1" | awk '{print $2}' | sort -u)
    if [ "$out" != "$mine" ]; then
      echo "   --bind-to $1 with $2 ranks bound them: $(echo "$out" | tr '\n' ' ')"
      ok=1
    fi
  done
  if [ "$ok" = 0 ]; then echo "(c) PASS"; else echo "(c) FAIL"; fi
  return $ok
}

# ---- (d) polite waiting --------------------------------------------------------------------
# The effective config rank 0 logs at info level says whether waiters yield.
polite() {  # <ranks> <bind mode>: prints "on" or "off"
  env -u NEXAR_SPIN_US -u NEXAR_YIELD_WHEN_IDLE -u NEXAR_LOCAL_CPUS NEXAR_DEBUG=info \
    timeout -k 5 "$limit" "$bin/nexar-run" -n "$1" --bind-to "$2" -- "$bin/nexar-cluster-check" --quick \
    2>&1 | sed -n 's/.*yield_when_idle = \(on\|off\).*/\1/p' | head -n 1
}
part_d() {
  local n ok=0 mode got
  n=$(nproc)
  echo "== (d) polite waiting with $n CPUs"
  for mode in "$n auto off" "$n core off" "$n none off" "$((n + 1)) core on" "$((n + 1)) auto on"; do
    set -- $mode
    got=$(polite "$1" "$2")
    echo "   $1 ranks, --bind-to $2: yield_when_idle = ${got:-?} (want $3)"
    [ "$got" = "$3" ] || ok=1
  done
  if [ "$ok" = 0 ]; then echo "(d) PASS"; else echo "(d) FAIL"; fi
  return $ok
}

# ---- (e) the TCP link -------------------------------------------------------------------------
part_e() {
  local cipher log rc passed lanes ok=0
  for cipher in tls none; do
    log="$tmp/e-$cipher.log"
    echo "== (e) NEXAR_SHM=0 NEXAR_LINK=tcp NEXAR_TCP_CIPHER=$cipher nexar-run -n $ranks nexar-cluster-check"
    NEXAR_SHM=0 NEXAR_LINK=tcp NEXAR_TCP_CIPHER=$cipher NEXAR_DEBUG=info \
      timeout -k 5 "$limit" "$bin/nexar-run" -n "$ranks" "$bin/nexar-cluster-check" >"$log" 2>&1 &
    pids+=("$!")
    wait "$!"
    rc=$?
    passed=$(grep -cE '(^|\] )rank [0-9]+/[0-9]+: [0-9]+ checks passed' "$log")
    lanes=$(grep -cE "rank [0-9]+: peer [0-9]+: lane (data|bulk|collective) over TCP \($cipher\)" "$log")
    echo "   $passed of $ranks ranks passed; $lanes lanes moved to TCP (want $((ranks * (ranks - 1) * 3)))"
    if [ "$rc" != 0 ] || [ "$passed" != "$ranks" ] || [ "$lanes" != $((ranks * (ranks - 1) * 3)) ]; then
      echo "   nexar-run exited $rc$(why "$rc"); output:"
      show_log "$log" 40
      ok=1
    fi
  done
  if [ "$ok" = 0 ]; then echo "(e) PASS"; else echo "(e) FAIL"; fi
  return $ok
}

part_a || status=1
part_b || status=1
part_c || status=1
part_d || status=1
part_e || status=1
if [ "$status" = 0 ]; then echo "multiprocess test: PASS"; else echo "multiprocess test: FAIL"; fi
exit $status
