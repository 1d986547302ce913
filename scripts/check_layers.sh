#!/usr/bin/env bash
# Fails when an #include crosses an edge of the module graph that cmake/layers.txt does not
# allow: a module of src/ including a module or a third-party library it may not use, or a
# tool, example or peer benchmark including anything of src/ (the micro-benchmarks of bench/
# measure internal kernels, like tests). Prints every offending line.
#   scripts/check_layers.sh            (from anywhere)
set -uo pipefail
cd "$(dirname "$0")/.."

declare -A mods libs
while IFS= read -r line; do
  line=${line%%#*}
  [[ $line =~ ^[[:space:]]*([a-z_]+):([^|]*)\|?(.*)$ ]] || continue
  m=${BASH_REMATCH[1]}
  mods[$m]=" ${BASH_REMATCH[2]} "
  libs[$m]=" ${BASH_REMATCH[3]} "
done < cmake/layers.txt

# Third-party include roots we police, and the library each belongs to.
lib_of() {
  case $1 in
    ngtcp2) echo ngtcp2 ;;
    gnutls|nettle) echo gnutls ;;
    asio|asio.hpp) echo asio ;;
    hwy) echo hwy ;;
    spdlog) echo spdlog ;;
    fmt) echo fmt ;;
    *) echo "" ;;
  esac
}

bad=0
report() {
  echo "check_layers: $1" >&2
  bad=1
}

for dir in src/*/; do
  m=$(basename "$dir")
  if [ -z "${mods[$m]+x}" ]; then
    report "src/$m/ is not a module of cmake/layers.txt"
    continue
  fi
  while IFS=: read -r file lineno text; do
    if [[ $text =~ \#include[[:space:]]*\"([a-z_]+)/ ]]; then
      dep=${BASH_REMATCH[1]}
      [ "$dep" = "$m" ] && continue
      [[ ${mods[$m]} == *" $dep "* ]] ||
        report "$file:$lineno: module $m may not include $dep ($text)"
    elif [[ $text =~ \#include[[:space:]]*\<([A-Za-z0-9_.]+)[/\>] ]]; then
      lib=$(lib_of "${BASH_REMATCH[1]}")
      [ -z "$lib" ] && continue
      [[ ${libs[$m]} == *" $lib "* ]] ||
        report "$file:$lineno: module $m may not use $lib ($text)"
    fi
  done < <(grep -n '^[[:space:]]*#[[:space:]]*include' "$dir"* 2>/dev/null)
done

# Programs built on the library see only its public API.
while IFS=: read -r file lineno text; do
  if [[ $text =~ \#include[[:space:]]*\"([a-z_]+)/ ]] && [ -d "src/${BASH_REMATCH[1]}" ]; then
    report "$file:$lineno: programs use the public API only, not src/ ($text)"
  fi
done < <(grep -rn '^[[:space:]]*#[[:space:]]*include' tools examples bench/peers --include='*.cpp' --include='*.hpp' 2>/dev/null)

if [ $bad -ne 0 ]; then
  echo "check_layers: FAILED (the graph is cmake/layers.txt; docs/ARCHITECTURE.md explains it)" >&2
  exit 1
fi
echo "check_layers: every #include follows cmake/layers.txt"
