# shellcheck shell=bash
# script_lib.sh — the start the test and benchmark scripts share.
#
#   source "$(dirname "${BASH_SOURCE[0]}")/script_lib.sh" "${1:-build}"            (tests/)
#   source "$(dirname "${BASH_SOURCE[0]}")/../tests/script_lib.sh" "${1:-build}"   (bench/)
#
# Sets here (the sourcing script's directory), repo (the repository root), build (the build
# directory given, made absolute against repo) and bin ($build/bin).
# script_tmp NAME PREFIX: a new directory $tmp (/tmp/PREFIX.XXXXXX) and an empty array pids;
# on exit every process in pids is stopped (SIGTERM, which `timeout` passes on) and reaped and
# $tmp removed; SIGINT and SIGTERM end the script with 130 and 143, naming NAME.

here=$(cd "$(dirname "${BASH_SOURCE[1]}")" && pwd)
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${1:-build}
case "$build" in /*) ;; *) build="$repo/$build" ;; esac
bin="$build/bin"
export here repo build bin

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
