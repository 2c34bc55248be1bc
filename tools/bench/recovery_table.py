"""Records and tabulates the recoveries of `tools/dev bench recovery`.

Record mode (one run): the job's JSON (cohortctl get --output json) on stdin,
the run's worker logs as arguments; prints one JSON line with the job's
last-recovery phases (RecoveryStats), its step time, and each receiving
worker's restore from its log line (worker/engine/engine_trainer.cc):
  ... job J generation G resumes at step S from peers (...): received B bytes, ... in D
  ... job J generation G resumes at step S from the checkpoint of job K (...): C chunks, B bytes in D
      [(download D1, gather D2)]
D is an Abseil duration ("812ms", "1.204s", "1m3.5s").
  recovery_table.py --record CASE JOB LOG... [--dd_gbps X] < job.json >> results.jsonl

Table mode: the JSON lines on stdin; per case, min / median / max of each
phase over the runs.
  recovery_table.py < results.jsonl
"""
import datetime
import json
import re
import statistics
import sys

PHASES = [  # (column, RecoveryStats field)
    ("detect->running", "lastDetectToRunningSeconds"),
    ("suspend", "lastSuspendSeconds"),
    ("prepare", "lastPrepareSeconds"),
    ("build", "lastBuildSeconds"),
    ("  communicators", "lastCommunicatorsSeconds"),
    ("  session", "lastSessionSeconds"),
    ("restore", "lastRestoreSeconds"),
    ("  transfer", "lastTransferSeconds"),
    ("  mirrors", "lastMirrorsSeconds"),
    ("first step", "lastFirstStepSeconds"),
    ("detect->first step", "lastDetectToFirstStepSeconds"),
]


def seconds(text):
    total = 0.0
    for value, unit in re.findall(r"([0-9.]+)(ms|us|ns|s|m|h)", text):
        total += float(value) * {"h": 3600, "m": 60, "s": 1, "ms": 1e-3, "us": 1e-6,
                                 "ns": 1e-9}[unit]
    return total


def log_time(line):
    match = re.search(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d+)Z", line)
    return datetime.datetime.fromisoformat(match.group(1)).timestamp() if match else None


def receivers(job, logs):
    """[(bytes, seconds, end time)] of the workers that received state for `job`."""
    out = []
    # A checkpoint restore counts the state it restored (with ZeRO-1 each
    # data rank downloads its shard of the weights and gathers the rest).
    pattern = re.compile(r"job " + re.escape(job) + r" generation \d+ resumes at step \d+ from "
                         r"(?:peers.*received (\d+) bytes.* in (\S+)|the checkpoint.*chunks, "
                         r".*, (\d+) bytes restored in (\S+)(?: \(download \S+, gather \S+\))?)$")
    for path in logs:
        with open(path, errors="replace") as f:
            for line in f:
                match = pattern.search(line.rstrip())
                if not match:
                    continue
                size = int(match.group(1) or match.group(3))
                took = seconds(match.group(2) or match.group(4))
                if size > 0 and took > 0:
                    out.append((size, took, log_time(line)))
    return out


def record(args):
    case, job = args[0], args[1]
    logs, dd = [], None
    rest = args[2:]
    while rest:
        if rest[0] == "--dd_gbps":
            dd = float(rest[1])
            rest = rest[2:]
        else:
            logs.append(rest[0])
            rest = rest[1:]
    j = json.load(sys.stdin)
    stats = j.get("recoveryStats", {})
    row = {"case": case, "job": job}
    for column, field in PHASES:
        row[column] = float(stats.get(field, 0))
    row["step time"] = float(j.get("progress", {}).get("stepTimeSeconds", 0))
    row["lost steps"] = int(j.get("recovery", {}).get("lostSteps", 0))
    row["sessions"] = (f"{stats.get('lastSessionsKept', 0)} kept, "
                       f"{stats.get('lastSessionsWarm', 0)} warm, "
                       f"{stats.get('lastModelsKept', 0)} model kept of {stats.get('lastMembers', 0)}")
    got = receivers(job, logs)
    row["GB/s per receiver"] = [b / s / 1e9 for b, s, _ in got]
    if got and all(t is not None for _, _, t in got):
        start = min(t - s for _, s, t in got)
        end = max(t for _, _, t in got)
        row["GB/s aggregate"] = sum(b for b, _, _ in got) / max(end - start, 1e-9) / 1e9
    if dd is not None:
        row["cold dd GB/s"] = dd
    print(json.dumps(row))


def spread(values):
    if not values:
        return "-"
    return (f"{min(values):.2f} / {statistics.median(values):.2f} / {max(values):.2f}")


def table():
    rows = [json.loads(line) for line in sys.stdin if line.strip()]
    cases = []
    for row in rows:
        if row["case"] not in cases:
            cases.append(row["case"])
    print("min / median / max over the runs; seconds unless GB/s")
    for case in cases:
        mine = [r for r in rows if r["case"] == case]
        print(f"\n{case} ({len(mine)} runs)")
        lines = []
        if case != "checkpoint":  # a new job there: no recovery phases
            for column, _ in PHASES + [("step time", None), ("lost steps", None)]:
                lines.append((column, [r[column] for r in mine if column in r]))
        lines.append(("GB/s per receiver", [v for r in mine for v in r["GB/s per receiver"]]))
        lines.append(("GB/s aggregate", [r["GB/s aggregate"] for r in mine
                                         if "GB/s aggregate" in r]))
        if any("cold dd GB/s" in r for r in mine):
            lines.append(("cold dd GB/s", [r["cold dd GB/s"] for r in mine if "cold dd GB/s" in r]))
            lines.append(("restore / dd", [r["GB/s aggregate"] / r["cold dd GB/s"] for r in mine
                                           if r.get("cold dd GB/s") and "GB/s aggregate" in r]))
        for column, values in lines:
            print(f"  {column:<20} {spread(values)}")
        sessions = sorted({r["sessions"] for r in mine if not r["sessions"].endswith(" of 0")})
        if sessions:
            print(f"  {'sessions':<20} {'; '.join(sessions)}")


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--record":
        record(sys.argv[2:])
    else:
        table()


if __name__ == "__main__":
    main()
