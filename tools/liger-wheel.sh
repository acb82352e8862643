#!/usr/bin/env bash
# Liger-Kernel's wheel for bench/bench_torch.py's "liger" implementation. The GPU machine has no
# network, so the wheel is fetched here (PyPI) into build/wheels/, carried with the build, and
# unpacked there without dependencies (its torch and triton are the machine's own):
#   tools/liger-wheel.sh                     here: download (pinned version, so runs compare)
#   tools/liger-wheel.sh install DIR         there: unpack into DIR (add DIR to PYTHONPATH)
set -euo pipefail
cd "$(dirname "$0")/.."
version=0.8.5  # pinned, so runs compare; it has LigerFusedMoEFunction
case "${1:-download}" in
  download) python3 -m pip download --no-deps --dest build/wheels "liger-kernel==$version" ;;
  # A pure-Python wheel is a zip: unpacking it is its install, and needs no pip there.
  install) python3 -m zipfile -e build/wheels/liger_kernel-"$version"-py3-none-any.whl "$2" ;;
  *) sed -n '2,6p' "$0"; exit 2 ;;
esac
