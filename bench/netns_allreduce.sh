#!/usr/bin/env bash
# netns_allreduce.sh — nexar all_reduce across "hosts" joined by shaped links (4 by default).
#
#   bench/netns_allreduce.sh [BUILD_DIR]        (default: build)
#
# Builds (tests/netns_lib.sh) a switch namespace with a bridge and 5 host namespaces: host 0
# runs nexar-seed, hosts 1..4 one rank each of
#     nexar-bench all_reduce -b 1M -e 64M -f 2 -n 5 -w 1 -c 1
# (NEXAR_RANK = host - 1, NEXAR_WORLD_SIZE = 4, the seed's variables). Every link is shaped in
# both directions with tbf at RATE (bucket max(128 KiB, 1 ms at RATE), latency 10ms) and
# every veth receive queue has rps_cpus set. It runs once per entry of PAYLOADS
# ("default" leaves NEXAR_UDP_PAYLOAD_BYTES unset: datagrams sized by the path MTU; a number
# sets it), and, with MPI=1 (default) when Open MPI and build/bin/mpi_bench are there, runs
# Open MPI's all_reduce (TCP BTL) over the same namespaces and links as a TCP baseline.
# Prints rank 0's nccl-tests table of each run and a summary table: size, busbw (GB/s),
# link rate (GB/s), busbw / link rate.
#
# The Open MPI run: mpirun in host 0 starts its daemons in hosts 1..4 through an rsh agent
# that enters the namespace of the host's address; MPI_ARGS (default: yield when idle, since
# 4 spinning ranks on 2 cores starve each other, and the ring all_reduce, which Open MPI's
# default rules do not pick here) are added to its command line.
#
# With PER_HOST=k, each of HOSTS hosts runs k ranks (nexar's ranks of one host then talk
# through shared memory, and all_reduce picks its hierarchical algorithm); ALGOS lists the
# nexar algorithms to run (default "automatic"; e.g. "automatic ring" to compare the
# hierarchy with the flat ring). With GLOO=1 (default) when gloo_bench is built, Gloo's ring
# runs over the same hosts too. LINKS lists runs on the TCP link (NEXAR_LINK=tcp) after
# the QUIC ones: "tcp" (TLS) and "tcp-none" (NEXAR_TCP_CIPHER=none), default both, empty for
# none; so QUIC, TCP+TLS, TCP plaintext and Gloo land in one table.
#
# Environment: COLL (the nexar-bench collective, default all_reduce; the Gloo and Open MPI
# baselines always run all_reduce), RATE (default 1gbit), MTU (default 9000, so that 8952-byte payloads fit),
# HOSTS (default 4), PER_HOST (default 1), ALGOS (default automatic), GLOO (1 or 0),
# PAYLOADS (default "default 8952"; empty for none), LINKS (default "tcp tcp-none"), MPI (1 or 0), MPI_ARGS, BENCH_ARGS (default
# "-b 1M -e 64M -f 2 -n 5 -w 1 -c 1"), TIMEOUT (seconds per run, default 600), PORT (seed
# port, default 29400), NETNS_SUBNET4 (default 10.77.0), OUT (directory for the raw logs,
# default a new /tmp directory, kept).
#
# Needs root and network namespaces; exits 77 when they are missing.
set -uo pipefail

# shellcheck source=tests/script_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../tests/script_lib.sh" "${1:-build}"

rate=${RATE:-1gbit}
coll=${COLL:-all_reduce}
payloads=${PAYLOADS-default 8952}
links=${LINKS-tcp tcp-none}
want_mpi=${MPI:-1}
read -r -a mpi_args <<<"${MPI_ARGS-"--mca mpi_yield_when_idle 1 --mca coll_tuned_use_dynamic_rules 1 --mca coll_tuned_allreduce_algorithm 4"}"
read -r -a bench_args <<<"${BENCH_ARGS:--b 1M -e 64M -f 2 -n 5 -w 1 -c 1}"
limit=${TIMEOUT:-600}
port=${PORT:-29400}
hosts=${HOSTS:-4}
per_host=${PER_HOST:-1}
workers=$((hosts * per_host))
read -r -a algos <<<"${ALGOS:-automatic}"
want_gloo=${GLOO:-1}
export NETNS_MTU=${MTU:-9000}
export NETNS_IPV6=0

# shellcheck source=tests/netns_lib.sh
source "$repo/tests/netns_lib.sh"
# shellcheck source=bench/netns_bench_lib.sh
source "$repo/bench/netns_bench_lib.sh"

bench_hosts netns_allreduce
echo "# netns_allreduce: $hosts hosts (${NETNS_ADDR4[*]:1}) x $per_host rank(s) + seed host ${NETNS_ADDR4[0]}," \
  "every link tbf $rate both ways (link $link_gbs GB/s), MTU $NETNS_MTU, $(nproc) CPUs; logs in $out"

# run_mpi LABEL: Open MPI's all_reduce over the same hosts. mpirun runs in host 0 and starts
# its daemons in hosts 1..4 through an rsh agent that enters the namespace of the address.
run_mpi() {
  local label=$1 agent="$tmp/rsh-agent" hostfile="$tmp/hosts" i
  # shellcheck disable=SC2016  # the agent's own variables
  {
    echo '#!/bin/sh'
    echo '# rsh agent for mpirun: [options] HOST COMMAND... -> COMMAND inside HOST'"'"'s namespace'
    echo 'while [ $# -gt 0 ]; do case "$1" in -*) shift ;; *) break ;; esac; done'
    echo 'host=$1; shift'
    echo 'case "$host" in'
    for ((i = 1; i <= hosts; i++)); do echo "  ${NETNS_ADDR4[i]}) ns=${NETNS_HOST[i]} ;;"; done
    echo '  *) echo "rsh-agent: unknown host $host" >&2; exit 1 ;;'
    echo 'esac'
    echo 'exec ip netns exec "$ns" /bin/sh -c "$*"'
  } >"$agent"
  chmod +x "$agent"
  : >"$hostfile"
  for ((i = 1; i <= hosts; i++)); do echo "${NETNS_ADDR4[i]} slots=$per_host" >>"$hostfile"; done
  # shellcheck disable=SC2054  # the commas are part of MCA values
  local cmd=(mpirun --allow-run-as-root --bind-to none -np "$workers" --hostfile "$hostfile"
    --mca plm_rsh_agent "$agent" --mca plm_rsh_no_tree_spawn 1
    --mca pml ob1 --mca btl tcp,self --mca btl_tcp_if_include "$NETNS_DEV"
    --mca oob_tcp_if_include "$NETNS_DEV" --mca orte_keep_fqdn_hostnames 1 "${mpi_args[@]}"
    "$mpi_bin" all_reduce "${bench_args[@]}")
  echo "\$ ${cmd[*]}" >"$out/$label.log"
  ip netns exec "${NETNS_HOST[0]}" timeout -k 5 "$limit" "${cmd[@]}" >>"$out/$label.log" 2>&1 </dev/null &
  local p=$!
  bg_pids+=("$p")
  wait "$p"
}

labels=()
status=0
base_args=("${bench_args[@]}")
# nexar_rows NAME [VAR=VALUE...]: one nexar run per algorithm of ALGOS, labelled NAME (and
# -ALGO when there are several), with the variables given.
nexar_rows() {
  local name=$1 a label suffix
  shift
  for a in "${algos[@]}"; do
    bench_args=("${base_args[@]}" -a "$a")
    suffix=""
    [ "${#algos[@]}" -gt 1 ] && suffix="-$a"
    label="$name$suffix"
    run_nexar "$label" "$@" || status=1
    labels+=("$label")
    echo
    echo "## $label (rank 0's output)"
    sed -n '2,$p' "$out/$label.log"
  done
}
for p in $payloads; do
  if [ "$p" = default ]; then
    nexar_rows nexar-default
  else
    nexar_rows "nexar-udp$p" NEXAR_UDP_PAYLOAD_BYTES="$p"
  fi
done
for l in $links; do
  case "$l" in
    tcp) nexar_rows nexar-tcp NEXAR_LINK=tcp NEXAR_TCP_CIPHER=tls ;;
    tcp-none) nexar_rows nexar-tcp-none NEXAR_LINK=tcp NEXAR_TCP_CIPHER=none ;;
    *) echo "netns_allreduce: LINKS takes tcp and tcp-none, not '$l'" >&2; exit 2 ;;
  esac
done
bench_args=("${base_args[@]}")

gloo_bin=""
for d in "$bin" "$repo/build/bin" "$repo/build-peers/bin"; do
  [ -x "$d/gloo_bench" ] && { gloo_bin="$d/gloo_bench"; break; }
done
if [ "$want_gloo" = 1 ] && [ -n "$gloo_bin" ]; then
  label="gloo"
  if run_gloo "$label"; then
    labels+=("$label")
    echo
    echo "## $label (Gloo ring over TCP; rank 0's output)"
    sed -n '2,$p' "$out/$label.log"
  else
    echo "# Gloo baseline failed (see $out/$label.log); left out" >&2
  fi
elif [ "$want_gloo" = 1 ]; then
  echo "# Gloo baseline skipped: gloo_bench missing" >&2
fi

mpi_bin=""
for d in "$bin" "$repo/build/bin" "$repo/build-peers/bin"; do
  [ -x "$d/mpi_bench" ] && { mpi_bin="$d/mpi_bench"; break; }
done
if [ "$want_mpi" = 1 ] && [ -n "$mpi_bin" ] && command -v mpirun >/dev/null 2>&1; then
  label="ompi-tcp"
  if run_mpi "$label"; then
    labels+=("$label")
    echo
    echo "## $label (Open MPI $(mpirun --version 2>/dev/null | head -n 1 | awk '{print $NF}'), TCP BTL, ${mpi_args[*]})"
    sed -n '2,$p' "$out/$label.log"
  else
    echo "# Open MPI baseline failed (see $out/$label.log); left out" >&2
  fi
elif [ "$want_mpi" = 1 ]; then
  echo "# Open MPI baseline skipped: mpirun or mpi_bench missing" >&2
fi

# Summary: one busbw column and one busbw/link column per run.
echo
echo "## all_reduce busbw, $workers ranks on $hosts hosts, links $rate ($link_gbs GB/s) each way"
declare -A bw=() wrong=()
sizes=()
for label in "${labels[@]}"; do
  while read -r size b w _; do
    bw["$label,$size"]=$b
    wrong["$label,$size"]=$w
    case " ${sizes[*]} " in *" $size "*) ;; *) sizes+=("$size") ;; esac
  done < <(rows "$out/$label.log")
done
hdr=$(printf "%12s  %9s" "size(B)" "link GB/s")
for label in "${labels[@]}"; do hdr+=$(printf "  %15s  %6s" "$label GB/s" "/link"); done
echo "$hdr"
for size in "${sizes[@]}"; do
  line=$(printf "%12s  %9s" "$size" "$link_gbs")
  for label in "${labels[@]}"; do
    b=${bw["$label,$size"]:--}
    w=${wrong["$label,$size"]:-}
    ratio=$(awk -v b="$b" -v l="$link_gbs" 'BEGIN { if (b == "-" || b == "") print "-"; else printf "%.3f", b / l }')
    [ "$b" = - ] || b=$(awk -v b="$b" 'BEGIN { printf "%.3f", b }')
    if [ -n "$w" ] && [ "$w" != 0 ] && [ "$w" != N/A ]; then b="$b!"; status=1; fi
    line+=$(printf "  %15s  %6s" "$b" "$ratio")
  done
  echo "$line"
done
echo "# busbw = algbw x 2(n-1)/n (nccl-tests); '!' marks #wrong > 0. Raw logs: $out"
exit $status
