#!/usr/bin/env bash
# The device check's comparison table (tools/bench/gpu_compare.py) from real
# runs of both benchmarks here on the CPU (tiny model, one thread): the table
# names both engines and a ratio, and inputs of different shapes are refused.
# Skips (exit 77) where python3 has no torch.
#   gpu_compare_test.sh SOURCE_DIR BINARY_DIR
set -euo pipefail
source_dir=$1
binary_dir=$2
python=/usr/bin/python3
if ! "$python" -c 'import torch' 2>/dev/null; then
  echo "skipped: $python has no torch"
  exit 77
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
shape=(--model tiny --batch 2 --seq 16 --warmup 1 --steps 2 --threads 1 --output json)
"$binary_dir/tools/cohort-bench-gpu" --backend cpu "${shape[@]}" >"$work/cohort.json" 2>"$work/cohort.log"
"$python" "$source_dir/tools/bench/torch_gpu_step.py" --device cpu "${shape[@]}" \
  >"$work/torch.json" 2>"$work/torch.log"
"$python" "$source_dir/tools/bench/gpu_compare.py" "$work/cohort.json" "$work/torch.json" \
  >"$work/table.md"
cat "$work/table.md"
grep -Eq '^\| fp32 \| [0-9.]+ \| [0-9]+ \| n/a \| torch cpu eager \| [0-9.]+ \| [0-9]+ \| n/a \| [0-9.]+x \|$' \
  "$work/table.md" || { echo "FAIL: no comparison row with a ratio"; exit 1; }
grep -q '^| cohort cpu | fp32 | ok |' "$work/table.md" || { echo "FAIL: cohort's row"; exit 1; }
# Another shape: refused with exit 2.
sed 's/"seq": 16/"seq": 32/' "$work/torch.json" >"$work/other.json"
set +e
"$python" "$source_dir/tools/bench/gpu_compare.py" "$work/cohort.json" "$work/other.json" \
  >/dev/null 2>"$work/refused.txt"
rc=$?
set -e
[[ $rc == 2 ]] && grep -q 'differ in seq' "$work/refused.txt" ||
  { echo "FAIL: mismatched shapes gave exit $rc: $(cat "$work/refused.txt")"; exit 1; }
echo "gpu_compare_test: ok"
