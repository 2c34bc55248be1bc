"""Reads workers' restore log lines on stdin and prints bytes, time and GB/s.

Lines (worker/engine_trainer.cc):
  ... resumes at step S from peers (...): received B bytes, sent B, copied B locally, R rounds in D
  ... resumes at step S from the checkpoint of job J (...): C chunks, B bytes in D
D is an Abseil duration ("812ms", "1.204s", "1m3.5s"). With several receiving
workers it also prints their aggregate: all bytes over the window from the
earliest start (log time - D) to the latest end.
Usage: recovery_throughput.py peer|checkpoint
"""
import datetime
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
    spans = []  # (start, end, bytes) of lines with a log time
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
        stamp = re.search(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d+)Z", line)
        if stamp:
            end = datetime.datetime.fromisoformat(stamp.group(1)).timestamp()
            spans.append((end - duration, end, received))
    if len(spans) > 1:
        window = max(e for _, e, _ in spans) - min(s for s, _, _ in spans)
        total = sum(b for _, _, b in spans)
        print("  %-10s %-8s %7.3f GB in %7.3f s: %5.2f GB/s (aggregate)" %
              (kind, "all", total / 1e9, window, total / window / 1e9 if window > 0 else float("nan")))
    if rows == 0:
        print("  %s: no restore line found" % kind)
        sys.exit(1)


if __name__ == "__main__":
    main()
