#!/usr/bin/env bash
# Builds and runs every nexar test. Every stage configures with -DNEXAR_WERROR=ON: warnings
# are errors in the project's own builds (the CMake default is OFF, for users and packagers).
# Stages, in order:
#   layers   scripts/check_layers.sh: every #include follows the module graph of
#            cmake/layers.txt (seconds; runs before anything is built).
#   release  GCC (the default c++), Release (-O3, where GCC 12's flow-based warnings fire
#            most), every target; the whole ctest suite. Build tree: build/
#   python   the Python package (python/) and its torch.distributed backend, as the release
#            stage built them into build/python (GCC, which the backend needs: it must match
#            Debian torch's pybind11 ABI): pytest tests/python with Debian's /usr/bin/python3
#            (NEXAR_PYTHON overrides), which has numpy and torch; two tests at a time
#            (pytest-xdist), then those marked `timing` alone. About 1.5 minutes.
#   fuzz     clang (libFuzzer needs it): builds frame_fuzz only and runs it briefly on the
#            frame decoder (tests/fuzz_smoke.sh). Build tree: build-fuzz/
#   asan     clang, Debug (assertions on) at -O1 with line tables, AddressSanitizer +
#            UndefinedBehaviorSanitizer (NEXAR_SANITIZE),
#            tools and tests (not the micro-benchmarks, which no test runs; the release
#            stage builds them); the whole ctest suite again. Being clang, this stage is also the
#            clang -Werror build of the library, tests and tools. Build tree: build-asan/
#            The Python package is not built here: an extension module built with ASan only
#            loads into an interpreter started with the ASan runtime preloaded, and the
#            torch backend cannot be built with clang at all (pybind11 ABI).
# The release and asan trees are unity builds (CMAKE_UNITY_BUILD: a module's sources compiled
# a few at a time as one translation unit): it saves about a third of each build's CPU,
# most of it headers parsed again for every file (docs/PERFORMANCE.md, "2026-11-30"). The
# price: no stage compiles the library's files one by one any more, so a source file that
# compiles only thanks to another one's includes passes here and fails in an ordinary build
# (CMake's default, a developer's tree), which is where it shows.
# Usage: scripts/test.sh            (from anywhere; build trees go to ./build*)
#   NEXAR_TEST_STAGES="layers release python fuzz asan"   pick stages (default: all five)
#   NEXAR_FUZZ_SECONDS=15                   length of the fuzz run
#   NEXAR_JOBS=N                            parallel build jobs (default: nproc)
#   NEXAR_TEST_JOBS=N                       ctest tests run side by side (default: twice
#                                           nproc: most wait on the network or a deadline)
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
stages=${NEXAR_TEST_STAGES:-"layers release python fuzz asan"}
python=${NEXAR_PYTHON:-/usr/bin/python3}
jobs=${NEXAR_JOBS:-$(nproc)}
test_jobs=${NEXAR_TEST_JOBS:-$((2 * $(nproc)))}
failed=()

# CC and CXX count only on a build tree's first configure, so a tree that was configured
# with another compiler (build-asan/ used GCC until the asan stage moved to clang) is
# started afresh. <build dir>
clang_tree() {
  if [ -f "$1/CMakeCache.txt" ] && ! grep -q '^CMAKE_CXX_COMPILER:.*clang++' "$1/CMakeCache.txt"; then
    echo "== $1 was configured with another compiler than clang++: reconfiguring from scratch"
    rm -rf "$1"
  fi
}

# The release stage's tree (build/), which the python stage shares.
release_tree() {
  cmake -S "$root" -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DNEXAR_WERROR=ON \
    -DCMAKE_UNITY_BUILD=ON >/dev/null
}

# What failed, kept for the closing summary: CI shows only the tail of the output, and a
# failing test's name scrolls far out of it behind the later stages.
summary=()

# One ctest run over <build dir> with the given ctest arguments; on failure, the stage
# <label> is marked failed, and the failed tests and the cases inside them that gtest
# reported failing go to the summary.
ctest_part() {  # <build dir> <label> <ctest arguments>...
  local dir=$1 label=$2
  shift 2
  (cd "$dir" && ctest --output-on-failure --timeout 900 "$@") && return 0
  [[ " ${failed[*]} " == *" $label "* ]] || failed+=("$label")
  summary+=("$label: $(tr '\n' ' ' < "$dir/Testing/Temporary/LastTestsFailed.log" 2>/dev/null || true)" \
    "$({ grep -ho '^\[  FAILED  \] [A-Za-z0-9_/.]*\.[A-Za-z0-9_/.]*' "$dir/Testing/Temporary/LastTest.log" 2>/dev/null || true; } | sort -u | tr '\n' ' ')")
}

# One ctest test per test program (tests/CMakeLists.txt), $test_jobs at a time; then, once
# they have all finished, those labelled `timing` (their cases judge elapsed times or rates)
# two at a time, each of those marked ALONE there by itself (RUN_SERIAL).
run_ctest() {  # <build dir> <label>
  echo "== ctest ($2)"
  ctest_part "$1" "$2" -j"$test_jobs" -LE '^timing$'
  echo "== ctest ($2, timing tests)"
  ctest_part "$1" "$2" -j2 -L '^timing$'
}

for stage in $stages; do
  case $stage in
    layers)
      echo "== layers (cmake/layers.txt)"
      bash scripts/check_layers.sh || { failed+=(layers); summary+=("layers: see its output above"); }
      ;;
    release)
      release_tree
      cmake --build build -j"$jobs"
      run_ctest build release
      ;;
    python)
      [ -f build/CMakeCache.txt ] || release_tree
      cmake --build build -j"$jobs" --target nexar_python nexar-run
      echo "== python (pytest tests/python, $python)"
      # Two tests at a time (pytest-xdist, where the interpreter has it), then the tests
      # marked `timing` alone (tests/python/conftest.py). No bytecode or pytest cache in the
      # source tree. -rfE lists each failure and error with its message in pytest's summary.
      side_by_side=()
      if "$python" -c 'import xdist' 2>/dev/null; then side_by_side=(-n 2); fi
      python_ok=1
      for part in "not timing" timing; do
        args=("${side_by_side[@]}")
        [ "$part" = timing ] && args=()
        rc=0
        PYTHONPATH="$root/build/python" PYTHONDONTWRITEBYTECODE=1 "$python" -m pytest -q -rfE \
          -p no:cacheprovider "${args[@]}" -m "$part" tests/python 2>&1 | tee build/pytest.log || rc=$?
        # 5: no test carries the mark (nothing to run is no failure).
        if [ "$rc" -ne 0 ] && [ "$rc" -ne 5 ]; then
          python_ok=0
          summary+=("python (-m '$part'): $({ grep -E '^(FAILED|ERROR) ' build/pytest.log || true; } | cut -c1-400 | tr '\n' ' ')")
        fi
      done
      [ "$python_ok" = 1 ] || failed+=(python)
      ;;
    fuzz)
      clang_tree build-fuzz
      CC=clang CXX=clang++ cmake -S "$root" -B build-fuzz -G Ninja -DNEXAR_BUILD_FUZZERS=ON \
        -DNEXAR_WERROR=ON -DNEXAR_BUILD_TESTS=OFF -DNEXAR_BUILD_TOOLS=OFF -DNEXAR_BUILD_EXAMPLES=OFF \
        -DNEXAR_BUILD_PYTHON=OFF >/dev/null
      cmake --build build-fuzz -j"$jobs" --target frame_fuzz
      echo "== fuzz (frame decoder)"
      bash tests/fuzz_smoke.sh build-fuzz/bin/frame_fuzz || { failed+=(fuzz); summary+=("fuzz: see its output above"); }
      ;;
    asan)
      clang_tree build-asan
      # -O1 and line tables only: the sanitizers' own advice for speed. At -O0 every inline
      # accessor of the standard library is a call under instrumentation, and the suite took
      # twice the CPU (docs/PERFORMANCE.md, "Test command"); reports keep file and line.
      CC=clang CXX=clang++ cmake -S "$root" -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Debug \
        "-DCMAKE_CXX_FLAGS_DEBUG=-O1 -gline-tables-only" "-DCMAKE_C_FLAGS_DEBUG=-O1 -gline-tables-only" \
        -DNEXAR_SANITIZE=ON -DNEXAR_WERROR=ON -DNEXAR_BUILD_TOOLS=ON -DNEXAR_BUILD_EXAMPLES=OFF \
        -DNEXAR_BUILD_BENCHMARKS=OFF -DNEXAR_BUILD_PYTHON=OFF -DCMAKE_UNITY_BUILD=ON >/dev/null
      cmake --build build-asan -j"$jobs"
      ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
        run_ctest build-asan asan
      ;;
    *) echo "unknown stage $stage" >&2; exit 2 ;;
  esac
done

if [ ${#failed[@]} -gt 0 ]; then
  printf '%s\n' "${summary[@]}"
  echo "FAILED stages: ${failed[*]}"
  exit 1
fi
echo "all test stages passed: $stages"
