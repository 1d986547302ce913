#!/usr/bin/env bash
# netns_queue_test.sh — a full queue on the way out costs a loss, not a busy loop of resends.
#
#   tests/netns_queue_test.sh [BUILD_DIR]      (default: build; needs nexar-seed, nexar-bench)
#
# A switch namespace with a bridge and 3 host namespaces (tests/netns_lib.sh), every host's
# link shaped by tbf at 1 Gbit/s, whose queue holds about 10 ms: host 0 runs nexar-seed,
# hosts 1 and 2 one rank each of nexar-bench all_reduce (bench/netns_bench_lib.sh's
# run_nexar), 64 MiB, checked. The ranks send faster than the link drains, so the tbf queue
# fills and refuses datagrams (ENOBUFS, reported through IP_RECVERR). A sender that sends a
# refused GSO batch again at once has it refused again and again: the qdisc then counts
# 13-66% of the packets it is offered as dropped here, depending on the load beside the test
# (and 17-23% with 4 ranks on 4 hosts).
# One that takes the refusal as a loss lets QUIC's congestion control slow down: well under
# a thousand of nearly half a million.
# The test passes when each rank's qdisc dropped under 1% of the packets it sent, and every
# result is right (nexar-bench exits non-zero on a wrong element).
#
# Exit status: 0 pass, 1 fail, 77 skipped (not root, or no network namespaces here).
set -uo pipefail

# shellcheck source=tests/script_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/script_lib.sh" "${1:-build}"

export NETNS_MTU=1500
export NETNS_IPV6=0
export NETNS_SUBNET4=${NETNS_SUBNET4:-10.81.0}
# shellcheck source=tests/netns_lib.sh
source "$here/netns_lib.sh"
# shellcheck source=bench/netns_bench_lib.sh
source "$repo/bench/netns_bench_lib.sh"

workers=2
port=${NETNS_PORT:-29400}
limit=120
rate=1gbit
unset NEXAR_UDP_PAYLOAD_BYTES NEXAR_SEED_ADDR NEXAR_CLUSTER_TOKEN NEXAR_CLUSTER_TOKEN_FILE NEXAR_RANK \
  NEXAR_WORLD_SIZE NEXAR_BIND_ADDR NEXAR_ADVERTISE_ADDR NEXAR_SOCKET_IFNAME NEXAR_SPIN_US OUT
bench_hosts netns_queue  # skips (77) without root and namespaces; sets out

status=0
fail() { echo "netns_queue test: FAIL: $*"; status=1; }

# qdisc_counts I: "SENT DROPPED", the packets host I's tbf sent and dropped so far.
qdisc_counts() {
  netns_exec "$1" tc -s qdisc show dev "$NETNS_DEV" |
    sed -nE 's/.*Sent [0-9]+ bytes ([0-9]+) pkt \(dropped ([0-9]+),.*/\1 \2/p' | head -1
}

declare -a before
for ((i = 1; i <= workers; i++)); do before[i]=$(qdisc_counts "$i"); done
bench_args=(-b 64M -e 64M -n 8 -w 1 -c 1)
echo "== 2 ranks, all_reduce 64 MiB over tbf $rate links"
run_nexar queue || fail "the run failed (logs in $out)"
grep -h '^ *67108864' "$out/queue.log" | sed 's/^/   /'
for ((i = 1; i <= workers; i++)); do
  read -r s0 d0 <<<"${before[i]}"
  read -r s1 d1 <<<"$(qdisc_counts "$i")"
  sent=$((s1 - s0)) dropped=$((d1 - d0))
  echo "   host $i's qdisc: sent $sent packets, dropped $dropped"
  [ "$sent" -gt 100000 ] || fail "host $i sent only $sent packets: the link was not loaded"
  [ $((dropped * 100)) -lt "$sent" ] || fail "host $i's qdisc dropped $dropped of $sent packets (1% at most)"
done

if [ "$status" = 0 ]; then
  echo "netns_queue test: PASS"
  rm -rf "$out"
fi
exit $status
