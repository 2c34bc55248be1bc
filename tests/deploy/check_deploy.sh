#!/usr/bin/env bash
# Offline checks of the deploy/ tree: no cluster, no registry, no network.
#
#   tests/deploy/check_deploy.sh [SECTION...]     (default: all sections)
#
# Sections:
#   prometheus  promtool check config (prometheus.yml and its example file_sd
#               targets), check rules (alerts.yml), test rules (alerts_test.yml)
#   systemd     systemd-analyze verify of both units (with ExecStart pointed
#               at stub executables, see below), systemd-analyze security
#               --offline with a threshold, and the units' flags against
#               coordinator/main.cc and worker/main.cc
#   kubernetes  the manifests and kustomizations, structurally
#               (tests/deploy/deploy_checks.py), yamllint, and
#               `kubectl kustomize` where kubectl exists
#   metrics     every metric the alert rules and the Grafana dashboard use is
#               in docs/metrics.md and in the code
#   container   the Containerfile against tools/dev's package list
#   scripts     bash -n and shellcheck of deploy/local/cluster, Python syntax
#               of the helper and the tests
#
# A tool that is missing skips the part that needs it, with a message.
# Exit status: 0 every check ran passed; 1 a check failed; 77 every requested
# section was skipped (ctest's SKIP_RETURN_CODE); 64 usage error.
#
# systemd-analyze verify refuses units whose ExecStart binary does not exist
# (/usr/bin/cohort-* are not installed here), and only warns, exit 0, about
# unknown keys. So the units are copied to a temporary folder with
# /usr/bin/cohort-* replaced by stub scripts, the template is verified as the
# instance cohort-worker@0.service, and any output at all counts as failure.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
ALL=(prometheus systemd kubernetes metrics container scripts)
TMP="$(mktemp -d /tmp/cohort-check-deploy.XXXXXX)"
trap 'rm -rf "$TMP"' EXIT

FAILED=0
RAN=0
SKIPPED=0

say() { printf '%s\n' "$*"; }
pass() { say "PASS: $*"; }
fail() { say "FAIL: $*"; FAILED=$((FAILED + 1)); }
skip() { say "SKIP: $*"; }

# run DESCRIPTION COMMAND...: runs it, shows its output on failure.
run() {
  local what=$1
  shift
  local out
  if out=$("$@" 2>&1); then
    pass "$what"
  else
    fail "$what"
    printf '%s\n' "$out" | sed 's/^/    /'
  fi
}

# A python3 with yaml: the first python3 on PATH, else Debian's.
PYTHON=""
for p in python3 /usr/bin/python3; do
  if command -v "$p" >/dev/null 2>&1 && "$p" -c 'import yaml' 2>/dev/null; then
    PYTHON=$p
    break
  fi
done

# py_section NAME: tests/deploy/deploy_checks.py NAME; 2 when it cannot run.
py_section() {
  if [[ -z "$PYTHON" ]]; then
    skip "$1 structure: no python3 with yaml (apt-get install python3-yaml)"
    return 2
  fi
  local out rc
  out=$("$PYTHON" "$ROOT/tests/deploy/deploy_checks.py" "$ROOT" "$1" 2>&1)
  rc=$?
  printf '%s\n' "$out" | sed 's/^/    /'
  if ((rc == 0)); then
    pass "$1 structure"
  elif ((rc == 77)); then
    skip "$1 structure"
    return 2
  else
    fail "$1 structure"
  fi
}

section_prometheus() {
  if ! command -v promtool >/dev/null 2>&1; then
    skip "prometheus: promtool not installed (apt-get install prometheus)"
    return 2
  fi
  local dir="$ROOT/deploy/prometheus"
  # promtool resolves rule_files and file_sd paths against the config's
  # folder and checks the target files it finds.
  run "promtool check config deploy/prometheus/prometheus.yml" \
    promtool check config "$dir/prometheus.yml"
  run "promtool check rules deploy/prometheus/alerts.yml" promtool check rules "$dir/alerts.yml"
  run "promtool test rules deploy/prometheus/alerts_test.yml" \
    bash -c 'cd "$1" && promtool test rules alerts_test.yml' _ "$dir"
  # Every alert has a firing test.
  local alert missing=()
  for alert in $(sed -n 's/^ *- alert: *//p' "$dir/alerts.yml"); do
    grep -q "alertname: $alert\$" "$dir/alerts_test.yml" || missing+=("$alert")
  done
  if ((${#missing[@]} == 0)); then
    pass "every alert in alerts.yml is tested"
  else
    fail "alerts without a test: ${missing[*]}"
  fi
}

section_systemd() {
  local rc=2
  if command -v systemd-analyze >/dev/null 2>&1; then
    rc=0
    mkdir -p "$TMP/systemd/bin" "$TMP/systemd/units"
    local b f
    for b in cohort-coordinator cohort-worker; do
      printf '#!/bin/sh\nexit 0\n' >"$TMP/systemd/bin/$b"
      chmod +x "$TMP/systemd/bin/$b"
    done
    for f in "$ROOT"/deploy/systemd/*.service; do
      sed "s#/usr/bin/cohort-#$TMP/systemd/bin/cohort-#g" "$f" >"$TMP/systemd/units/$(basename "$f")"
    done
    local unit out
    for unit in cohort-coordinator.service cohort-worker@0.service; do
      if out=$(cd "$TMP/systemd/units" && systemd-analyze verify "./$unit" 2>&1) &&
         [[ -z "$out" ]]; then
        pass "systemd-analyze verify $unit"
      else
        fail "systemd-analyze verify $unit"
        printf '%s\n' "$out" | sed 's/^/    /'
      fi
    done
    # Exposure scores (0 = locked down, 10 = none): the coordinator scores
    # 1.2 and the worker 3.4 (it needs the GPU devices, IPC with its
    # same-host peers and writable+executable memory for CUDA's JIT).
    # --threshold counts in tenths: 20 = 2.0.
    local threshold
    for unit in cohort-coordinator.service:20 cohort-worker@0.service:40; do
      threshold=${unit#*:}
      unit=${unit%%:*}
      if out=$(cd "$TMP/systemd/units" &&
               systemd-analyze security --offline=yes --threshold="$threshold" "./$unit" 2>&1); then
        pass "systemd-analyze security $unit: $(printf '%s\n' "$out" | sed -n 's/.*Overall exposure level for [^:]*: //p')"
      else
        fail "systemd-analyze security $unit above $((threshold / 10)).$((threshold % 10))"
        printf '%s\n' "$out" | tail -3 | sed 's/^/    /'
      fi
    done
  else
    skip "systemd-analyze not installed: units not verified (apt-get install systemd)"
  fi
  py_section systemd && rc=0
  return "$rc"
}

section_kubernetes() {
  local rc=2
  py_section kubernetes && rc=0
  if command -v yamllint >/dev/null 2>&1; then
    rc=0
    run "yamllint deploy/kubernetes deploy/prometheus" \
      yamllint -c "$ROOT/tests/deploy/yamllint.yml" "$ROOT/deploy/kubernetes" \
      "$ROOT"/deploy/prometheus/*.yml
  else
    skip "yamllint not installed (apt-get install yamllint)"
  fi
  if command -v kubectl >/dev/null 2>&1; then
    local dir
    for dir in deploy/kubernetes deploy/kubernetes/cpu-workers; do
      run "kubectl kustomize $dir" kubectl kustomize "$ROOT/$dir"
    done
  else
    skip "kubectl not installed: kustomize rendering checked by deploy_checks.py only"
  fi
  return "$rc"
}

section_metrics() { py_section metrics; }
section_container() { py_section container; }

section_scripts() {
  run "bash -n deploy/local/cluster" bash -n "$ROOT/deploy/local/cluster"
  run "bash -n tests/deploy/check_deploy.sh" bash -n "$ROOT/tests/deploy/check_deploy.sh"
  if command -v shellcheck >/dev/null 2>&1; then
    # Warnings and errors; the sections here are called indirectly, which
    # the "unreachable" notes (info) of ShellCheck do not follow.
    run "shellcheck deploy/local/cluster tests/deploy/check_deploy.sh" \
      shellcheck -S warning "$ROOT/deploy/local/cluster" "$ROOT/tests/deploy/check_deploy.sh"
  else
    skip "shellcheck not installed (apt-get install shellcheck)"
  fi
  local py=${PYTHON:-python3}
  run "python syntax of cohort-file-sd and tests/deploy/*.py" "$py" -c '
import ast, sys
for path in sys.argv[1:]:
    with open(path) as f:
        ast.parse(f.read(), path)' "$ROOT/deploy/prometheus/cohort-file-sd" "$ROOT"/tests/deploy/*.py
}

main() {
  local sections=("$@")
  ((${#sections[@]})) || sections=("${ALL[@]}")
  local s
  for s in "${sections[@]}"; do
    [[ " ${ALL[*]} " == *" $s "* ]] || { say "unknown section $s (one of: ${ALL[*]})"; exit 64; }
  done
  for s in "${sections[@]}"; do
    say "== $s"
    "section_$s"
    if (($? == 2)); then SKIPPED=$((SKIPPED + 1)); else RAN=$((RAN + 1)); fi
  done
  say "== ${#sections[@]} section(s): $RAN ran, $SKIPPED skipped, $FAILED check(s) failed"
  ((FAILED == 0)) || exit 1
  ((RAN > 0)) || exit 77
  exit 0
}

main "$@"
