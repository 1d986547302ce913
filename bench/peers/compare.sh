#!/usr/bin/env bash
# Runs one collective on Open MPI (TCP), Open MPI (shared memory), Gloo (TCP) and — when
# build/bin/nexar-bench supports the collective — nexar, with the same sizes and iteration
# counts for everyone, and prints busbw side by side plus the 8 B all_reduce latency.
# nexar runs twice: "nexar" is one rank per process (nexar-run -n N nexar-bench, like the
# peers), "nexar-thr" is N ranks as threads of one process (nexar-bench --ranks N).
# For all_reduce it also runs the point-to-point benchmark (nexar-bench p2p: QUIC vs a TCP
# socket pair between two processes) at the sizes of the sweep from 16 MiB up, and prints
# its nexar/tcp ratio next to the all_reduce ratio: the collective layer adds no loss of
# its own when nexar/best-tcp is at least that.
#
#   bench/peers/compare.sh [-np "2 4"] [-b 8] [-e 64M] [-f 2] [-n 20] [-w 5] [-c 1]
#                          [-d float] [-o sum] [--coll all_reduce] [--gloo-algo ring]
#                          [--bin DIR] [--nexar PATH] [--out DIR] [--timeout S]
#
# The peer programs are looked for in --bin, build/bin, build-peers/bin; when none has them
# they are built into build-peers/ (cmake -S bench/peers -B build-peers).
# Every raw nccl-tests-style log is kept under --out (default: a new /tmp directory).
set -uo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)

nps="2 4"
minb=8
maxb=64M
factor=2
iters=20
warmup=5
check=1
dtype=float
op=sum
coll=all_reduce
gloo_algo=ring
bindir=""
nexar="$repo/build/bin/nexar-bench"
nexar_run=""
outdir=""
run_timeout=900

usage() { sed -n '2,17p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; }

while [ $# -gt 0 ]; do
  case "$1" in
    -np|--np) nps=$2; shift 2 ;;
    -b|--minbytes) minb=$2; shift 2 ;;
    -e|--maxbytes) maxb=$2; shift 2 ;;
    -f|--stepfactor) factor=$2; shift 2 ;;
    -n|--iters) iters=$2; shift 2 ;;
    -w|--warmup_iters) warmup=$2; shift 2 ;;
    -c|--check) check=$2; shift 2 ;;
    -d|--datatype) dtype=$2; shift 2 ;;
    -o|--op) op=$2; shift 2 ;;
    --coll) coll=$2; shift 2 ;;
    --gloo-algo) gloo_algo=$2; shift 2 ;;
    --bin) bindir=$2; shift 2 ;;
    --nexar) nexar=$2; shift 2 ;;
    --out) outdir=$2; shift 2 ;;
    --timeout) run_timeout=$2; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "compare.sh: unknown argument $1" >&2; usage >&2; exit 2 ;;
  esac
done

# ---- find (or build) the peer programs -------------------------------------------------
find_bins() {
  for d in "$bindir" "$repo/build/bin" "$repo/build-peers/bin"; do
    [ -n "$d" ] || continue
    if [ -x "$d/mpi_bench" ] || [ -x "$d/gloo_bench" ]; then
      bindir=$d
      return 0
    fi
  done
  return 1
}
if ! find_bins; then
  echo "compare.sh: building the peer benchmarks into $repo/build-peers" >&2
  if ! { cmake -S "$here" -B "$repo/build-peers" -DCMAKE_BUILD_TYPE=Release >/dev/null &&
          cmake --build "$repo/build-peers" >/dev/null; }; then
    echo "compare.sh: build failed" >&2
    exit 2
  fi
  find_bins || { echo "compare.sh: neither mpi_bench nor gloo_bench could be built" >&2; exit 2; }
fi

if [ -z "$outdir" ]; then outdir=$(mktemp -d /tmp/nexar-compare.XXXXXX); fi
mkdir -p "$outdir"

common=(-b "$minb" -e "$maxb" -f "$factor" -n "$iters" -w "$warmup" -c "$check" -d "$dtype" -o "$op")
mpirun_base=(mpirun --allow-run-as-root --oversubscribe)
# Binding as nexar-run's default: one rank per CPU while there are enough CPUs, else none.
mpi_bind() { if [ "$1" -le "$(nproc)" ]; then echo core; else echo none; fi; }
# pml ob1: Debian's Open MPI also has UCX, whose pml would ignore the btl choice below.
# shellcheck disable=SC2054  # the commas are part of MCA values
mpi_tcp=(--mca pml ob1 --mca btl tcp,self --mca btl_tcp_if_include lo --mca oob_tcp_if_include lo)
# shellcheck disable=SC2054
mpi_shm=(--mca pml ob1 --mca btl vader,self --mca oob_tcp_if_include lo)

# nexar takes part only when its bench knows the collective.  `nexar-bench X --help` also
# exits 0 for an unknown X (CLI11 prints the top-level help), so the help text must name X.
have_nexar=0
if [ -x "$nexar" ]; then
  if help=$(timeout 10 "$nexar" "$coll" --help 2>&1) && grep -q -- "$coll" <<<"$help"; then
    have_nexar=1
  fi
fi

impls=()
[ -x "$bindir/mpi_bench" ] && impls+=(ompi-tcp ompi-shm)
[ -x "$bindir/gloo_bench" ] && impls+=(gloo)
if [ "$have_nexar" = 1 ]; then
  nexar_run="$(dirname "$nexar")/nexar-run"
  [ -x "$nexar_run" ] && impls+=(nexar)
  impls+=(nexar-thr)
fi

# run IMPL NP COLL LOG ARGS... -> nccl-tests-style output in LOG; returns the exit status.
run_one() {
  local impl=$1 np=$2 c=$3 log=$4
  shift 4
  local cmd
  case "$impl" in
    ompi-tcp) cmd=("${mpirun_base[@]}" --bind-to "$(mpi_bind "$np")" -np "$np" "${mpi_tcp[@]}" "$bindir/mpi_bench" "$c" "$@") ;;
    ompi-shm) cmd=("${mpirun_base[@]}" --bind-to "$(mpi_bind "$np")" -np "$np" "${mpi_shm[@]}" "$bindir/mpi_bench" "$c" "$@") ;;
    gloo)
      local algo=()
      [ "$c" = all_reduce ] && algo=(--algo "$gloo_algo")
      cmd=("$bindir/gloo_bench" --launch "$np" "${algo[@]}" "$c" "$@") ;;
    nexar) cmd=("$nexar_run" -n "$np" --no-prefix "$nexar" "$c" "$@") ;;
    nexar-thr) cmd=("$nexar" "$c" --ranks "$np" "$@") ;;
  esac
  echo "\$ ${cmd[*]}" >"$log"
  timeout -k 10 "$run_timeout" "${cmd[@]}" >>"$log" 2>&1 </dev/null
}

# Data rows of a log as "size time busbw wrong".
rows() { awk '$1 ~ /^[0-9]+$/ && NF >= 9 { print $1, $6, $8, $9 }' "$1" 2>/dev/null; }

status=0

# Point-to-point QUIC/TCP ratio, same run, at the sweep's sizes >= 16 MiB.
declare -A p2p=()
if [ "$have_nexar" = 1 ] && [ "$coll" = all_reduce ]; then
  p2p_sizes=$(awk -v b="$minb" -v e="$maxb" -v f="$factor" 'function bytes(s,  n, u) {
      n = s + 0; u = toupper(substr(s, length(s)))
      if (u == "K") n *= 1024; else if (u == "M") n *= 1048576; else if (u == "G") n *= 1073741824
      return n }
    BEGIN { lo = bytes(b); hi = bytes(e); first = ""; last = ""
      for (s = lo; s <= hi; s *= f) if (s >= 16777216) { if (first == "") first = s; last = s }
      if (first != "") print first, last }')
  if [ -n "$p2p_sizes" ]; then
    read -r p2p_lo p2p_hi <<<"$p2p_sizes"
    log="$outdir/p2p.log"
    echo "\$ $nexar p2p -b $p2p_lo -e $p2p_hi -f $factor" >"$log"
    timeout -k 10 "$run_timeout" "$nexar" p2p -b "$p2p_lo" -e "$p2p_hi" -f "$factor" >>"$log" 2>&1 </dev/null ||
      echo "# nexar-bench p2p failed (see $log)" >&2
    while read -r size ratio; do p2p["$size"]=$ratio; done < <(awk '$1 ~ /^[0-9]+$/ && NF == 5 { print $1, $5 }' "$log")
  fi
fi

echo "# compare.sh: $coll, $dtype $op, sizes $minb..$maxb x$factor, iters $iters, warmup $warmup, check $check"
echo "# implementations: ${impls[*]}   (gloo all_reduce algorithm: $gloo_algo; logs in $outdir)"
[ "$have_nexar" = 1 ] || echo "# nexar: $nexar missing or without '$coll'; skipped"

for np in $nps; do
  declare -A busbw=() usec=() wrong=() lat=()
  sizes=()
  for impl in "${impls[@]}"; do
    log="$outdir/${coll}.${impl}.np${np}.log"
    run_one "$impl" "$np" "$coll" "$log" "${common[@]}"
    rc=$?
    if [ "$rc" != 0 ]; then
      echo "# $impl np=$np exited with $rc (see $log):" >&2
      tail -n 5 "$log" | sed 's/^/#   /' >&2
      [ "$rc" = 1 ] || status=1
    fi
    while read -r size time bw w; do
      [ -n "$size" ] || continue
      busbw["$impl,$size"]=$bw
      usec["$impl,$size"]=$time
      wrong["$impl,$size"]=$w
      case " ${sizes[*]} " in *" $size "*) ;; *) sizes+=("$size") ;; esac
    done < <(rows "$log")
  done

  # 8 B all_reduce latency: a run of its own with at least 1000 iterations after 100
  # warm-up ones (cheap at 8 B), so that start-up noise of a few milliseconds (a launcher
  # still winding down its seed, caches, thread placement) does not decide the median.
  for impl in "${impls[@]}"; do
    log="$outdir/all_reduce8.${impl}.np${np}.log"
    run_one "$impl" "$np" all_reduce "$log" -b 8 -e 8 -n "$((iters > 1000 ? iters : 1000))" \
      -w "$((warmup > 100 ? warmup : 100))" -c "$check" -d float -o sum
    rc=$?
    [ "$rc" = 0 ] || [ "$rc" = 1 ] || echo "# $impl np=$np 8 B all_reduce exited with $rc (see $log)" >&2
    read -r _ t _ w < <(rows "$log") || true
    lat["$impl"]=${t:--}
    [ -n "${w:-}" ] && [ "$w" != 0 ] && [ "$w" != N/A ] && lat["$impl"]="${t}!"
    unset t w
  done

  echo
  echo "## $coll, $np ranks: busbw (GB/s)"
  hdr=$(printf "%12s" "size(B)")
  for impl in "${impls[@]}"; do hdr+=$(printf "  %10s" "$impl"); done
  [ "$have_nexar" = 1 ] && hdr+=$(printf "  %16s" "nexar/best-tcp")
  [ "${#p2p[@]}" -gt 0 ] && hdr+=$(printf "  %14s" "p2p nexar/tcp")
  echo "$hdr"
  for size in "${sizes[@]}"; do
    line=$(printf "%12s" "$size")
    for impl in "${impls[@]}"; do
      v=${busbw["$impl,$size"]:--}
      w=${wrong["$impl,$size"]:-}
      if [ -n "$w" ] && [ "$w" != 0 ] && [ "$w" != N/A ]; then v="$v!"; status=1; fi
      line+=$(printf "  %10s" "$v")
    done
    if [ "$have_nexar" = 1 ]; then
      # Same size and collective, so the busbw ratio is the inverse ratio of the times
      # (exact, unlike the 2-decimal busbw columns).
      ratio=$(awk -v n="${usec["nexar,$size"]:-}" -v a="${usec["ompi-tcp,$size"]:-}" \
                  -v g="${usec["gloo,$size"]:-}" 'BEGIN {
                best = -1
                if (a != "" && a + 0 > 0) best = a + 0
                if (g != "" && g + 0 > 0 && (best < 0 || g + 0 < best)) best = g + 0
                if (n == "" || n + 0 <= 0 || best < 0) print "-"; else printf "%.2f", best / n }')
      line+=$(printf "  %16s" "$ratio")
      [ "${#p2p[@]}" -gt 0 ] && line+=$(printf "  %14s" "${p2p[$size]:-}")
    fi
    echo "$line"
  done
  line=$(printf "%12s" "8B lat (us)")
  for impl in "${impls[@]}"; do line+=$(printf "  %10s" "${lat[$impl]:--}"); done
  echo "$line   (all_reduce time column at 8 B)"
  unset busbw usec wrong lat
done
echo
echo "# '!' marks a result with #wrong > 0; '-' a missing value.  Raw logs: $outdir"
exit $status
