#!/usr/bin/env bash
# netns_loss.sh — nexar and Gloo all_reduce across HOSTS "hosts" whose links drop packets.
#
#   bench/netns_loss.sh [-r REPEATS] [BUILD_DIR]        (default: build, 1 repeat)
#
# Builds (tests/netns_lib.sh) a switch namespace with a bridge and HOSTS + 1 host namespaces, every
# link shaped with tbf at RATE both ways. For each loss rate P of LOSSES, every rank's host
# drops that fraction of the packets reaching it from the network, whatever they carry
# (iptables -A INPUT ! -i lo -m statistic --mode random --probability P -j DROP), and then, in turn:
#   nexar  host 0 runs nexar-seed, hosts 1..HOSTS one rank each of nexar-bench all_reduce;
#   gloo   hosts 1..HOSTS one rank each of gloo_bench all_reduce (ring, TCP, FileStore
#          rendezvous in a directory all namespaces see), when build/bin/gloo_bench exists.
# Both run LAT_ARGS (8 B: control-traffic latency), then BENCH_ARGS. Prints a table per loss
# rate: size, and for nexar and Gloo the time (us, median over iterations of the slowest
# rank) and busbw (GB/s), then nexar / Gloo and
# nexar / link. With -r REPEATS every cell is the median of the repeats (each repeat runs
# every loss rate for both libraries in turn), and the spread (min-max) of nexar / Gloo is
# shown. Exit status 1 if a run failed or reported a wrong result ('!').
#
# Environment: HOSTS (ranks, one per host, default 4; 2 gives each rank a core of a 2-core
# machine), LOSSES (default "0 0.001 0.01 0.05"), RATE (default 1gbit), MTU (default 1500),
# BENCH_ARGS (default "-b 1M -e 64M -f 8 -n 5 -w 1 -c 1"), LAT_ARGS (default
# "-b 8 -e 8 -n 200 -w 20 -c 1"; empty for none), NEXAR_ENV (extra VAR=VALUE words for every
# nexar rank), GLOO (1 or 0), TIMEOUT (seconds per run, default 600), PORT (seed
# port, default 29400), OUT (directory for the raw logs, default a new /tmp directory, kept),
# RELAY_MS (default empty: none): a delay in ms (decimals allowed) that tbf cannot give and
# netem is not there for: every rank's host runs nexar-relay --delay-ms RELAY_MS on its
# address at port RELAY_PORT (default 29600) in front of its rank, which binds RELAY_PORT + 1
# and advertises the relay (NEXAR_BIND_ADDR, NEXAR_ADVERTISE_ADDR). Peers dial the relay, and
# both directions are held, so the round trip of every pair is 2 x RELAY_MS. The relays cost
# CPU next to the ranks (each datagram is copied and sent once more). Gloo's TCP does not pass
# the UDP relay: its column is then without the delay. The relays' logs (what each relayed
# and dropped) are LABEL.relayR.log in OUT.
#
# Needs root and network namespaces; exits 77 when they are missing. Run it on an otherwise
# idle machine.
set -uo pipefail

# shellcheck source=tests/script_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../tests/script_lib.sh" build
script_bench_opts netns_loss "" "$@"

rate=${RATE:-1gbit}
losses=${LOSSES:-"0 0.001 0.01 0.05"}
want_gloo=${GLOO:-1}
read -r -a bw_args <<<"${BENCH_ARGS:--b 1M -e 64M -f 8 -n 5 -w 1 -c 1}"
read -r -a lat_args <<<"${LAT_ARGS-"-b 8 -e 8 -n 200 -w 20 -c 1"}"
passes=(bw)
[ ${#lat_args[@]} -gt 0 ] && passes=(lat bw)
read -r -a nexar_env <<<"${NEXAR_ENV:-}"
relay_ms=${RELAY_MS:-}
relay_port=${RELAY_PORT:-29600}
if [ -n "$relay_ms" ] && ! [[ "$relay_ms" =~ ^[0-9]+([.][0-9]+)?$ ]]; then
  echo "netns_loss: RELAY_MS wants a delay in ms (e.g. 10 or 2.5), not '$relay_ms'" >&2
  exit 2
fi
if ! [[ "$relay_port" =~ ^[0-9]+$ ]] || [ "$relay_port" -lt 1 ] || [ "$relay_port" -gt 65534 ]; then
  echo "netns_loss: RELAY_PORT wants a port of 1..65534, not '$relay_port'" >&2
  exit 2
fi
limit=${TIMEOUT:-600}
port=${PORT:-29400}
workers=${HOSTS:-4}
if ! [[ "$workers" =~ ^[0-9]+$ ]] || [ "$workers" -lt 2 ] || [ "$workers" -gt 16 ]; then
  echo "netns_loss: HOSTS wants a number of ranks of 2..16, not '$workers'" >&2
  exit 2
fi
export NETNS_MTU=${MTU:-1500}
export NETNS_IPV6=0

# shellcheck source=tests/netns_lib.sh
source "$repo/tests/netns_lib.sh"
# shellcheck source=bench/netns_bench_lib.sh
source "$repo/bench/netns_bench_lib.sh"

command -v iptables >/dev/null 2>&1 || { echo "netns_loss: skipped: no iptables"; exit 77; }
gloo_bin=""
[ "$want_gloo" = 1 ] && [ -x "$bin/gloo_bench" ] && gloo_bin="$bin/gloo_bench"
[ "$want_gloo" = 1 ] && [ -z "$gloo_bin" ] && echo "# Gloo baseline skipped: $bin/gloo_bench missing" >&2

[ -n "$relay_ms" ] && script_need netns_loss nexar-relay
bench_hosts netns_loss
relay_note=""
if [ -n "$relay_ms" ]; then
  relay_note=" nexar-relay in front of every rank, $relay_ms ms each way (round trip"
  relay_note+=" $(awk -v d="$relay_ms" 'BEGIN { print 2 * d }') ms);"
fi
echo "# netns_loss: $workers hosts (${NETNS_ADDR4[*]:1}) + seed host ${NETNS_ADDR4[0]}, every link tbf $rate" \
  "both ways (link $link_gbs GB/s), MTU $NETNS_MTU, $(nproc) CPUs, losses: $losses;$relay_note repeats $repeats;" \
  "all_reduce ${lat_args[*]} and ${bw_args[*]}; logs in $out"
[ -n "$relay_ms" ] && [ -n "$gloo_bin" ] &&
  echo "# note: Gloo's TCP does not pass the UDP relay: the Gloo columns are without the $relay_ms ms delay"

# set_loss P: every rank's host drops the fraction P of what arrives (none for 0) from the
# network: not on lo, where a relay's datagrams reach its own rank (once lost on the way in
# is enough).
set_loss() {
  local i
  for ((i = 1; i <= workers; i++)); do
    netns_exec "$i" iptables -F INPUT
    [ "$1" = 0 ] && continue
    netns_exec "$i" iptables -A INPUT ! -i lo -m statistic --mode random --probability "$1" -j DROP || return 1
  done
}

status=0
declare -A cell=()  # "lib,loss,size,time|bw|ratio" -> values, one per repeat, space-separated
sizes=()
for ((rep = 1; rep <= repeats; rep++)); do
  for loss in $losses; do
    set_loss "$loss" || { echo "netns_loss: cannot set loss $loss"; exit 1; }
    libs=(nexar)
    [ -n "$gloo_bin" ] && libs+=(gloo)
    for pass in "${passes[@]}"; do
      if [ "$pass" = lat ]; then bench_args=("${lat_args[@]}"); else bench_args=("${bw_args[@]}"); fi
      run_nexar "nexar-$loss-$rep-$pass" "${nexar_env[@]}" || status=1
      [ -n "$gloo_bin" ] && { run_gloo "gloo-$loss-$rep-$pass" || status=1; }
      for lib in "${libs[@]}"; do
        while read -r size b w t; do
          [ -n "$w" ] && [ "$w" != 0 ] && [ "$w" != N/A ] && { b="$b!"; status=1; }
          cell["$lib,$loss,$size,bw"]+="$b "
          cell["$lib,$loss,$size,time"]+="$t "
          case " ${sizes[*]} " in *" $size "*) ;; *) sizes+=("$size") ;; esac
        done < <(rows "$out/$lib-$loss-$rep-$pass.log")
      done
    done
    for size in "${sizes[@]}"; do
      n=$(echo "${cell["nexar,$loss,$size,bw"]:-}" | awk '{ print $NF }')
      g=$(echo "${cell["gloo,$loss,$size,bw"]:-}" | awk '{ print $NF }')
      [ -n "$n" ] && [ -n "$g" ] && cell["ratio,$loss,$size"]+="$(awk -v n="${n%!}" -v g="${g%!}" \
        'BEGIN { if (g > 0) printf "%.3f", n / g; else print "-" }') "
    done
  done
  set_loss 0
done

# med KEY: the median of a cell's values ('!' kept when any had it); spread KEY: min-max.
med() {
  local v=${cell["$1"]:-} m
  [ -z "$v" ] && { echo -; return; }
  m=$(echo "$v" | tr ' ' '\n' | sed 's/!$//' | grep -v '^-*$' | script_median)
  case "$v" in *'!'*) m="$m!" ;; esac
  echo "$m"
}
spread() {
  local v=${cell["$1"]:-}
  [ -z "$v" ] && { echo -; return; }
  echo "$v" | tr ' ' '\n' | grep -v '^$' | sort -g | awk 'NR == 1 { lo = $1 } { hi = $1 } END { print lo "-" hi }'
}

for loss in $losses; do
  echo
  echo "## all_reduce, $workers hosts, links $rate ($link_gbs GB/s), loss $loss on every rank's input" \
    "(medians of $repeats)"
  printf "%12s  %12s  %10s  %12s  %10s  %10s  %13s  %11s\n" "size(B)" "nexar us" "nexar GB/s" "gloo us" \
    "gloo GB/s" "nexar/gloo" "(spread)" "nexar/link"
  for size in "${sizes[@]}"; do
    nb=$(med "nexar,$loss,$size,bw")
    printf "%12s  %12s  %10s  %12s  %10s  %10s  %13s  %11s\n" "$size" "$(med "nexar,$loss,$size,time")" "$nb" \
      "$(med "gloo,$loss,$size,time")" "$(med "gloo,$loss,$size,bw")" "$(med "ratio,$loss,$size")" \
      "$(spread "ratio,$loss,$size")" \
      "$(awk -v b="${nb%!}" -v l="$link_gbs" 'BEGIN { if (b == "-") print "-"; else printf "%.3f", b / l }')"
  done
done
echo "# time: median over iterations of the slowest rank (us); busbw = algbw x 2(n-1)/n;" \
  "'!' marks #wrong > 0. Raw logs: $out"
[ -n "$relay_ms" ] && [ -n "$gloo_bin" ] &&
  echo "# nexar through relays of $relay_ms ms each way; Gloo without them (no delay)"
exit $status
