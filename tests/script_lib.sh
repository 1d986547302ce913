# shellcheck shell=bash
# script_lib.sh — the start the test and benchmark scripts share.
#
#   source "$(dirname "${BASH_SOURCE[0]}")/script_lib.sh" "${1:-build}"            (tests/)
#   source "$(dirname "${BASH_SOURCE[0]}")/../tests/script_lib.sh" "${1:-build}"   (bench/)
#   source "$(dirname "${BASH_SOURCE[0]}")/../tests/script_lib.sh" build             (bench/, then
#   script_bench_opts NAME SIZES "$@" reads -r, -n and BUILD_DIR)
#
# Sets here (the sourcing script's directory), repo (the repository root), build (the build
# directory given, made absolute against repo) and bin ($build/bin).
# script_bench_opts NAME SIZES "$@": a benchmark's command line, bench/NAME.sh [-r REPEATS]
# [-n "SIZES"] [BUILD_DIR]; sets repeats (default 1), sizes (default SIZES), build and bin.
# script_need NAME EXE...: exits 1 ("NAME: FAIL: ...") unless every $bin/EXE is built.
# script_need_option NAME EXE OPTION: exits 1 unless `$bin/EXE --help` mentions OPTION.
# script_wait SECONDS PID CMD...: runs CMD every 0.05 s until it succeeds (0); 1 once process PID
# ended or SECONDS passed. Conditions for it: script_pid_files_at_least DIR N (DIR holds N
# rank*.pid files) and script_seed_env FILE (nexar-seed wrote its address and token to FILE).
# script_tmp NAME PREFIX: a new directory $tmp (/tmp/PREFIX.XXXXXX) and an empty array pids;
# on exit every process in pids is stopped (SIGTERM, which `timeout` passes on) and reaped and
# $tmp removed; SIGINT and SIGTERM end the script with 130 and 143, naming NAME.

here=$(cd "$(dirname "${BASH_SOURCE[1]}")" && pwd)
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
export here repo

# script_build DIR: build (DIR, made absolute against repo) and bin.
script_build() {
  build=${1:-build}
  case "$build" in /*) ;; *) build="$repo/$build" ;; esac
  bin="$build/bin"
  export build bin
}
script_build "${1:-build}"

# shellcheck disable=SC2034  # sizes is for the caller
script_bench_opts() {
  local name=$1 opt OPTIND=1 usage
  usage="usage: bench/$1.sh [-r REPEATS] [-n \"SIZES\"] [BUILD_DIR]"
  repeats=1
  sizes=$2
  shift 2
  while getopts "r:n:h" opt; do
    case "$opt" in
      r) repeats=$OPTARG ;;
      n) sizes=$OPTARG ;;
      h) echo "$usage"; exit 0 ;;
      *) echo "$usage" >&2; exit 2 ;;
    esac
  done
  shift $((OPTIND - 1))
  [[ "$repeats" =~ ^[1-9][0-9]*$ ]] || { echo "$name: -r wants a positive count" >&2; exit 2; }
  script_build "${1:-build}"
}

script_need() {
  local name=$1 exe
  shift
  for exe in "$@"; do
    [ -x "$bin/$exe" ] || { echo "$name: FAIL: $bin/$exe not found (build it first)"; exit 1; }
  done
}

script_need_option() {
  # The help text is read whole first: piped into `grep -q` under pipefail, a program
  # still writing when grep has found the option would die of SIGPIPE and fail the check.
  grep -q -- "$3" <<<"$("$bin/$2" --help 2>&1)" && return 0
  echo "$1: FAIL: $bin/$2 has no $3 option"
  exit 1
}

script_wait() {
  local t secs=$1 pid=$2
  shift 2
  for ((t = 0; t < secs * 20; t++)); do
    "$@" && return 0
    kill -0 "$pid" 2>/dev/null || return 1
    sleep 0.05
  done
  return 1
}

# script_median [FORMAT]: the median of the numbers on stdin, printed with the awk printf
# FORMAT (default %s, the value as it is); "-" when there are none.
script_median() {
  sort -g | awk -v f="${1:-%s}" '{ v[NR] = $1 } END { if (NR == 0) { printf "-"; exit }
    printf f, (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}

script_pid_files_at_least() { [ "$(find "$1" -name 'rank*.pid' | grep -c '')" -ge "$2" ]; }

script_seed_env() { grep -q '^NEXAR_SEED_ADDR=' "$1" 2>/dev/null && grep -q '^NEXAR_CLUSTER_TOKEN' "$1"; }

# shellcheck disable=SC2317  # reached through the trap
script_cleanup() {
  local p
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null; done
  rm -rf "$tmp"
}

script_tmp() {
  script_name=$1
  tmp=$(mktemp -d "/tmp/$2.XXXXXX")
  pids=()
  trap script_cleanup EXIT
  # shellcheck disable=SC2064  # the name is fixed now
  trap "echo \"$script_name: interrupted\" >&2; exit 130" INT
  # shellcheck disable=SC2064
  trap "echo \"$script_name: terminated\" >&2; exit 143" TERM
}
