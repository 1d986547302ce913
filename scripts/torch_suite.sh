#!/usr/bin/env bash
# Runs PyTorch's own distributed test suite (torch 1.13, DistributedTest._DistTestBase)
# against nexar or gloo, through tests/python/torch_suite/run_suite.py.
# Usage: scripts/torch_suite.sh [--backend nexar|gloo] [--world 3] [--subset] [extra args]
#   --backend   torch.distributed backend under test (default: nexar)
#   --world     ranks per test (default: 3)
#   --subset    only the 38 tests of tests/python/torch_suite/subset.txt (< 1 min at world 3)
#   extra args  go to run_suite.py: -k PATTERN, test names, --timeout S, --start fork|spawn, --pass-file F,
#               --results-file F, --list, --no-nexar-skips (see run_suite.py --help)
# The nexar backend is the one the CMake build put in build/python (NEXAR_PYTHON_PATH
# overrides). The interpreter is Debian's /usr/bin/python3, which has torch (NEXAR_PYTHON
# overrides). The last line of output is "N passed, N failed, N skipped"; the exit status
# is non-zero when a test failed.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
python=${NEXAR_PYTHON:-/usr/bin/python3}
backend=nexar
world=3
args=()
while (($#)); do
  case "$1" in
    --backend) backend=$2; shift 2 ;;
    --backend=*) backend=${1#*=}; shift ;;
    --world) world=$2; shift 2 ;;
    --world=*) world=${1#*=}; shift ;;
    -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
    *) args+=("$1"); shift ;;
  esac
done

nexar_path=${NEXAR_PYTHON_PATH:-$root/build/python}
if [[ $backend == nexar ]] && ! compgen -G "$nexar_path/nexar/_torch*.so" >/dev/null; then
  echo "torch_suite.sh: no nexar torch backend in $nexar_path/nexar (build it first)" >&2
  exit 2
fi

# One scratch directory for the run: TEMP_DIR and the file:// rendezvous of torch's suite,
# and TMPDIR for the per-test directories and init files torch creates (removed at exit).
scratch=$(mktemp -d "${TMPDIR:-/tmp}/torch_suite.XXXXXX")
trap 'rm -rf "$scratch"' EXIT
export TMPDIR=$scratch
export TEMP_DIR=$scratch
export INIT_METHOD=file://$scratch/init_file
export PYTHONPATH=$nexar_path${PYTHONPATH:+:$PYTHONPATH}
export PYTHONDONTWRITEBYTECODE=1

"$python" "$root/tests/python/torch_suite/run_suite.py" \
  --backend "$backend" --world "$world" ${args[@]+"${args[@]}"}
