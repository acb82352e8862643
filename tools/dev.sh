#!/usr/bin/env bash
# Set-up, build, main job and tests on a fresh Debian 12 machine with the CUDA toolkit.
#   tools/dev.sh main   install deps, build, show the device and compile the default shape's
#                       kernels for sm_90a (works without a GPU)
#   tools/dev.sh test   install deps, build, run every test (GPU tests skip without a GPU)
#   tools/dev.sh build  install deps and build only
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(cmake g++ make libfmt-dev nlohmann-json3-dev libsqlite3-dev catch2 python3-pytest)

install_deps() {
  local missing=()
  for p in "${packages[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
  if ((${#missing[@]})); then
    local sudo=()
    [[ $(id -u) -eq 0 ]] || sudo=(sudo)
    echo "installing: ${missing[*]}"
    "${sudo[@]}" apt-get update -qq
    DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
  fi
  if [[ ! -e /usr/local/cuda/include/nvrtc.h ]]; then
    echo "error: the CUDA toolkit (NVRTC and headers) is expected under /usr/local/cuda" >&2
    exit 1
  fi
  # The distribution's packages must be new enough (Debian 12's are): the presets need CMake 3.25,
  # the tests Catch2's version 2 header. Said here, not as a presets or compile error later.
  local cmake_version
  cmake_version=$(cmake --version | sed -n '1s/[^0-9]*\([0-9]*\.[0-9]*\).*/\1/p')
  if [[ $(printf '%s\n3.25\n' "$cmake_version" | sort -V | head -1) != 3.25 ]]; then
    echo "error: CMake $cmake_version is older than the 3.25 the presets need (Debian 12 has 3.25)" >&2
    exit 1
  fi
  if [[ ! -e /usr/include/catch2/catch.hpp ]]; then
    echo "error: the tests use Catch2 version 2 (catch2/catch.hpp, Debian 12's catch2 package)" >&2
    exit 1
  fi
}

build() {
  cmake --preset release
  cmake --build --preset release -j"$(nproc)"
}

case "${1:-}" in
  build) install_deps; build ;;
  main)
    install_deps; build
    build/release/tools/moejit/moejit info
    build/release/tools/moejit/moejit compile --arch sm_90a
    ;;
  test)
    install_deps; build
    ctest --preset release
    ;;
  *) sed -n '2,7p' "$0"; exit 2 ;;
esac
