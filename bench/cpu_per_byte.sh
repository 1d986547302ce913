#!/usr/bin/env bash
# cpu_per_byte.sh — what moving a byte costs in CPU: an all_reduce of SIZE (default 64 MiB)
# between processes of this host, on each of nexar's paths and on Gloo's TCP ring, as CPU
# nanoseconds (user + system, every process of the job) per byte sent.
#
#   bench/cpu_per_byte.sh [-r REPEATS] [-n "NPROCS"] [BUILD_DIR]   (default: build, 1, "2")
#
# Rows (each a separate job; the peers' programs come from BUILD_DIR/bin, as bench/peers
# builds them there):
#   gloo          gloo_bench --launch N --algo ring (TCP over loopback)
#   nexar-shm     nexar-run -n N nexar-bench: shared memory between the ranks
#   nexar-1452    the same over QUIC (NEXAR_SHM=0) with 1452-byte datagrams (an Ethernet
#                 MTU of 1500), NEXAR_UDP_PAYLOAD_BYTES=1452
#   nexar-8952    ... 8952-byte datagrams (MTU 9000)
#   nexar-auto    ... the route's size (loopback: 65508-byte datagrams)
#   nexar-tcp     NEXAR_SHM=0 NEXAR_LINK=tcp: the message lanes on the TCP link, TLS 1.3
#   nexar-tcp-none  ... the same in plaintext (NEXAR_TCP_CIPHER=none)
# nexar runs with NEXAR_SPIN_US=0: a spinning waiter burns CPU while it waits, which is time
# spent waiting, not work; Gloo's waiters sleep too. Open MPI is left out for that reason
# (its waiters always spin).
#
# Each job runs twice, with LO and HI timed iterations (default 2 and 12, one warm-up, no
# check); the difference of the two jobs' CPU time divided by the difference of the bytes
# they sent is the figure, so start-up, formation and teardown cancel. Bytes sent per
# iteration: 2(N-1) x SIZE over all ranks (a ring all_reduce; every row here runs one).
# Columns: CPU ns per byte sent (median over REPEATS, min-max), the same as "cycles per
# byte" at the clock rate the machine reports (MHz in /proc/cpuinfo; perf's cycle counter
# is not available on every VM), and busbw of the HI job (GB/s, median).
#
# Environment: SIZE (bytes, K/M suffixes; default 64M), LO, HI, ROWS (default all seven).
set -uo pipefail

# shellcheck source=tests/script_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../tests/script_lib.sh" build
script_bench_opts cpu_per_byte "2" "$@"
script_need cpu_per_byte nexar-bench nexar-run gloo_bench
script_tmp cpu_per_byte cpu_per_byte

size=${SIZE:-64M}
lo=${LO:-2}
hi=${HI:-12}
read -r -a rows <<<"${ROWS:-gloo nexar-shm nexar-1452 nexar-8952 nexar-auto nexar-tcp nexar-tcp-none}"
bytes=$(awk -v s="$size" 'BEGIN { n = s + 0; u = toupper(substr(s, length(s)))
  if (u == "K") n *= 1024; else if (u == "M") n *= 1048576; else if (u == "G") n *= 1073741824
  printf "%d", n }')
[ "$bytes" -gt 0 ] 2>/dev/null || { echo "cpu_per_byte: SIZE wants a size in bytes, not '$size'" >&2; exit 2; }
[ "$hi" -gt "$lo" ] 2>/dev/null || { echo "cpu_per_byte: HI ($hi) must exceed LO ($lo)" >&2; exit 2; }
mhz=$(awk -F: '/^cpu MHz/ { print $2 + 0; exit }' /proc/cpuinfo)
status=0

# job ROW NPROCS ITERS LOG: runs one job; prints the CPU seconds (user + system) of it and
# every process it waited for. bash's `times` reports a subshell's children.
job() {
  local row=$1 np=$2 n=$3 log=$4 args cmd envs=(NEXAR_SPIN_US=0)
  args=(all_reduce -b "$size" -e "$size" -n "$n" -w 1 -c 0)
  case "$row" in
    gloo) cmd=("$bin/gloo_bench" --launch "$np" --algo ring "${args[@]}"); envs=() ;;
    nexar-shm) cmd=("$bin/nexar-run" -n "$np" --no-prefix "$bin/nexar-bench" "${args[@]}") ;;
    nexar-1452|nexar-8952|nexar-auto)
      envs+=(NEXAR_SHM=0 "NEXAR_UDP_PAYLOAD_BYTES=$([ "$row" = nexar-auto ] && echo 0 || echo "${row#nexar-}")")
      cmd=("$bin/nexar-run" -n "$np" --no-prefix "$bin/nexar-bench" "${args[@]}") ;;
    nexar-tcp|nexar-tcp-none)
      envs+=(NEXAR_SHM=0 NEXAR_LINK=tcp "NEXAR_TCP_CIPHER=$([ "$row" = nexar-tcp ] && echo tls || echo none)")
      cmd=("$bin/nexar-run" -n "$np" --no-prefix "$bin/nexar-bench" "${args[@]}") ;;
    *) echo "cpu_per_byte: unknown row '$row'" >&2; exit 2 ;;
  esac
  echo "\$ ${envs[*]} ${cmd[*]}" >"$log"
  ( env "${envs[@]}" timeout -k 10 600 "${cmd[@]}" >>"$log" 2>&1 </dev/null || echo "EXIT $?" >>"$log"
    times ) | tail -n 1 | awk '{ split($1, u, /[ms]/); split($2, s, /[ms]/); printf "%.3f", u[1] * 60 + u[2] + s[1] * 60 + s[2] }'
}

# median of the arguments (numbers); "min-max" with RANGE=1
median() { printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 } END { print (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2) }'; }
range() { printf '%s\n' "$@" | sort -g | awk 'NR == 1 { lo = $1 } { hi = $1 } END { printf "%s-%s", lo, hi }'; }

echo "# cpu_per_byte: all_reduce $size ($bytes B), jobs of $lo and $hi iterations, $repeats repeat(s); $(nproc) CPUs at ${mhz:-?} MHz"
printf '%-6s %-15s %12s %15s %12s %10s\n' nprocs path ns_per_byte ns_range cycles/byte busbw_GB/s
for np in $sizes; do
  sent=$(awk -v n="$np" -v b="$bytes" -v k="$((hi - lo))" 'BEGIN { printf "%.0f", 2 * (n - 1) * b * k }')
  for row in "${rows[@]}"; do
    per=()
    bw=()
    for ((r = 1; r <= repeats; r++)); do
      a=$(job "$row" "$np" "$lo" "$tmp/$row-$np-$r-lo.log")
      b=$(job "$row" "$np" "$hi" "$tmp/$row-$np-$r-hi.log")
      if grep -q '^EXIT' "$tmp/$row-$np-$r-lo.log" "$tmp/$row-$np-$r-hi.log"; then
        echo "cpu_per_byte: $row with $np processes failed; its log:" >&2
        tail -n 20 "$tmp/$row-$np-$r-hi.log" "$tmp/$row-$np-$r-lo.log" >&2
        status=1
        continue
      fi
      per+=("$(awk -v a="$a" -v b="$b" -v s="$sent" 'BEGIN { printf "%.3f", (b - a) * 1e9 / s }')")
      bw+=("$(awk '$1 ~ /^[0-9]+$/ && NF >= 9 { v = $8 } END { print v + 0 }' "$tmp/$row-$np-$r-hi.log")")
    done
    [ ${#per[@]} -gt 0 ] || continue
    m=$(median "${per[@]}")
    printf '%-6s %-15s %12.3f %15s %12s %10.3f\n' "$np" "$row" "$m" "$(range "${per[@]}")" \
      "$(awk -v m="$m" -v f="${mhz:-0}" 'BEGIN { if (f > 0) printf "%.2f", m * f / 1000; else print "n/a" }')" \
      "$(median "${bw[@]}")"
  done
done
exit $status
