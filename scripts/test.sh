#!/usr/bin/env bash
# Builds and runs every nexar test: the release build, a short libFuzzer run of the frame
# decoder, and the whole suite again under AddressSanitizer + UndefinedBehaviorSanitizer.
# Usage: scripts/test.sh            (from anywhere; build trees go to ./build*)
#   NEXAR_TEST_STAGES="release fuzz asan"   pick stages (default: all three)
#   NEXAR_FUZZ_SECONDS=15                   length of the fuzz run
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
stages=${NEXAR_TEST_STAGES:-"release fuzz asan"}
jobs=${NEXAR_JOBS:-$(nproc)}
failed=()

run_ctest() {  # <build dir> <label>
  echo "== ctest ($2)"
  if ! (cd "$1" && ctest --output-on-failure --timeout 900 -j1); then
    failed+=("$2")
  fi
}

for stage in $stages; do
  case $stage in
    release)
      cmake -S "$root" -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
      cmake --build build -j"$jobs"
      run_ctest build release
      ;;
    fuzz)
      CC=clang CXX=clang++ cmake -S "$root" -B build-fuzz -G Ninja -DNEXAR_BUILD_FUZZERS=ON \
        -DNEXAR_BUILD_TESTS=OFF -DNEXAR_BUILD_TOOLS=OFF -DNEXAR_BUILD_EXAMPLES=OFF >/dev/null
      cmake --build build-fuzz -j"$jobs" --target frame_fuzz
      echo "== fuzz (frame decoder)"
      bash tests/fuzz_smoke.sh build-fuzz/bin/frame_fuzz || failed+=(fuzz)
      ;;
    asan)
      cmake -S "$root" -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DNEXAR_SANITIZE=ON -DNEXAR_BUILD_TOOLS=ON \
        -DNEXAR_BUILD_EXAMPLES=OFF >/dev/null
      cmake --build build-asan -j"$jobs"
      ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
        run_ctest build-asan asan
      ;;
    *) echo "unknown stage $stage" >&2; exit 2 ;;
  esac
done

if [ ${#failed[@]} -gt 0 ]; then
  echo "FAILED stages: ${failed[*]}"
  exit 1
fi
echo "all test stages passed: $stages"
