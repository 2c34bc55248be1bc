#!/usr/bin/env bash
# Single-process GPT training step: Cohort (cohort-bench-train) against
# PyTorch eager (tools/bench/torch_train_bench.py) on the same configs, batch
# and thread count, measured alternately in one run so that machine load
# falls on both alike. `tools/dev bench train` calls this after building.
#
#   tools/bench/train_bench.sh BUILD_DIR [--threads N] [--rounds R] [--warmup W]
#                              [--steps S] [--configs tiny,gpt2-124m] [--python PY]
#                              [--torch-blas-threads N]
#
# Builds nothing: BUILD_DIR must hold tools/cohort-bench-train. Each round
# runs every config once per framework (the order flips each round); the
# table gives the median step time over all timed steps of all rounds, the
# ratio cohort/torch (the target is <= 0.7), tokens/s = B*T / step time, then
# the fastest single steps (on a shared machine, the least disturbed), the
# median of each phase, and the load average before and after. Both sides get OMP_NUM_THREADS and
# OPENBLAS_NUM_THREADS = threads (default nproc); PyTorch also gets
# torch.set_num_threads(threads). Cohort pins OpenBLAS to one thread per call
# itself; Debian's PyTorch runs its matrix products on OpenBLAS's own pthreads
# beside its OpenMP pool, and --torch-blas-threads sets that pool's size
# apart (1 makes small models faster and large ones slower).
set -euo pipefail

usage() {
  sed -n '7,10p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
}

[[ $# -ge 1 ]] || usage
BUILD_DIR="$1"
shift
THREADS="$(nproc)"
ROUNDS=2
WARMUP=3
STEPS=10
CONFIGS="tiny,gpt2-124m"
PYTHON="${COHORT_TORCH_PYTHON:-/usr/bin/python3}"
TORCH_BLAS_THREADS=""
BATCH=4
SEQ=64
while [[ $# -gt 0 ]]; do
  case "$1" in
    --threads) THREADS="$2"; shift 2 ;;
    --rounds) ROUNDS="$2"; shift 2 ;;
    --warmup) WARMUP="$2"; shift 2 ;;
    --steps) STEPS="$2"; shift 2 ;;
    --configs) CONFIGS="$2"; shift 2 ;;
    --python) PYTHON="$2"; shift 2 ;;
    --torch-blas-threads) TORCH_BLAS_THREADS="$2"; shift 2 ;;
    *) usage ;;
  esac
done

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
COHORT_BIN="$BUILD_DIR/tools/cohort-bench-train"
TORCH_SCRIPT="$ROOT/tools/bench/torch_train_bench.py"
[[ -x "$COHORT_BIN" ]] || { echo "train_bench.sh: $COHORT_BIN is not built" >&2; exit 1; }
"$PYTHON" -c 'import torch' 2>/dev/null ||
  { echo "train_bench.sh: $PYTHON cannot import torch (install python3-torch)" >&2; exit 1; }

OUT="$(mktemp /tmp/cohort-train-bench.XXXXXX)"
trap 'rm -f "$OUT"' EXIT
export OMP_NUM_THREADS="$THREADS" OPENBLAS_NUM_THREADS="$THREADS"
COMMON=(--threads "$THREADS" --batch "$BATCH" --seq "$SEQ" --warmup "$WARMUP" --steps "$STEPS")

run_cohort() { "$COHORT_BIN" --config "$1" "${COMMON[@]}" >>"$OUT"; }
run_torch() {
  OPENBLAS_NUM_THREADS="${TORCH_BLAS_THREADS:-$THREADS}" \
    "$PYTHON" "$TORCH_SCRIPT" --config "$1" "${COMMON[@]}" >>"$OUT"
}

LOAD_BEFORE="$(cut -d' ' -f1-3 /proc/loadavg)"
IFS=',' read -r -a CONFIG_LIST <<<"$CONFIGS"
for ((round = 1; round <= ROUNDS; ++round)); do
  for config in "${CONFIG_LIST[@]}"; do
    echo "round $round/$ROUNDS: $config, $THREADS threads, batch ${BATCH}x${SEQ}," \
      "torch OpenBLAS threads ${TORCH_BLAS_THREADS:-$THREADS}" >&2
    if ((round % 2 == 1)); then
      run_cohort "$config"
      run_torch "$config"
    else
      run_torch "$config"
      run_cohort "$config"
    fi
  done
done
LOAD_AFTER="$(cut -d' ' -f1-3 /proc/loadavg)"

"$PYTHON" - "$OUT" "$LOAD_BEFORE" "$LOAD_AFTER" "$CONFIGS" "${TORCH_BLAS_THREADS:-$THREADS}" <<'EOF'
import os
import statistics
import sys

path, load_before, load_after, configs, torch_blas_threads = sys.argv[1:6]
steps, phases, shape = {}, {}, {}
for line in open(path):
    fields = line.split()
    if fields and fields[0] == "RESULT":
        _, framework, config, threads, b, t, times = fields
        steps.setdefault((config, framework), []).extend(float(x) for x in times.split(","))
        shape[config] = (int(threads), int(b), int(t))
    elif fields and fields[0] == "PHASES":
        _, framework, config, *ms = fields
        phases.setdefault((config, framework), []).append([float(x) for x in ms])

print(f"{'config':<10} {'threads':>7} {'batch':>6} {'cohort ms/step':>14} {'torch ms/step':>13} "
      f"{'ratio':>6} {'cohort tok/s':>12} {'torch tok/s':>11}")
for config in configs.split(","):
    threads, b, t = shape[config]
    cohort = statistics.median(steps[(config, "cohort")])
    torch = statistics.median(steps[(config, "torch")])
    tokens = b * t
    print(f"{config:<10} {threads:>7} {f'{b}x{t}':>6} {cohort:>14.2f} {torch:>13.2f} "
          f"{cohort / torch:>6.2f} {tokens / cohort * 1e3:>12.0f} {tokens / torch * 1e3:>11.0f}")
print()
print("fastest step (ms), the least disturbed by other load:")
for config in configs.split(","):
    cohort = min(steps[(config, "cohort")])
    torch = min(steps[(config, "torch")])
    print(f"  {config:<10} cohort {cohort:9.2f}  torch {torch:9.2f}  ratio {cohort / torch:5.2f}")
print()
print("median per phase (ms): forward / backward / clip + AdamW")
for config in configs.split(","):
    for framework in ("cohort", "torch"):
        rows = phases[(config, framework)]
        fwd, bwd, opt = (statistics.median(r[i] for r in rows) for i in range(3))
        print(f"  {config:<10} {framework:<6} {fwd:9.2f} {bwd:9.2f} {opt:9.2f}")
print()
print(f"load average (1, 5, 15 min): before {load_before}, after {load_after}; "
      f"{len(next(iter(steps.values())))} timed steps per framework and config; "
      f"torch OpenBLAS threads {torch_blas_threads}; "
      f"OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE', '(unset)')}")
EOF
