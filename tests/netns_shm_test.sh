#!/usr/bin/env bash
# netns_shm_test.sh — a cluster of 2 "hosts" (network namespaces) with 2 ranks each: ranks of
# one host talk through shared memory, ranks of different hosts over QUIC, and then, in a
# second round with NEXAR_LINK=tcp, over the TCP link (with TLS).
#
#   tests/netns_shm_test.sh [BUILD_DIR]      (default: build; needs nexar-seed and
#                                             nexar-cluster-check)
#
# A switch namespace with a bridge and 3 host namespaces (tests/netns_lib.sh): host 0 runs
# nexar-seed -n 4, hosts 1 and 2 two nexar-cluster-check --quick each (every collective,
# point-to-point and RPC against references it computes itself) with NEXAR_DEBUG=info and no
# NEXAR_RANK (the seed assigns ranks). Passes when every rank passes its checks and says
# that exactly one peer reaches it through shared memory: the other rank of its host; in the
# TCP round also that its three message lanes with each rank of the other host, and with no
# other rank, moved to TCP.
# (Namespaces keep abstract Unix sockets apart, and a rank's host key names its namespace,
# so ranks of two namespaces never attach: as two machines.)
#
# Exit status: 0 pass, 1 fail, 77 skipped (not root, or no network namespaces here).
set -uo pipefail

# shellcheck source=tests/script_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/script_lib.sh" "${1:-build}"
export NETNS_SUBNET4=${NETNS_SUBNET4:-10.79.0}
export NETNS_IPV6=0
# shellcheck source=tests/netns_lib.sh
source "$here/netns_lib.sh"

port=${NETNS_PORT:-29400}
limit=150
unset NEXAR_SEED_ADDR NEXAR_CLUSTER_TOKEN NEXAR_CLUSTER_TOKEN_FILE NEXAR_RANK NEXAR_WORLD_SIZE \
  NEXAR_BIND_ADDR NEXAR_ADVERTISE_ADDR NEXAR_SOCKET_IFNAME NEXAR_SHM
if ! why=$(netns_check); then
  echo "netns_shm test skipped: needs root and ip netns ($why)"
  exit 77
fi
script_need "netns_shm test" nexar-seed nexar-cluster-check
netns_guard "netns_shm test" nexar-shm-test
netns_cleanup_stale
netns_setup 3 || { echo "netns_shm test: FAIL: could not build the namespaces"; exit 1; }
# shellcheck disable=SC2119  # the default port
netns_probe || { echo "netns_shm test: FAIL: the namespaces cannot reach each other"; exit 1; }

status=0
fail() { echo "netns_shm test: FAIL: $*"; status=1; }

# round LINK PORT: one cluster with NEXAR_LINK=LINK, its seed on PORT.
round() {
  local link=$1 port=$2 envf="$tmp/seed-$1.env" seed vars h k p r q peers want tcp tcp_want
  ip netns exec "${NETNS_HOST[0]}" timeout -k 5 "$limit" "$bin/nexar-seed" --listen "${NETNS_ADDR4[0]}:$port" -n 4 \
    --env-file "$envf" --formation-timeout-ms 60000 >"$tmp/seed-$link.log" 2>&1 &
  seed=$!
  bg_pids+=("$seed")
  for ((t = 0; t < 100; t++)); do
    grep -q '^NEXAR_CLUSTER_TOKEN' "$envf" 2>/dev/null && break
    sleep 0.1
  done
  sleep 0.1
  mapfile -t vars < <(grep -E '^NEXAR_[A-Z0-9_]+=' "$envf")
  [ ${#vars[@]} -gt 0 ] || { fail "nexar-seed wrote no env file"; cat "$tmp/seed-$link.log"; return; }

  echo "netns_shm test ($link): 2 hosts (${NETNS_ADDR4[1]}, ${NETNS_ADDR4[2]}) x 2 ranks, seed in ${NETNS_ADDR4[0]}"
  declare -A host_of pid_of rank_of
  for h in 1 2; do
    for k in a b; do
      ip netns exec "${NETNS_HOST[h]}" env "${vars[@]}" NEXAR_WORLD_SIZE=4 NEXAR_DEBUG=info NEXAR_LINK="$link" \
        timeout -k 5 "$limit" "$bin/nexar-cluster-check" --quick >"$tmp/$link-h$h$k.log" 2>&1 &
      pid_of[h$h$k]=$!
      bg_pids+=("${pid_of[h$h$k]}")
    done
  done
  for p in h1a h1b h2a h2b; do
    wait "${pid_of[$p]}" || { fail "$p exited $?"; tail -n 20 "$tmp/$link-$p.log" | sed 's/^/    /'; }
    r=$(sed -nE 's/^rank ([0-9]+)\/4:.*/\1/p' "$tmp/$link-$p.log" | tail -n 1)
    [ -n "$r" ] || { fail "$p reported no rank"; continue; }
    host_of[$r]=${p:1:1}
    rank_of[$p]=$r
  done
  wait "$seed" || fail "nexar-seed exited $?"

  # Every rank: exactly one shared-memory peer, the other rank of its host; with tcp, the
  # three lanes of each rank of the other host on TCP.
  for p in h1a h1b h2a h2b; do
    r=${rank_of[$p]:-}
    [ -n "$r" ] || continue
    peers=$(sed -nE 's/.*rank [0-9]+: peer ([0-9]+) is on this host: message lanes through shared memory.*/\1/p' \
      "$tmp/$link-$p.log" | sort -n | tr '\n' ' ')
    tcp=$(sed -nE 's/.*rank [0-9]+: peer ([0-9]+): lane [a-z]+ over TCP.*/\1/p' "$tmp/$link-$p.log" | sort -n | tr '\n' ' ')
    want=""
    tcp_want=""
    for q in 0 1 2 3; do
      [ "$q" = "$r" ] && continue
      if [ "${host_of[$q]:-}" = "${host_of[$r]}" ]; then want="$q "; elif [ "$link" = tcp ]; then tcp_want+="$q $q $q "; fi
    done
    echo "   rank $r on host ${host_of[$r]}: shared memory with ${peers:-nobody} (expected $want); TCP lanes with ${tcp:-nobody} (expected ${tcp_want:-nobody})"
    [ "$peers" = "$want" ] || fail "rank $r: shared memory with '${peers}', expected '${want}'"
    [ "$tcp" = "$tcp_want" ] || fail "rank $r ($link): TCP lanes with '${tcp}', expected '${tcp_want}'"
    grep -E '^rank [0-9]+/4:' "$tmp/$link-$p.log" | tail -n 1 | sed 's/^/     /'
  done
}

round quic "$port"
round tcp $((port + 1))

[ "$status" = 0 ] && echo "netns_shm test: PASS"
exit $status
