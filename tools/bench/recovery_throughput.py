"""Reads workers' restore log lines on stdin and prints bytes, time and GB/s.

Lines (worker/engine_trainer.cc):
  ... resumes at step S from peers (...): received B bytes, sent B, copied B locally, R rounds in D
  ... resumes at step S from the checkpoint of job J (...): C chunks, B bytes in D
D is an Abseil duration ("812ms", "1.204s", "1m3.5s").
Usage: recovery_throughput.py peer|checkpoint
"""
import re
import sys


def seconds(text):
    total = 0.0
    for value, unit in re.findall(r"([0-9.]+)(ms|us|ns|s|m|h)", text):
        total += float(value) * {"h": 3600, "m": 60, "s": 1, "ms": 1e-3, "us": 1e-6,
                                 "ns": 1e-9}[unit]
    return total


def main():
    kind = sys.argv[1]
    pattern = (r"received (\d+) bytes.* in (\S+)$" if kind == "peer"
               else r"chunks, (\d+) bytes in (\S+)$")
    rows = 0
    for line in sys.stdin:
        match = re.search(pattern, line.strip())
        if not match:
            continue
        received, duration = int(match.group(1)), seconds(match.group(2))
        if received == 0:
            continue  # a survivor that kept its own state
        worker = re.search(r"worker (\S+)", line)
        rate = received / duration / 1e9 if duration > 0 else float("nan")
        print("  %-10s %-8s %7.3f GB in %7.3f s: %5.2f GB/s" %
              (kind, worker.group(1) if worker else "?", received / 1e9, duration, rate))
        rows += 1
    if rows == 0:
        print("  %s: no restore line found" % kind)
        sys.exit(1)


if __name__ == "__main__":
    main()
