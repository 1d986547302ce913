#!/usr/bin/env bash
# Turns a fresh Debian 12 (bookworm) machine into a nexar build machine.
# Idempotent: when every package is already present it prints nothing and exits 0.
set -euo pipefail

# ngtcp2 1.x lives in bookworm-backports only; bookworm itself has 0.12 (pre-1.0 API).
BACKPORTS_LIST=/etc/apt/sources.list.d/nexar-bookworm-backports.list

packages=(
  build-essential cmake ninja-build pkg-config git
  clang lld libclang-rt-14-dev
  libngtcp2-dev libngtcp2-crypto-gnutls-dev
  libgnutls28-dev nettle-dev
  libasio-dev libhwy-dev libspdlog-dev libfmt-dev libcli11-dev nlohmann-json3-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  iproute2 iptables
  openmpi-bin libopenmpi-dev libgloo-dev
  # The Python package and the torch.distributed backend (python/), for Debian's own
  # interpreter /usr/bin/python3; scikit-build-core serves `pip install .` without network.
  python3-dev pybind11-dev python3-numpy python3-torch libtorch-dev python3-pytest python3-pip
  # The test command runs the Python tests two at a time (pytest -n).
  python3-pytest-xdist
  python3-venv
  python3-scikit-build-core
)
# These must come from backports: ngtcp2 1.11 (bookworm has 0.12), scikit-build-core (absent
# from bookworm).
backported=(libngtcp2-dev libngtcp2-crypto-gnutls-dev python3-scikit-build-core)

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi

need_backports=0
if ! grep -rqs "bookworm-backports" /etc/apt/sources.list /etc/apt/sources.list.d/; then
  echo "deb http://deb.debian.org/debian bookworm-backports main" | $SUDO tee "$BACKPORTS_LIST" >/dev/null
  need_backports=1
fi

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
# ngtcp2 installed but too old (0.x from bookworm) counts as missing.
ngtcp2_version=$(dpkg-query -W -f='${Version}' libngtcp2-dev 2>/dev/null || true)
case "$ngtcp2_version" in
  1.*) ;;
  *) missing+=("${backported[@]}") ;;
esac

if [ "${#missing[@]}" -eq 0 ] && [ "$need_backports" -eq 0 ]; then
  exit 0
fi

export DEBIAN_FRONTEND=noninteractive
echo "nexar setup: installing ${missing[*]}" >&2
$SUDO apt-get update -qq >/dev/null
regular=()
for p in "${missing[@]}"; do
  case " ${backported[*]} " in *" $p "*) ;; *) regular+=("$p") ;; esac
done
if [ "${#regular[@]}" -gt 0 ]; then
  $SUDO apt-get install -y -qq --no-install-recommends "${regular[@]}" >/dev/null
fi
$SUDO apt-get install -y -qq --no-install-recommends -t bookworm-backports "${backported[@]}" >/dev/null
echo "nexar setup: done" >&2
