#!/bin/bash
# Session 43, call 2: the Python tests again (one bound loosened), then every GPU test case.
set -u
cd "$(dirname "$0")/.."
start=$SECONDS
tools/gpu-round.sh python; echo "python rc=$? at $((SECONDS - start)) s"
tools/gpu-round.sh tests 300 | grep -v "^rc=0"
echo "tests done at $((SECONDS - start)) s"
