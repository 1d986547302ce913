#!/usr/bin/env bash
# netns_pmtu_test.sh — datagram size follows the path MTU across "hosts" (network namespaces).
#
#   tests/netns_pmtu_test.sh [BUILD_DIR]      (default: build; needs nexar-seed, nexar-bench)
#
# A switch namespace with a bridge and 3 host namespaces (tests/netns_lib.sh), every link MTU
# 9000, no shaping: host 0 runs nexar-seed, hosts 1 and 2 one rank each of nexar-bench
# all_reduce (bench/netns_bench_lib.sh's run_nexar) with NEXAR_DEBUG=info and no
# NEXAR_UDP_PAYLOAD_BYTES, so the library picks the size. Parts:
#   jumbo    over IPv4, the ranks' connection probes its way to 8972-byte datagrams (9000
#            less the IPv4 and UDP headers); over IPv6 (the seed's IPv6 address, so the
#            ranks dial each other's IPv6 addresses) to 8952.
#   ethernet every link at MTU 1500 first: 1472-byte datagrams, never more.
#   drop     MTU 9000 again; while a long all_reduce runs at 8972-byte datagrams, every
#            host's interface drops to MTU 1500 (ip link set eth0 mtu 1500): the run ends
#            with every result right and no error, and the ranks say they now send
#            their datagrams as IP fragments.
# Results are checked by nexar-bench itself (#wrong; it exits non-zero on a wrong element).
#
# Exit status: 0 pass, 1 fail, 77 skipped (not root, or no network namespaces here).
set -uo pipefail

# shellcheck source=tests/script_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/script_lib.sh" "${1:-build}"

export NETNS_MTU=9000
export NETNS_SUBNET4=${NETNS_SUBNET4:-10.78.0}
export NETNS_SUBNET6=${NETNS_SUBNET6:-fd78::}
# shellcheck source=tests/netns_lib.sh
source "$here/netns_lib.sh"
# shellcheck source=bench/netns_bench_lib.sh
source "$repo/bench/netns_bench_lib.sh"

workers=2
port=${NETNS_PORT:-29400}
limit=120
rate=""
unset NEXAR_UDP_PAYLOAD_BYTES NEXAR_SEED_ADDR NEXAR_CLUSTER_TOKEN NEXAR_CLUSTER_TOKEN_FILE NEXAR_RANK \
  NEXAR_WORLD_SIZE NEXAR_BIND_ADDR NEXAR_ADVERTISE_ADDR NEXAR_SOCKET_IFNAME
if ! why=$(netns_check); then
  echo "netns_pmtu test skipped: needs root and ip netns ($why)"
  exit 77
fi
script_need "netns_pmtu test" nexar-seed nexar-bench
out=$(mktemp -d /tmp/nexar-pmtu-test.XXXXXX)
netns_guard "netns_pmtu test" nexar-pmtu-test
netns_cleanup_stale
netns_setup $((workers + 1)) || { echo "netns_pmtu test: FAIL: could not build the namespaces"; exit 1; }
# shellcheck disable=SC2119  # the default port
netns_probe || { echo "netns_pmtu test: FAIL: the namespaces cannot reach each other"; exit 1; }

status=0
fail() { echo "netns_pmtu test: FAIL: $*"; status=1; }

# set_mtu M: every interface of the topology (hosts' eth0, the bridge's ports, the bridge).
set_mtu() {
  local i
  for ((i = 0; i <= workers; i++)); do netns_exec "$i" ip link set "$NETNS_DEV" mtu "$1"; done
  for ((i = 0; i <= workers; i++)); do ip -n "$NETNS_SWITCH" link set "p$i" mtu "$1"; done
  ip -n "$NETNS_SWITCH" link set "$NETNS_BRIDGE" mtu "$1"
}

# sizes LABEL: the datagram sizes the ranks' logs say their paths to the other rank carry,
# largest last ("the path to ADDR carries N-byte datagrams"; seed links excluded).
sizes() {
  cat "$out/$1.log" "$out/$1".rank*.log 2>/dev/null | grep -v "${NETNS_ADDR4[0]}\|${NETNS_ADDR6[0]}" |
    sed -nE 's/.*the path to .* carries ([0-9]+)-byte datagrams.*/\1/p' | sort -n | uniq | tr '\n' ' '
}

# expect_size LABEL N: the largest size logged is N.
expect_size() {
  local got
  got=$(sizes "$1")
  echo "   $1: datagram sizes the ranks reached: ${got:-none}"
  [ "$(echo "$got" | awk '{ print $NF }')" = "$2" ] || fail "$1: largest datagram size ${got:-none}, expected $2"
}

bench_args=(-b 4M -e 4M -n 3 -w 1 -c 1)
echo "== jumbo: MTU 9000, IPv4"
run_nexar jumbo4 NEXAR_DEBUG=info || fail "jumbo4: the run failed (logs in $out)"
expect_size jumbo4 8972
if [ "$NETNS_IPV6" = 1 ]; then
  echo "== jumbo: MTU 9000, IPv6"
  # The ranks learn each other's addresses from the seed, which they reach over IPv6.
  saved_addr=("${NETNS_ADDR4[@]}")
  NETNS_ADDR4[0]="[${NETNS_ADDR6[0]}]"
  run_nexar jumbo6 NEXAR_DEBUG=info || fail "jumbo6: the run failed (logs in $out)"
  NETNS_ADDR4=("${saved_addr[@]}")
  expect_size jumbo6 8952
fi

echo "== ethernet: MTU 1500"
set_mtu 1500
run_nexar ethernet NEXAR_DEBUG=info || fail "ethernet: the run failed (logs in $out)"
expect_size ethernet 1472

echo "== drop: MTU 9000 -> 1500 during a transfer"
set_mtu 9000
bench_args=(-b 64M -e 64M -n 40 -w 1 -c 1)
run_nexar drop NEXAR_DEBUG=info &
run=$!
for ((t = 0; t < 300; t++)); do
  [ -n "$(sizes drop)" ] && [ "$(sizes drop | awk '{ print $NF }')" = 8972 ] && break
  kill -0 "$run" 2>/dev/null || break
  sleep 0.1
done
sleep 0.5  # well into the transfer
if kill -0 "$run" 2>/dev/null; then
  for ((i = 0; i <= workers; i++)); do netns_exec "$i" ip link set "$NETNS_DEV" mtu 1500; done
  echo "   interfaces at MTU 1500 while the all_reduce ran"
else
  fail "drop: the run ended before the MTU could drop"
fi
wait "$run" || fail "drop: the run failed after the MTU dropped (logs in $out)"
expect_size drop 8972
# grep reads the files itself: `cat ... | grep -q` under pipefail fails whenever grep finds
# the line and exits before cat has written the last file (cat then dies of SIGPIPE).
if grep -q "no longer carries 8972-byte datagrams; sending them as IP fragments" "$out/drop.log" "$out"/drop.rank*.log; then
  echo "   the ranks fragment their datagrams after the drop"
else
  fail "drop: no rank said it fragments its datagrams (logs in $out)"
fi
if cat "$out/drop.log" "$out"/drop.rank*.log | grep "\[error\]"; then fail "drop: errors logged"; fi
grep -h '^ *67108864' "$out/drop.log" | sed 's/^/   /'

if [ "$status" = 0 ]; then
  echo "netns_pmtu test: PASS"
  rm -rf "$out"
fi
exit $status
