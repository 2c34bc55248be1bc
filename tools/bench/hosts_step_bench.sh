#!/usr/bin/env bash
# A dp 4 GPT-2-small-sized training step across 2 network-namespace hosts
# (deploy/local/cluster up 4 --hosts 2, each host's link shaped to
# RATE), with the data group's all-reduces flat and hierarchical
# (--collectives), one run each in turn; ZeRO-1 off, so the gradients are
# all-reduced. Prints each run's step times (steps 3 on) and their median.
# Needs root. Part of `tools/dev bench hosts`.
#
#   tools/bench/hosts_step_bench.sh BUILD_DIR [RATE (default 10gbit)] [STEPS (default 8)]
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BUILD_DIR=${1:?usage: hosts_step_bench.sh BUILD_DIR [RATE] [STEPS]}
RATE=${2:-10gbit}
STEPS=${3:-8}
CTL="$BUILD_DIR/tools/cohortctl"
export COHORT_BUILD_DIR=$BUILD_DIR
current=""
cleanup() { [[ -z "$current" ]] || COHORT_LOCAL_DIR=$current "$ROOT/deploy/local/cluster" down >/dev/null; }
trap cleanup EXIT

# median_step_times LOSS_LOG: step times from a loss log written by every rank
# (the slowest rank's time per step), steps 3 on, and their median.
median_step_times() {
  /usr/bin/python3 - "$1" <<'PY'
import collections, sys
done = collections.defaultdict(float)
for line in open(sys.argv[1]):
    w = line.split()
    if len(w) >= 10 and w[4] == "step":
        done[int(w[5])] = max(done[int(w[5])], float(w[9]))
d = sorted(done[s] - done[s - 1] for s in done if s - 1 in done and s >= 3)
print("step times %s s, median %.2f s" % (" ".join("%.2f" % x for x in d), d[len(d) // 2]))
PY
}

echo "GPT-2 small (12 x 768, vocab 50257, context 128), batch 8 (micro 2), dp 4 over 2 hosts x 2," \
  "links $RATE, ZeRO-1 off"
for algo in flat hierarchical; do
  dir=$(mktemp -d /tmp/cohort-bench-hosts-step.XXXXXX)
  current=$dir
  COHORT_LOCAL_DIR=$dir COHORT_WORKER_FLAGS="--collectives=$algo --loss_log=$dir/loss.log" \
    "$ROOT/deploy/local/cluster" up 4 --hosts 2 >/dev/null
  # shellcheck disable=SC1091
  source "$dir/cluster.env"
  for h in 0 1; do
    tc qdisc add dev "cohort-local-h$h" root tbf rate "$RATE" burst 4mb latency 50ms
    ip netns exec "cohort-local-$h" tc qdisc add dev eth0 root tbf rate "$RATE" burst 4mb latency 50ms
  done
  "$CTL" --coordinator "$COHORT_COORDINATOR" submit --name "step-$algo" --layers 12 --heads 12 \
    --width 768 --vocab 50257 --context 128 --global_batch 8 --micro_batch 2 --steps "$STEPS" \
    --warmup 2 --zero1=false --min_workers 4 --max_workers 4 >/dev/null
  state=""
  for _ in $(seq 1200); do
    state=$("$CTL" --coordinator "$COHORT_COORDINATOR" list --all |
      awk -v n="step-$algo" '$2 == n { print $3 }')
    [[ "$state" == COMPLETED || "$state" == FAILED ]] && break
    sleep 1
  done
  printf '%-13s %s: ' "$algo" "$state"
  median_step_times "$dir/loss.log"
  COHORT_LOCAL_DIR=$dir "$ROOT/deploy/local/cluster" down >/dev/null
  current=""
  rm -rf "$dir"
done
