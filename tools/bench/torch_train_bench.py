#!/usr/bin/env python3
"""PyTorch eager half of `tools/dev bench train` (tools/bench/train_bench.sh).

Times the training step of the same GPT-2 that Cohort's cohort-bench-train
runs, in PyTorch 1.13 eager mode, float32 on the CPU:

  torch_train_bench.py --config tiny|gpt2-124m [--threads N] [--batch 4] [--seq 64]
                       [--warmup 3] [--steps 10]

The model: token + position embedding, pre-LN blocks (causal self-attention
as plain matmul + masked softmax, a tanh-GELU MLP), final LayerNorm, LM head
tied to the token embedding over all Vp (padded) rows, cross-entropy over the
first V columns. A step: zero_grad(set_to_none=True), forward, backward,
clip_grad_norm_(1.0), torch.optim.AdamW (lr 6e-4, betas (0.9, 0.95),
weight decay 0.1 on matrices and embeddings only; 1.13's default
single-tensor implementation). Prints, for the steps after the warmup,

  RESULT torch <config> <threads> <B> <T> <step ms,...>
  PHASES torch <config> <median forward ms> <median backward ms> <median optimizer ms>

Exit status 3 when torch cannot be imported.
"""

import argparse
import os
import statistics
import sys
import time

try:
    import torch
except ImportError as error:
    print(f"torch_train_bench.py: cannot import torch ({error}); "
          "install python3-torch (tools/dev deps)", file=sys.stderr)
    sys.exit(3)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_gpt import Gpt  # noqa: E402  (the model both PyTorch baselines run)

CONFIGS = {
    # layers, heads, width, vocab, padded vocab, context length
    "tiny": dict(layers=2, heads=4, width=128, vocab=512, padded_vocab=512, context=64),
    "gpt2-124m": dict(layers=12, heads=12, width=768, vocab=50257, padded_vocab=50304,
                      context=1024),
}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="tiny", choices=sorted(CONFIGS))
    parser.add_argument("--threads", type=int, default=0, help="0: torch's default")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args()
    cfg = CONFIGS[args.config]
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    threads = torch.get_num_threads()
    torch.manual_seed(42)
    B, T = args.batch, args.seq

    model = Gpt(cfg)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                                   {"params": no_decay, "weight_decay": 0.0}],
                                  lr=6e-4, betas=(0.9, 0.95), eps=1e-8)
    batches = [torch.randint(0, cfg["vocab"], (2, B, T)) for _ in range(4)]

    step_ms, forward_ms, backward_ms, optimizer_ms, losses = [], [], [], [], []
    for step in range(args.warmup + args.steps):
        inputs, targets = batches[step % len(batches)]
        t0 = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        loss = model(inputs, targets)
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        t3 = time.perf_counter()
        losses.append(loss.item())
        if step < args.warmup:
            continue
        step_ms.append((t3 - t0) * 1e3)
        forward_ms.append((t1 - t0) * 1e3)
        backward_ms.append((t2 - t1) * 1e3)
        optimizer_ms.append((t3 - t2) * 1e3)

    print(f"RESULT torch {args.config} {threads} {B} {T} " + ",".join(f"{ms:.4f}" for ms in step_ms))
    print(f"PHASES torch {args.config} {statistics.median(forward_ms):.3f} "
          f"{statistics.median(backward_ms):.3f} {statistics.median(optimizer_ms):.3f}")
    n = sum(p.numel() for p in model.parameters())
    print(f"torch {torch.__version__} {args.config}: {n} parameters, loss {losses[0]:.4f} -> "
          f"{losses[-1]:.4f}, median step {statistics.median(step_ms):.3f} ms", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
