#!/usr/bin/env bash
# Set-up, build, main job and tests on a fresh Debian/Ubuntu machine with the CUDA toolkit.
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
