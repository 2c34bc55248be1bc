#!/usr/bin/env python3
"""All-reduce timing of torch.distributed's gloo backend, one process per rank,
the counterpart of cohort-bench-collectives for `tools/dev bench hosts`.

  gloo_allreduce.py --rank R --world N --init tcp://ADDR:PORT --sizes_mib 1,16 [--csv F]

Each size: two warm-up all-reduces, a one-operation estimate, then enough
operations for about --budget_seconds; the time per operation is the slowest
rank's (a max all-reduce of the elapsed time). Rank 0 writes the CSV of
cohort-bench-collectives (bytes,seconds,algbw_gbs,busbw_gbs)."""

import argparse
import sys
import time

import torch
import torch.distributed as dist


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--world", type=int, required=True)
    parser.add_argument("--init", required=True, help="tcp://ADDR:PORT of rank 0")
    parser.add_argument("--sizes_mib", required=True)
    parser.add_argument("--budget_seconds", type=float, default=1.0)
    parser.add_argument("--csv", default="")
    args = parser.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=args.init, rank=args.rank,
                            world_size=args.world)
    n = args.world
    rows = []
    for mib in (int(m) for m in args.sizes_mib.split(",")):
        count = (mib << 20) // 4
        data = torch.ones(count, dtype=torch.float32)

        def timed(iterations):
            dist.barrier()
            start = time.perf_counter()
            for _ in range(iterations):
                dist.all_reduce(data)
            took = torch.tensor([(time.perf_counter() - start) / iterations], dtype=torch.float64)
            dist.all_reduce(took, op=dist.ReduceOp.MAX)
            return float(took[0])

        timed(1)
        timed(1)
        estimate = timed(1)
        iterations = max(5, min(1000, int(args.budget_seconds / max(estimate, 1e-9))))
        seconds = timed(iterations)
        algbw = count * 4 / seconds / 1e9
        rows.append((count * 4, seconds, algbw, algbw * 2 * (n - 1) / n))
    if args.rank == 0 and args.csv:
        with open(args.csv, "w") as out:
            out.write("bytes,seconds,algbw_gbs,busbw_gbs\n")
            for row in rows:
                out.write("%d,%.9g,%.9g,%.9g\n" % row)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
