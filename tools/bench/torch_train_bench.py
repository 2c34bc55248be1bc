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
import math
import statistics
import sys
import time

try:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
except ImportError as error:
    print(f"torch_train_bench.py: cannot import torch ({error}); "
          "install python3-torch (tools/dev deps)", file=sys.stderr)
    sys.exit(3)

CONFIGS = {
    # layers, heads, width, vocab, padded vocab, context length
    "tiny": dict(layers=2, heads=4, width=128, vocab=512, padded_vocab=512, context=64),
    "gpt2-124m": dict(layers=12, heads=12, width=768, vocab=50257, padded_vocab=50304,
                      context=1024),
}


class Block(nn.Module):
    def __init__(self, width, heads):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(width, eps=1e-5)
        self.qkv = nn.Linear(width, 3 * width)
        self.attproj = nn.Linear(width, width)
        self.ln2 = nn.LayerNorm(width, eps=1e-5)
        self.fc = nn.Linear(width, 4 * width)
        self.fcproj = nn.Linear(4 * width, width)

    def forward(self, x, mask):
        B, T, C = x.shape
        hs = C // self.heads
        q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
        q = q.view(B, T, self.heads, hs).transpose(1, 2)
        k = k.view(B, T, self.heads, hs).transpose(1, 2)
        v = v.view(B, T, self.heads, hs).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
        att = F.softmax(att.masked_fill(mask[:T, :T], float("-inf")), dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        x = x + self.attproj(y)
        x = x + self.fcproj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))
        return x


class Gpt(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.vocab = cfg["vocab"]
        self.wte = nn.Embedding(cfg["padded_vocab"], cfg["width"])
        self.wpe = nn.Embedding(cfg["context"], cfg["width"])
        self.blocks = nn.ModuleList(Block(cfg["width"], cfg["heads"])
                                    for _ in range(cfg["layers"]))
        self.lnf = nn.LayerNorm(cfg["width"], eps=1e-5)
        # True above the diagonal: the positions a query may not see.
        mask = torch.ones(cfg["context"], cfg["context"], dtype=torch.bool).triu(1)
        self.register_buffer("mask", mask, persistent=False)
        # GPT-2 initialisation (the values do not change the work).
        for name, p in self.named_parameters():
            if p.dim() >= 2:
                std = 0.02 / math.sqrt(2 * cfg["layers"]) if name.endswith("proj.weight") else 0.02
                nn.init.normal_(p, mean=0.0, std=std)
            elif "ln" in name and name.endswith("weight"):
                nn.init.ones_(p)
            else:
                nn.init.zeros_(p)

    def forward(self, idx, targets):
        T = idx.shape[1]
        x = self.wte(idx) + self.wpe.weight[:T]
        for block in self.blocks:
            x = block(x, self.mask)
        logits = F.linear(self.lnf(x), self.wte.weight)  # tied head over all Vp rows
        return F.cross_entropy(logits[:, :, :self.vocab].reshape(-1, self.vocab),
                               targets.reshape(-1))


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
