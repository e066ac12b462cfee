#!/usr/bin/env bash
# Installs the Debian 12 packages cocodiff builds and tests with. Idempotent; needs root or sudo.
set -euo pipefail
pkgs=(build-essential cmake ninja-build pkg-config
  libeigen3-dev libboost-fiber-dev libboost-context-dev libboost-thread-dev
  libopenmpi-dev openmpi-bin libpng-dev libgif-dev libtomlplusplus-dev libcli11-dev nlohmann-json3-dev
  libssl-dev libgoogle-perftools-dev libgtest-dev libgmock-dev libbenchmark-dev gnuplot-nox clang-14 libclang-rt-14-dev clang-format
  clang-tidy ccache)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  sudo_cmd=""
  [ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
  echo "setup: installing ${missing[*]}"
  $sudo_cmd env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  $sudo_cmd env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
