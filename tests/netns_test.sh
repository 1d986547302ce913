#!/usr/bin/env bash
# netns_test.sh — a nexar cluster across "hosts" made of network namespaces.
#
#   tests/netns_test.sh [BUILD_DIR]      (default: build; needs BUILD_DIR/bin/nexar-seed and
#                                         BUILD_DIR/bin/nexar-cluster-check)
#
# Builds (tests/netns_lib.sh) a switch namespace with a bridge and 5 host namespaces on one
# subnet: host 0 runs nexar-seed, hosts 1..4 one nexar-cluster-check --allreduce-only each,
# with the seed's environment file and NEXAR_WORLD_SIZE=4 but no NEXAR_RANK (the seed assigns
# the ranks). Every link's receive queues have rps_cpus set. Before nexar runs, a UDP echo
# between every pair of hosts checks the plumbing. Then the same over IPv6, with two engine
# threads per rank (NEXAR_ENGINE_THREADS=2: extra connections on shards). Then, with every
# host dropping NETNS_LOSS (5%) of its incoming UDP datagrams (iptables statistic), the
# workers run nexar-cluster-check --soak NETNS_SOAK_SECONDS (60): bulk transfers around the
# ring saturate the links while all_reduces are checked; a false failure fails the test.
# Last, with host 3 alone dropping NETNS_LOSS of its incoming UDP, each rank sends 4 MiB to
# every other (nexar-cluster-check --peer-stats): Communicator::stats() must count lost
# packets on the paths to host 3's rank and not on the others.
#
# Exit status: 0 pass, 1 fail, 77 skipped (not root, or no network namespaces here).
# Everything it creates (namespaces, veths, the bridge, temporary files, processes) is
# removed on exit, on failure and on Ctrl-C, and leftovers of an interrupted earlier run
# with the same names are removed first.
#
# Environment: NETNS_SUBNET4 (default 10.77.0), NETNS_SUBNET6 (default fd77::), NETNS_IPV6=0
# to skip the IPv6 part, NETNS_CHECK_ARGS (default --allreduce-only), NETNS_TIMEOUT (seconds
# per process, default 120), NETNS_PORT (seed port, default 29400), NETNS_SOAK_SECONDS
# (default 60; 0 skips the loss part), NETNS_LOSS (default 0.05).
set -uo pipefail

# shellcheck source=tests/script_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/script_lib.sh" "${1:-build}"

# shellcheck source=tests/netns_lib.sh
source "$here/netns_lib.sh"

workers=4
port=${NETNS_PORT:-29400}
limit=${NETNS_TIMEOUT:-120}
read -r -a check_args <<<"${NETNS_CHECK_ARGS:---allreduce-only}"
soak=${NETNS_SOAK_SECONDS:-60}
loss=${NETNS_LOSS:-0.05}

if ! why=$(netns_check); then
  echo "netns test skipped: needs root and ip netns ($why)"
  exit 77
fi
for exe in nexar-seed nexar-cluster-check; do
  if [ ! -x "$bin/$exe" ]; then
    echo "netns test: FAIL: $bin/$exe not found (build it first)"
    exit 1
  fi
done

# Do not let the caller's environment pick a seed, rank or launcher for the workers.
unset NEXAR_SEED_ADDR NEXAR_CLUSTER_TOKEN NEXAR_CLUSTER_TOKEN_FILE NEXAR_SEED_FINGERPRINT \
  NEXAR_SEED_CA NEXAR_RANK NEXAR_WORLD_SIZE NEXAR_BIND_ADDR NEXAR_ADVERTISE_ADDR NEXAR_SOCKET_IFNAME \
  RANK WORLD_SIZE LOCAL_RANK MASTER_ADDR MASTER_PORT OMPI_COMM_WORLD_RANK OMPI_COMM_WORLD_SIZE \
  PMI_RANK PMI_SIZE PMIX_RANK SLURM_PROCID SLURM_NTASKS SLURM_LOCALID SLURM_STEP_NODELIST

netns_guard "netns test" nexar-netns-test

netns_cleanup_stale
if ! netns_setup $((workers + 1)); then
  echo "netns test: FAIL: could not build the namespaces"
  exit 1
fi
echo "netns test: switch $NETNS_SWITCH (bridge $NETNS_BRIDGE), hosts ${NETNS_HOST[*]}"
echo "netns test: addresses ${NETNS_ADDR4[*]}$([ "$NETNS_IPV6" = 1 ] && echo " ${NETNS_ADDR6[*]}")"
# shellcheck disable=SC2119  # the default port
if ! netns_probe; then
  echo "netns test: FAIL: the namespaces cannot reach each other over UDP"
  exit 1
fi
echo "netns test: UDP echo between every pair of hosts: ok"

# Lines NEXAR_X=value of an env file, one per array element.
read_env() { grep -E '^NEXAR_[A-Z0-9_]+=' "$1"; }

# run_part NAME SEED_LISTEN 4|6: the seed in host 0, the workers in hosts 1..4.
run_part() {
  local name=$1 listen=$2 fam=$3 envf="$tmp/$1.env" i t seed_pid rc seed_rc status=0
  local pids=() vars=() args=("${check_args[@]}")
  [ -n "${4:-}" ] && read -r -a args <<<"$4"
  rm -f "$envf"
  echo "== $name: nexar-seed --listen $listen -n $workers in ${NETNS_HOST[0]}; nexar-cluster-check ${args[*]} in ${NETNS_HOST[*]:1}"
  # Started with ip netns exec directly (not through a function) so that $! is the process
  # itself (ip execs timeout), which a kill reaches.
  ip netns exec "${NETNS_HOST[0]}" timeout -k 5 "$limit" "$bin/nexar-seed" --listen "$listen" -n "$workers" \
    --env-file "$envf" --formation-timeout-ms $((limit * 1000 / 2)) >"$tmp/$name.seed.log" 2>&1 &
  seed_pid=$!
  bg_pids+=("$seed_pid")
  for ((t = 0; t < 100; t++)); do
    if [ -s "$envf" ] && grep -q '^NEXAR_SEED_ADDR=' "$envf" && grep -q '^NEXAR_CLUSTER_TOKEN' "$envf"; then
      break
    fi
    kill -0 "$seed_pid" 2>/dev/null || break
    sleep 0.1
  done
  if ! grep -q '^NEXAR_SEED_ADDR=' "$envf" 2>/dev/null; then
    echo "$name: FAIL: nexar-seed wrote no env file within 10 s; its output:"
    sed 's/^/  seed: /' "$tmp/$name.seed.log"
    kill "$seed_pid" 2>/dev/null
    wait "$seed_pid" 2>/dev/null
    return 1
  fi
  sleep 0.1  # the file may still be being written
  mapfile -t vars < <(read_env "$envf")
  echo "   seed env: $(read_env "$envf" | sed 's/^\(NEXAR_CLUSTER_TOKEN=\).*/\1.../' | tr '\n' ' ')"
  for ((i = 1; i <= workers; i++)); do
    ip netns exec "${NETNS_HOST[i]}" env "${vars[@]}" "${part_env[@]}" NEXAR_WORLD_SIZE="$workers" \
      timeout -k 5 "$limit" "$bin/nexar-cluster-check" "${args[@]}" >"$tmp/$name.w$i.log" 2>&1 &
    pids[i]=$!
    bg_pids+=("${pids[i]}")
  done
  for ((i = 1; i <= workers; i++)); do
    wait "${pids[i]}"
    rc=$?
    local summary
    summary=$(grep -E '^rank [0-9]+/[0-9]+:' "$tmp/$name.w$i.log" | tail -n 1)
    local addr=${NETNS_ADDR4[i]}
    [ "$fam" = 6 ] && addr=${NETNS_ADDR6[i]}
    if [ "$rc" = 0 ]; then
      echo "   host $i ($addr): ${summary:-exit 0}"
      grep -E '^rank [0-9]+: soak:' "$tmp/$name.w$i.log" | sed 's/^/     /'
    else
      echo "   host $i ($addr): exit $rc$([ "$rc" = 124 ] && echo " (timed out after $limit s)"); output:"
      sed 's/^/     /' "$tmp/$name.w$i.log" | tail -n 30
      status=1
    fi
  done
  # The seed assigned the ranks: each of 0..workers-1 exactly once.
  local got
  got=$(cat "$tmp/$name".w*.log | sed -nE 's/^rank ([0-9]+)\/[0-9]+:.*/\1/p' | sort -n | tr '\n' ' ')
  if [ "$status" = 0 ] && [ "$got" != "$(seq -s ' ' 0 $((workers - 1))) " ]; then
    echo "   ranks reported: $got; expected each of 0..$((workers - 1)) once"
    status=1
  fi
  wait "$seed_pid"
  seed_rc=$?
  if [ "$seed_rc" != 0 ]; then
    echo "   nexar-seed: exit $seed_rc; output:"
    sed 's/^/     /' "$tmp/$name.seed.log" | tail -n 30
    status=1
  fi
  if [ "$status" = 0 ]; then echo "$name: PASS"; else echo "$name: FAIL"; fi
  return $status
}

status=0
part_env=()
run_part ipv4 "${NETNS_ADDR4[0]}:$port" 4 || status=1
if [ "$NETNS_IPV6" = 1 ]; then
  # Two engine threads per rank here: two of each pair's three extra connections go to the
  # peer's shard port, which it announced over IPv6 (docs/PROTOCOL.md, "ports").
  part_env=(NEXAR_ENGINE_THREADS=2 NEXAR_DEBUG=debug)
  run_part ipv6 "[${NETNS_ADDR6[0]}]:$port" 6 || status=1
  part_env=()
  for ((i = 1; i <= workers; i++)); do
    if ! grep -q 'an extra connection is up on a shard' "$tmp/ipv6.w$i.log"; then
      echo "ipv6: FAIL: host $i used no extra connection on a shard; its log ends:"
      tail -n 20 "$tmp/ipv6.w$i.log" | sed 's/^/     /'
      status=1
    fi
  done
fi
# Under random datagram loss, with the links kept busy by bulk transfers and more ranks than
# cores, nobody may be declared failed and every result must stay exact (failure detection
# must tell a lossy, saturated link from a dead peer).
if [ "$soak" -gt 0 ]; then
  if ip netns exec "${NETNS_HOST[0]}" iptables -L INPUT >/dev/null 2>&1; then
    for ((i = 0; i <= workers; i++)); do
      ip netns exec "${NETNS_HOST[i]}" iptables -A INPUT -p udp -m statistic --mode random \
        --probability "$loss" -j DROP
    done
    run_part "loss$loss" "${NETNS_ADDR4[0]}:$port" 4 "--soak $soak" || status=1
    for ((i = 0; i <= workers; i++)); do ip netns exec "${NETNS_HOST[i]}" iptables -F INPUT; done
  else
    echo "== loss: skipped (iptables does not work in the namespaces)"
  fi
fi
# Stats name the lossy path: only host 3 drops (NETNS_LOSS of) the datagrams that arrive at
# it. Each rank sends 4 MiB to every other; every rank sending to host 3's rank must count
# packets lost to that peer (Communicator::stats()), and at most a couple (spurious) to
# any other.
if ip netns exec "${NETNS_HOST[0]}" iptables -L INPUT >/dev/null 2>&1; then
  ip netns exec "${NETNS_HOST[3]}" iptables -A INPUT -p udp -m statistic --mode random --probability "$loss" -j DROP
  if run_part peer-stats "${NETNS_ADDR4[0]}:$port" 4 "--peer-stats"; then
    lossy=$(sed -nE 's/^rank ([0-9]+)\/[0-9]+:.*/\1/p' "$tmp/peer-stats.w3.log" | head -n 1)
    for ((i = 1; i <= workers; i++)); do
      [ "$i" = 3 ] && continue
      line=$(grep -E '^rank [0-9]+: peer-stats:' "$tmp/peer-stats.w$i.log")
      echo "   host $i: ${line#*: }"
      # Fields after "lost", by world rank: the lossy rank's must be >= 1, the others <= 2.
      if ! awk -v lossy="$lossy" '{ for (f = 1; f <= NF; f++) if ($f == "lost") break;
             for (r = 0; $(f + 1 + r) != "rtt_us"; r++) { v = $(f + 1 + r); if (v == "-") continue;
               if (r == lossy && v < 1) exit 1; if (r != lossy && v > 2) exit 1 } }' <<<"$line"; then
        echo "peer-stats: FAIL: host $i should count losses to rank $lossy (host 3) only"
        status=1
      fi
    done
    [ "$status" = 0 ] && echo "peer-stats: losses counted on the path to rank $lossy only"
  else
    status=1
  fi
  ip netns exec "${NETNS_HOST[3]}" iptables -F INPUT
fi
if [ "$status" = 0 ]; then echo "netns test: PASS"; else echo "netns test: FAIL"; fi
exit $status
