# shellcheck shell=bash
# netns_lib.sh — several "hosts" on one machine, for tests/netns_test.sh and
# bench/netns_allreduce.sh. Source it; it defines functions and variables only.
#
# Topology (nothing is created in the caller's namespace, so the host's networking is left
# alone): a "switch" namespace holding a bridge, and N host namespaces, each joined to the
# bridge by a veth pair created directly in the two namespaces (host end "eth0", bridge end
# "p<i>").
#
#   host i:   namespace  ${NETNS_HOST[i]}  (nx<tag>-h<i>)
#             addresses  ${NETNS_ADDR4[i]} = ${NETNS_SUBNET4}.<i+1>/24
#                        ${NETNS_ADDR6[i]} = ${NETNS_SUBNET6}<i+1>/64   (nodad)
#   switch:   namespace  $NETNS_SWITCH     (nx<tag>-sw), bridge nxbr<tag>
#
# Every veth receive queue, on both ends, gets rps_cpus = all CPUs: without it one flow's
# packets are spread over CPUs, reordered, and retransmitted spuriously. With a rate, every
# link is shaped in both directions with tbf (host end: the host's egress; bridge end: the
# host's ingress), bucket max(128 KiB, 1 ms at the rate), latency 10ms.
#
# Functions:
#   netns_check                     0 when root and `ip netns add` works; else prints why
#   netns_setup N [RATE]            builds the topology (RATE like 1gbit, 500mbit); 0 on success
#   netns_exec I CMD...             runs CMD in host I's namespace
#   netns_probe                     UDP echo between every pair of hosts (v4, and v6 if on)
#   netns_cleanup                   kills what runs in the namespaces, deletes them (idempotent)
#   netns_cleanup_stale             deletes nx<pid>-* namespaces whose <pid> no longer runs
#   netns_rate_bits RATE            prints RATE in bit/s
#
# Settings (environment, before netns_setup):
#   NETNS_TAG      name suffix, default $$ (unique per run, so parallel runs do not clash)
#   NETNS_SUBNET4  first three octets of the IPv4 /24, default 10.77.0
#   NETNS_SUBNET6  IPv6 /64 prefix with trailing "::", default fd77::
#   NETNS_IPV6     1 (default) to give every host an IPv6 address too, 0 not to
#   NETNS_MTU      MTU of every link, default 1500

NETNS_TAG=${NETNS_TAG:-$$}
NETNS_SUBNET4=${NETNS_SUBNET4:-10.77.0}
NETNS_SUBNET6=${NETNS_SUBNET6:-fd77::}
NETNS_IPV6=${NETNS_IPV6:-1}
NETNS_MTU=${NETNS_MTU:-1500}
NETNS_SWITCH="nx${NETNS_TAG}-sw"
NETNS_BRIDGE="nxbr${NETNS_TAG}"
NETNS_DEV=eth0
NETNS_HOST=()
NETNS_ADDR4=()
NETNS_ADDR6=()
NETNS_N=0

netns_log() { echo "netns: $*" >&2; }

# Returns 0 when namespaces can be made here; otherwise prints the reason on stdout.
netns_check() {
  if [ "$(id -u)" != 0 ]; then
    echo "not root"
    return 1
  fi
  if ! command -v ip >/dev/null 2>&1; then
    echo "no 'ip' command (iproute2)"
    return 1
  fi
  local probe="nx${NETNS_TAG}-probe" err
  ip netns del "$probe" 2>/dev/null
  if ! err=$(ip netns add "$probe" 2>&1); then
    echo "'ip netns add' failed: $err"
    return 1
  fi
  if ! err=$(ip -n "$probe" link add nxprobe0 type veth peer name nxprobe1 2>&1); then
    ip netns del "$probe" 2>/dev/null
    echo "cannot create veth pairs: $err"
    return 1
  fi
  ip netns del "$probe" 2>/dev/null
  return 0
}

# "1gbit" -> 1000000000. Units as tc reads them: bit, kbit, mbit, gbit, tbit (powers of 1000),
# and bps, kbps, mbps, gbps (bytes per second).
netns_rate_bits() {
  local r=${1,,} num unit
  num=${r%%[a-z]*}
  unit=${r#"$num"}
  [ -n "$num" ] || { echo "netns: bad rate '$1'" >&2; return 1; }
  awk -v n="$num" -v u="$unit" 'BEGIN {
      m["bit"] = 1; m[""] = 1; m["kbit"] = 1e3; m["mbit"] = 1e6; m["gbit"] = 1e9; m["tbit"] = 1e12
      m["bps"] = 8; m["kbps"] = 8e3; m["mbps"] = 8e6; m["gbps"] = 8e9
      if (!(u in m)) exit 1
      printf "%.0f\n", n * m[u] }' || { echo "netns: bad rate '$1'" >&2; return 1; }
}

# All-CPUs mask in the format of rps_cpus (comma-separated 32-bit hex groups).
netns_cpu_mask() {
  local n
  n=$(nproc --all 2>/dev/null || nproc)
  awk -v n="$n" 'BEGIN {
      out = ""
      for (g = 0; n > 0; g++) {
        k = (n >= 32) ? 32 : n
        v = (k == 32) ? "ffffffff" : sprintf("%x", 2 ^ k - 1)
        out = (out == "") ? v : v "," out
        n -= k
      }
      print out }'
}

# Sets rps_cpus on every receive queue of every veth of namespace $1.
netns_set_rps() {
  local ns=$1 mask
  mask=$(netns_cpu_mask)
  # /sys inside `ip netns exec` shows that namespace's devices.
  # shellcheck disable=SC2016  # expanded by the inner shell
  ip netns exec "$ns" sh -c '
    for q in /sys/class/net/*/queues/rx-*/rps_cpus; do
      [ -e "$q" ] || continue
      case "$q" in /sys/class/net/lo/*) continue ;; esac
      echo "$1" >"$q" || exit 1
    done' sh "$mask"
}

# tbf on device $2 of namespace $1 at $3 (tc rate syntax).
netns_shape() {
  local ns=$1 dev=$2 rate=$3 bits burst
  bits=$(netns_rate_bits "$rate") || return 1
  burst=$(( bits / 8 / 1000 ))  # 1 ms at the rate, in bytes
  [ "$burst" -ge 131072 ] || burst=131072
  ip -n "$ns" link set "$dev" txqueuelen 1000 2>/dev/null
  tc -n "$ns" qdisc replace dev "$dev" root tbf rate "$rate" burst "$burst" latency 10ms
}

# netns_setup N [RATE]
netns_setup() {
  local n=$1 rate=${2:-} i ns port
  NETNS_N=$n
  NETNS_HOST=()
  NETNS_ADDR4=()
  NETNS_ADDR6=()
  for ((i = 0; i < n; i++)); do
    NETNS_HOST[i]="nx${NETNS_TAG}-h$i"
    NETNS_ADDR4[i]="${NETNS_SUBNET4}.$((i + 1))"
    NETNS_ADDR6[i]="${NETNS_SUBNET6}$((i + 1))"
  done
  # Leftovers of an interrupted run with the same names.
  netns_cleanup
  {
    ip netns add "$NETNS_SWITCH" &&
    ip -n "$NETNS_SWITCH" link set lo up &&
    ip -n "$NETNS_SWITCH" link add "$NETNS_BRIDGE" type bridge &&
    ip -n "$NETNS_SWITCH" link set "$NETNS_BRIDGE" mtu "$NETNS_MTU" &&
    ip -n "$NETNS_SWITCH" link set "$NETNS_BRIDGE" up
  } || { netns_log "cannot create switch namespace $NETNS_SWITCH"; return 1; }
  # No IPv6 autoconfiguration or DAD on the bridge ports (they carry no address).
  ip netns exec "$NETNS_SWITCH" sysctl -qw net.ipv6.conf.all.disable_ipv6=1 2>/dev/null
  for ((i = 0; i < n; i++)); do
    ns=${NETNS_HOST[i]}
    port="p$i"
    {
      ip netns add "$ns" &&
      ip -n "$ns" link set lo up &&
      ip -n "$NETNS_SWITCH" link add "$port" type veth peer name "$NETNS_DEV" netns "$ns" &&
      ip -n "$NETNS_SWITCH" link set "$port" mtu "$NETNS_MTU" master "$NETNS_BRIDGE" &&
      ip -n "$NETNS_SWITCH" link set "$port" up &&
      ip -n "$ns" link set "$NETNS_DEV" mtu "$NETNS_MTU" &&
      ip -n "$ns" addr add "${NETNS_ADDR4[i]}/24" dev "$NETNS_DEV" &&
      ip -n "$ns" link set "$NETNS_DEV" up
    } || { netns_log "cannot set up host namespace $ns"; return 1; }
    if [ "$NETNS_IPV6" = 1 ]; then
      ip netns exec "$ns" sysctl -qw net.ipv6.conf.all.accept_dad=0 net.ipv6.conf.default.accept_dad=0 \
        >/dev/null 2>&1
      ip -n "$ns" addr add "${NETNS_ADDR6[i]}/64" dev "$NETNS_DEV" nodad ||
        { netns_log "cannot add ${NETNS_ADDR6[i]} in $ns"; return 1; }
    fi
    netns_set_rps "$ns" || { netns_log "cannot set rps_cpus in $ns"; return 1; }
    if [ -n "$rate" ]; then
      if ! netns_shape "$ns" "$NETNS_DEV" "$rate" || ! netns_shape "$NETNS_SWITCH" "$port" "$rate"; then
        netns_log "cannot shape the link of $ns with tbf at $rate"
        return 1
      fi
    fi
  done
  netns_set_rps "$NETNS_SWITCH" || { netns_log "cannot set rps_cpus in $NETNS_SWITCH"; return 1; }
  # Wait for the links to come up (carrier on both veth ends).
  local tries
  for ((i = 0; i < n; i++)); do
    for ((tries = 0; tries < 50; tries++)); do
      ip -n "${NETNS_HOST[i]}" link show "$NETNS_DEV" 2>/dev/null | grep -q 'state UP' && break
      sleep 0.1
    done
  done
  return 0
}

# netns_exec I CMD...
netns_exec() {
  local i=$1
  shift
  ip netns exec "${NETNS_HOST[i]}" "$@"
}

# UDP echo between every ordered pair of hosts, IPv4 and (when on) IPv6. Uses perl, which
# every Debian system has. Returns non-zero and says which pair failed.
netns_probe() {
  local port=${1:-29499} i j fams=(4) fam addr pids=() ok=0
  [ "$NETNS_IPV6" = 1 ] && fams+=(6)
  command -v perl >/dev/null 2>&1 || { netns_log "probe skipped: no perl"; return 0; }
  # shellcheck disable=SC2016  # perl variables
  local server='
    use IO::Socket::IP; my ($a4, $a6, $port) = @ARGV; my @s;
    for my $a ($a4, $a6) { next unless length $a;
      push @s, IO::Socket::IP->new(LocalHost => $a, LocalPort => $port, Proto => "udp")
        or die "bind $a: $@"; }
    use IO::Select; my $sel = IO::Select->new(@s); alarm 30; $| = 1; print "ready\n";
    while (my @r = $sel->can_read) { for my $s (@r) { my $peer = $s->recv(my $buf, 2048);
      exit 0 if $buf eq "quit"; $s->send("echo:$buf", 0, $peer); } }'
  # shellcheck disable=SC2016  # perl variables
  local client='
    use IO::Socket::IP; my ($addr, $port, $msg) = @ARGV;
    my $s = IO::Socket::IP->new(PeerHost => $addr, PeerPort => $port, Proto => "udp") or die "socket: $@";
    for my $try (1 .. 20) { $s->send($msg); my $rin = ""; vec($rin, fileno($s), 1) = 1;
      if (select(my $rout = $rin, undef, undef, 0.25)) { $s->recv(my $buf, 2048);
        exit 0 if $buf eq "echo:$msg"; } }
    exit 1;'
  local tmpd
  tmpd=$(mktemp -d /tmp/nexar-netns-probe.XXXXXX)
  for ((i = 0; i < NETNS_N; i++)); do
    local a6=""
    [ "$NETNS_IPV6" = 1 ] && a6=${NETNS_ADDR6[i]}
    ip netns exec "${NETNS_HOST[i]}" perl -e "$server" "${NETNS_ADDR4[i]}" "$a6" "$port" >"$tmpd/s$i" 2>&1 &
    pids+=($!)
  done
  for ((i = 0; i < NETNS_N; i++)); do  # wait until every server is bound
    local t
    for ((t = 0; t < 50; t++)); do grep -q ready "$tmpd/s$i" 2>/dev/null && break; sleep 0.1; done
  done
  for fam in "${fams[@]}"; do
    for ((i = 0; i < NETNS_N; i++)); do
      for ((j = 0; j < NETNS_N; j++)); do
        [ "$i" = "$j" ] && continue
        if [ "$fam" = 4 ]; then addr=${NETNS_ADDR4[j]}; else addr=${NETNS_ADDR6[j]}; fi
        if ! netns_exec "$i" perl -e "$client" "$addr" "$port" "from-$i-to-$j" 2>/dev/null; then
          netns_log "probe: host $i (${NETNS_HOST[i]}) gets no UDP echo from $addr:$port"
          ok=1
        fi
      done
    done
  done
  for ((i = 0; i < NETNS_N; i++)); do
    netns_exec "$i" perl -e "$client" "${NETNS_ADDR4[i]}" "$port" quit >/dev/null 2>&1
  done
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
  if [ "$ok" != 0 ]; then sed 's/^/netns: probe server: /' "$tmpd"/s* >&2; fi
  rm -rf "$tmpd"
  return $ok
}

# Kills every process left in namespace $1 (they were started by this run: the namespace
# is its own), then deletes the namespace.
netns_del() {
  local ns=$1 pids t
  [ -e "/run/netns/$ns" ] || return 0
  for sig in TERM KILL; do
    pids=$(ip netns pids "$ns" 2>/dev/null)
    [ -n "$pids" ] || break
    # shellcheck disable=SC2086
    kill -s "$sig" $pids 2>/dev/null
    for ((t = 0; t < 20; t++)); do
      [ -z "$(ip netns pids "$ns" 2>/dev/null)" ] && break
      sleep 0.1
    done
  done
  ip netns del "$ns" 2>/dev/null
}

netns_cleanup() {
  local i ns
  for ((i = 0; i < ${#NETNS_HOST[@]}; i++)); do netns_del "${NETNS_HOST[i]}"; done
  # Hosts of a larger earlier run with the same tag.
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^nx${NETNS_TAG}-h[0-9]+$"); do
    netns_del "$ns"
  done
  netns_del "$NETNS_SWITCH"  # its veth ends and the bridge go with it
  netns_del "nx${NETNS_TAG}-probe"
}

# Namespaces nx<pid>-* of runs whose process <pid> is gone (killed without cleanup).
netns_cleanup_stale() {
  local ns pid
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E '^nx[0-9]+-(sw|h[0-9]+|probe)$'); do
    pid=${ns#nx}
    pid=${pid%%-*}
    [ "$pid" = "$NETNS_TAG" ] && continue
    [ -d "/proc/$pid" ] && continue
    netns_del "$ns"
  done
}

# netns_guard LABEL TMP_PREFIX: makes the temporary directory $tmp and the list bg_pids of
# background processes, and on exit (also on INT/TERM, reported with LABEL) kills those
# processes, removes the namespaces of this run and $tmp.
netns_guard() {
  NETNS_GUARD_LABEL=$1
  tmp=$(mktemp -d "/tmp/$2.XXXXXX")
  bg_pids=()
  trap netns_guard_exit EXIT
  trap 'echo "$NETNS_GUARD_LABEL: interrupted" >&2; exit 130' INT
  trap 'echo "$NETNS_GUARD_LABEL: terminated" >&2; exit 143' TERM
}

# shellcheck disable=SC2317  # reached through the trap
netns_guard_exit() {
  local p
  for p in "${bg_pids[@]}"; do kill "$p" 2>/dev/null; done
  netns_cleanup
  for p in "${bg_pids[@]}"; do wait "$p" 2>/dev/null; done
  rm -rf "$tmp"
}
