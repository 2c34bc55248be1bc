#!/usr/bin/env bash
# Checks that client binaries link only the protos, common and cohort_client:
# no worker libraries (model, training, communication, checkpoint sharding),
# no UCX, OpenBLAS, OpenMP, CUDA or NCCL. A client (cohortctl, the Python
# example's peers, an operator's tools) must build and run on a machine with
# none of the training stack.
#
#   client_link_test.sh BUILD_DIR TARGET...   (TARGET: a ninja target, e.g. tools/cohortctl)
#
# Three views of the same fact: the link command (what the build asks for),
# the dynamic dependencies (what the loader maps) and the symbols (what the
# static archives put in).
set -euo pipefail

build=$1
shift
forbidden_libs='libcohort_(worker_agent|comm|compute|model|data|train|checkpoint)\.a|ucx|libuc[pst]|openblas|gomp|libomp|cudart|nccl|cublas'
forbidden_symbols=' cohort::(model|train|compute|comm|checkpoint|data|worker)::'
status=0
for target in "$@"; do
  binary="$build/$target"
  if [[ ! -x $binary ]]; then
    echo "FAIL $target: $binary is not built"
    status=1
    continue
  fi
  link=$(ninja -C "$build" -t commands "$target" | tail -1)
  if grep -oE "$forbidden_libs" <<<"$link" | sort -u | grep -q .; then
    echo "FAIL $target: its link command names $(grep -oE "$forbidden_libs" <<<"$link" | sort -u | tr '\n' ' ')"
    status=1
  fi
  if ldd "$binary" | grep -E 'ucp|ucs|uct|openblas|gomp|cudart|nccl|cublas'; then
    echo "FAIL $target: loads the libraries above"
    status=1
  fi
  symbols=$(nm -C "$binary" | grep -E "$forbidden_symbols" | head -5 || true)
  if [[ -n $symbols ]]; then
    echo "FAIL $target: holds worker code, e.g."
    echo "$symbols"
    status=1
  fi
  ((status == 0)) && echo "ok $target: protos, common and cohort_client only"
done
exit "$status"
