#!/usr/bin/env bash
# Runs a libFuzzer binary briefly on an empty corpus; fails if it finds a crash.
# Usage: tests/fuzz_smoke.sh <fuzzer binary>   (NEXAR_FUZZ_SECONDS, default 15)
set -u

if [[ $# -ne 1 || ! -x "$1" ]]; then
  echo "usage: $0 <path to built libFuzzer binary>" >&2
  exit 2
fi
fuzzer=$1
name=$(basename "$fuzzer")
seconds=${NEXAR_FUZZ_SECONDS:-15}

work=$(mktemp -d "${TMPDIR:-/tmp}/nexar-fuzz-${name}.XXXXXX")
mkdir -p "$work/corpus"
log="$work/fuzz.log"

# Crash reproducers go to $work, not the current directory. The outer timeout is only a
# backstop in case the fuzzer hangs outside its own time accounting.
rc=0
timeout --kill-after=10 $((seconds + 60)) \
  "$fuzzer" -max_total_time="$seconds" -artifact_prefix="$work/" -print_final_stats=1 \
  "$work/corpus" >"$log" 2>&1 || rc=$?

runs=$(sed -n 's/^stat::number_of_executed_units: *\([0-9]*\).*/\1/p' "$log" | tail -n 1)
if [[ $rc -ne 0 ]]; then
  tail -n 40 "$log" >&2
  echo "fuzz_smoke: $name FAILED (exit $rc) after ${runs:-?} runs; log and reproducer in $work"
  exit 1
fi
echo "fuzz_smoke: $name ok, ${runs:-?} runs in ${seconds}s, no crash"
rm -rf "$work"
