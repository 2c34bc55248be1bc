#!/usr/bin/env python3
"""The table a user compares: Cohort's GPU step against PyTorch's on the same machine.

  gpu_compare.py COHORT_JSON [TORCH_JSON ...]

Reads the --output json of cohort-bench-gpu and of one or more runs of
torch_gpu_step.py (e.g. one for eager and sdpa, one for torch.compile; all with
the same --model, --batch and --seq) and prints one markdown row per precision:
Cohort's whole step (forward, backward and optimizer, the state on the device)
beside the fastest PyTorch row of that precision (eager, sdpa or torch.compile,
each with clip and fused AdamW), with the ratio of tokens/s (above 1: Cohort is
faster; "none ran" where no PyTorch run is given or none of its rows ran).
Then every row of both, skipped and failed ones with their reasons.

Exit status: 0 the table was printed (whatever the rows' outcomes); 2 an input
is missing, not JSON, or of another model or shape than the other.
"""

import json
import sys


def load(path, what):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as error:
        print(f"gpu_compare.py: cannot read {what} results {path}: {error}", file=sys.stderr)
        sys.exit(2)


def fmt(value, spec):
    return "n/a" if value is None else format(value, spec)


def mfu(row):
    if row.get("mfu") is None:
        return "n/a"
    return f"{100 * row['mfu']:.1f}%"


def main(argv):
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    cohort = load(argv[1], "cohort-bench-gpu")
    runs = [load(path, "torch_gpu_step.py") for path in argv[2:]]
    for run in runs:
        for key in ("model", "batch", "seq"):
            if cohort.get(key) != run.get(key):
                print(f"gpu_compare.py: the runs differ in {key}: cohort {cohort.get(key)}, "
                      f"torch {run.get(key)}", file=sys.stderr)
                return 2
    torch = dict(runs[0] if runs else {}, rows=[row for run in runs for row in run["rows"]])
    print(f"Cohort against PyTorch {torch.get('torch', '(no run)')}: {cohort['model']}, "
          f"B={cohort['batch']} T={cohort['seq']}, {cohort['steps']} timed steps each "
          "(median); the whole step (forward, backward, clip, AdamW) on both sides.")
    print()
    print("| precision | cohort ms | cohort tokens/s | cohort MFU | fastest torch | torch ms | "
          "torch tokens/s | torch MFU | ratio (tokens/s) |")
    print("|---|---|---|---|---|---|---|---|---|")
    precisions = []
    for row in cohort["rows"] + torch["rows"]:
        if row["precision"] not in precisions:
            precisions.append(row["precision"])
    for precision in precisions:
        ours = [r for r in cohort["rows"] if r["precision"] == precision and r["status"] == "ok"]
        theirs = [r for r in torch["rows"] if r["precision"] == precision and r["status"] == "ok"]
        best = max(theirs, key=lambda r: r["tokens_per_s"]) if theirs else None
        mine = ours[0] if ours else None
        ratio = (f"{mine['tokens_per_s'] / best['tokens_per_s']:.2f}x"
                 if mine and best and best["tokens_per_s"] > 0 else "n/a")
        print(f"| {precision} | "
              f"{fmt(mine and mine['median_ms'], '.2f')} | "
              f"{fmt(mine and mine['tokens_per_s'], '.0f')} | {mfu(mine) if mine else 'n/a'} | "
              f"{best['engine'] if best else 'none ran'} | "
              f"{fmt(best and best['median_ms'], '.2f')} | "
              f"{fmt(best and best['tokens_per_s'], '.0f')} | {mfu(best) if best else 'n/a'} | "
              f"{ratio} |")
    print()
    print("| engine | precision | status | median ms | tokens/s | MFU | peak mem GiB | reason |")
    print("|---|---|---|---|---|---|---|---|")
    for row in cohort["rows"] + torch["rows"]:
        ok = row["status"] == "ok"
        reason = row.get("reason", "").replace("|", "/").replace("\n", " ")
        print(f"| {row['engine']} | {row['precision']} | {row['status']} | "
              f"{fmt(row.get('median_ms') if ok else None, '.2f')} | "
              f"{fmt(row.get('tokens_per_s') if ok else None, '.0f')} | "
              f"{mfu(row) if ok else 'n/a'} | {fmt(row.get('peak_mem_gib'), '.2f')} | "
              f"{reason} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
