#!/usr/bin/env python3
"""PyTorch baseline of cohort-bench-gpu: one GPT training step (forward, backward, optimizer).

  torch_gpu_step.py [--device cuda|cpu] [--precision fp32,tf32,bf16] [--model gpt2|tiny]
                    [--batch B] [--seq T] [--warmup 3] [--steps 10] [--engines eager,sdpa,compile]
                    [--peak_tflops 67,495,989] [--output table|json]

Measures what tools/bench/gpu_step_main.cc measures for Cohort, single process,
with the same model, shapes and table columns, so that tools/gpu-check can
print the two tables one after the other.

The model (written here, like Cohort's worker/model): token + position
embedding, pre-LN blocks of causal self-attention and a tanh-GELU MLP, a final
LayerNorm, an LM head tied to the token embedding over all Vp (padded) rows,
cross-entropy over the first V columns. Attention is an explicit
q @ k^T, masked softmax, @ v, as Cohort's kernels compute it, so the default
row is a like-for-like eager baseline; torch's fused
scaled_dot_product_attention is not used there. --engines picks the rows per
precision (default eager): eager (that model), sdpa (the model with
F.scaled_dot_product_attention(is_causal=True), torch >= 2.0: what a fused
attention is worth) and compile (the sdpa model under torch.compile, where it
works: a row that cannot compile fails with the reason, the others stand).

Precisions: fp32 (tf32 off for matmuls and cuDNN), tf32
(torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32),
bf16 (torch.autocast(dtype=torch.bfloat16) around the forward and the loss;
parameters and gradients stay fp32).

What is timed: zero_grad(set_to_none=True) + forward + loss.backward() +
clip_grad_norm_(1.0) + AdamW's step, with torch.cuda.synchronize() before and
after: the whole step, as cohort-bench-gpu times Cohort's (state on the
device). AdamW as Cohort's benchmark configures it: lr 6e-4, betas (0.9,
0.95), eps 1e-8, weight decay 0.1 on the matrices and embeddings only, and
torch's fused implementation on cuda (fused=True, torch >= 2.0; foreach
otherwise). Model FLOPs per token are 6 N + 12 L C T (nanoGPT's estimate_mfu,
after PaLM), N the parameter count (the tied wte counted once, padded rows
included). Peak memory is torch.cuda.max_memory_reserved(): the device memory
the caching allocator held at its highest, the nearest to Cohort's
cudaMemGetInfo reading.

Exit status: 0 every requested row ran; 3 some rows were skipped (no CUDA
device, torch too old for sdpa or compile, or torch missing) and none failed; 2 bad
arguments; 1 a row failed while it ran (e.g. out of memory).
"""

import argparse
import gc
import inspect
import json
import os
import statistics
import sys
import time

try:
    import torch
except ImportError as error:
    print(f"torch_gpu_step.py: cannot import torch ({error})", file=sys.stderr)
    sys.exit(3)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_gpt import Gpt  # noqa: E402  (beside this script, here and in the GPU bundle)

MODELS = {
    # The same presets as cohort-bench-gpu --model (gpt2 is GPT-2 124M).
    "gpt2": dict(layers=12, heads=12, width=768, vocab=50257, padded_vocab=50304, context=1024),
    "tiny": dict(layers=2, heads=4, width=128, vocab=512, padded_vocab=512, context=64),
}
PRECISIONS = ("fp32", "tf32", "bf16")
# Engine -> (F.scaled_dot_product_attention, torch.compile).
ENGINES = {"eager": (False, False), "sdpa": (True, False), "compile": (True, True)}
# H100/H200 SXM datasheet peaks, dense (not the doubled sparsity numbers):
# fp32 on the CUDA cores, tf32 and bf16 on the tensor cores.
DEFAULT_CUDA_PEAK_TFLOPS = {"fp32": 67.0, "tf32": 495.0, "bf16": 989.0}
TIMED_NOTE = ("Timed: zero_grad + forward + backward + clip_grad_norm_(1.0) + AdamW step "
              "(fused on cuda), torch.cuda.synchronize before and after each step, as "
              "cohort-bench-gpu times Cohort's step.")
LEARNING_RATE = 6e-4
WEIGHT_DECAY = 0.1
GRAD_CLIP = 1.0


def make_optimizer(model, device):
    """AdamW over `model`: decay on the matrices and embeddings (Cohort's
    ParameterTable rule), fused on cuda where torch has it."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [dict(params=decay, weight_decay=WEIGHT_DECAY),
              dict(params=no_decay, weight_decay=0.0)]
    kwargs = dict(lr=LEARNING_RATE, betas=(0.9, 0.95), eps=1e-8)
    if device == "cuda" and "fused" in inspect.signature(torch.optim.AdamW).parameters:
        kwargs["fused"] = True
    return torch.optim.AdamW(groups, **kwargs)


def flops_per_token(cfg, num_params, seq):
    # nanoGPT's estimate_mfu (PaLM appendix B): 6N for forward + backward over
    # every parameter, 12 L C T for attention's two products.
    return 6.0 * num_params + 12.0 * cfg["layers"] * cfg["width"] * seq


def num_params(cfg):
    """The parameter count of Gpt(cfg) without building it (rows may all be skipped)."""
    L, C = cfg["layers"], cfg["width"]
    per_layer = 2 * C + (3 * C * C + 3 * C) + (C * C + C) + 2 * C + (4 * C * C + 4 * C) + \
        (4 * C * C + C)
    return cfg["padded_vocab"] * C + cfg["context"] * C + L * per_layer + 2 * C


def set_precision(device, precision):
    """Sets torch's global matmul precision for a row; returns the autocast context."""
    if device == "cuda":
        tf32 = precision == "tf32"
        torch.backends.cuda.matmul.allow_tf32 = tf32
        torch.backends.cudnn.allow_tf32 = tf32
    if precision == "bf16":
        return torch.autocast(device_type=device, dtype=torch.bfloat16)
    return torch.autocast(device_type=device, enabled=False)


def run_row(args, cfg, precision, sdpa, compiled, label):
    """One row: returns dict(status, reason, and the numbers when it ran)."""
    if compiled and not hasattr(torch, "compile"):
        return dict(status="skipped",
                    reason=f"torch {torch.__version__} has no torch.compile (needs >= 2.0)")
    if sdpa and not hasattr(torch.nn.functional, "scaled_dot_product_attention"):
        return dict(status="skipped",
                    reason=f"torch {torch.__version__} has no scaled_dot_product_attention "
                           "(needs >= 2.0)")
    if args.device == "cuda" and not torch.cuda.is_available():
        return dict(status="skipped",
                    reason=f"no CUDA device (torch {torch.__version__}, "
                           f"built for CUDA {torch.version.cuda})")
    device = torch.device(args.device)
    B, T = args.batch, args.seq
    model = step_model = optimizer = None
    try:
        torch.manual_seed(42)
        model = Gpt(cfg, sdpa).to(device)
        optimizer = make_optimizer(model, args.device)
        step_model = torch.compile(model) if compiled else model
        autocast = set_precision(args.device, precision)
        batches = [torch.randint(0, cfg["vocab"], (2, B, T), device=device) for _ in range(4)]
        if args.device == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        step_ms, losses = [], []
        for step in range(args.warmup + args.steps):
            inputs, targets = batches[step % len(batches)]
            if args.device == "cuda":
                torch.cuda.synchronize(device)
            start = time.perf_counter()
            model.zero_grad(set_to_none=True)
            with autocast:
                loss = step_model(inputs, targets)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), GRAD_CLIP)
            optimizer.step()
            if args.device == "cuda":
                torch.cuda.synchronize(device)
            ms = (time.perf_counter() - start) * 1e3
            losses.append(loss.item())
            timed = step >= args.warmup
            index, count = (step - args.warmup + 1, args.steps) if timed else (step + 1,
                                                                                args.warmup)
            print(f"torch_gpu_step.py: {label} {'step' if timed else 'warmup'} {index}/{count}: "
                  f"{ms:.2f} ms, loss {losses[-1]:.4f}", file=sys.stderr)
            if timed:
                step_ms.append(ms)
        peak_gib = (torch.cuda.max_memory_reserved(device) / 2**30
                    if args.device == "cuda" else None)
        return dict(status="ok", reason="", median_ms=statistics.median(step_ms),
                    min_ms=min(step_ms), peak_mem_gib=peak_gib, first_loss=losses[0],
                    last_loss=losses[-1])
    except Exception as error:  # CUDA out of memory, a cuBLAS failure, torch.compile's errors
        lines = str(error).splitlines() or [type(error).__name__]
        return dict(status="failed", reason=f"{type(error).__name__}: {lines[0]}")
    finally:
        del model, step_model, optimizer
        gc.collect()
        if args.device == "cuda" and torch.cuda.is_available():
            torch.cuda.empty_cache()


def parse_args():
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="Exit status: 0 every row ran; 3 some rows skipped (no CUDA device, torch too "
               "old for sdpa or compile) and none failed; 2 bad arguments; 1 a row failed while "
               "it ran.")
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--precision", default="",
                        help="comma list of fp32, tf32 (cuda only), bf16; one row each. "
                             "Default: fp32,tf32,bf16 on cuda, fp32 on cpu")
    parser.add_argument("--model", default="gpt2", choices=sorted(MODELS),
                        help="gpt2: GPT-2 124M (L=12, NH=12, C=768, V=50257 padded to 50304, "
                             "maxT=1024); tiny: L=2, NH=4, C=128, V=512, maxT=64")
    parser.add_argument("--batch", type=int, default=0,
                        help="sequences per step B; 0 = 16 on cuda, 4 on cpu")
    parser.add_argument("--seq", type=int, default=0,
                        help="tokens per sequence T, 1..context; 0 = the context length")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps per row first")
    parser.add_argument("--steps", type=int, default=10, help="timed steps per row")
    parser.add_argument("--engines", default="eager",
                        help="comma list of eager, sdpa (F.scaled_dot_product_attention), "
                             "compile (the sdpa model under torch.compile); one row each per "
                             "precision")
    parser.add_argument("--peak_tflops", default="",
                        help="dense peak TFLOP/s for MFU, one per --precision in its order. "
                             "Default on cuda: H100/H200 SXM, fp32 67, tf32 495, bf16 989; "
                             "on cpu: none (MFU n/a)")
    parser.add_argument("--threads", type=int, default=0, help="cpu: torch threads; 0: default")
    parser.add_argument("--output", default="table", choices=("table", "json"))
    args = parser.parse_args()

    cfg = MODELS[args.model]
    args.precisions = (args.precision or ("fp32,tf32,bf16" if args.device == "cuda"
                                          else "fp32")).split(",")
    for p in args.precisions:
        if p not in PRECISIONS:
            parser.error(f"--precision: unknown precision '{p}' (fp32, tf32, bf16)")
        if p == "tf32" and args.device != "cuda":
            parser.error("--precision tf32 needs --device cuda (tf32 is a tensor-core format)")
    if len(set(args.precisions)) != len(args.precisions):
        parser.error("--precision lists a precision twice")
    args.engines = args.engines.split(",")
    for e in args.engines:
        if e not in ENGINES:
            parser.error(f"--engines: unknown engine '{e}' (eager, sdpa, compile)")
    if len(set(args.engines)) != len(args.engines):
        parser.error("--engines lists an engine twice")
    if args.peak_tflops:
        try:
            peaks = [float(x) for x in args.peak_tflops.split(",")]
        except ValueError:
            parser.error(f"--peak_tflops: '{args.peak_tflops}' is not a comma list of numbers")
        if len(peaks) != len(args.precisions) or not all(0 < x <= 1e6 for x in peaks):
            parser.error(f"--peak_tflops needs {len(args.precisions)} values in (0, 1e6]")
        args.peaks = peaks
    elif args.device == "cuda":
        args.peaks = [DEFAULT_CUDA_PEAK_TFLOPS[p] for p in args.precisions]
    else:
        args.peaks = [None] * len(args.precisions)
    if not 0 <= args.batch <= 65536:
        parser.error(f"--batch must be in [0, 65536], got {args.batch}")
    if not 0 <= args.seq <= cfg["context"]:
        parser.error(f"--seq must be in [0, {cfg['context']}], got {args.seq}")
    if not 0 <= args.warmup <= 10000 or not 1 <= args.steps <= 10000:
        parser.error("--warmup must be in [0, 10000] and --steps in [1, 10000]")
    if args.threads < 0:
        parser.error(f"--threads must be >= 0, got {args.threads}")
    args.batch = args.batch or (16 if args.device == "cuda" else 4)
    args.seq = args.seq or cfg["context"]
    return args, cfg


def main():
    args, cfg = parse_args()
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    n = num_params(cfg)
    fpt = flops_per_token(cfg, n, args.seq)
    tokens = args.batch * args.seq

    rows = []
    for precision, peak in zip(args.precisions, args.peaks):
        for name in args.engines:
            sdpa, compiled = ENGINES[name]
            engine = f"torch {args.device} {name}"
            row = run_row(args, cfg, precision, sdpa, compiled, f"{engine} {precision}")
            row.update(engine=engine, precision=precision, peak_tflops=peak)
            if row["status"] == "ok":
                row["tokens_per_s"] = tokens / (row["median_ms"] / 1e3)
                row["model_tflops"] = fpt * row["tokens_per_s"] / 1e12
                row["mfu"] = row["model_tflops"] / peak if peak else None
            else:
                print(f"torch_gpu_step.py: {engine} {precision} {row['status']}: "
                      f"{row['reason']}", file=sys.stderr)
            rows.append(row)

    cuda = f", CUDA {torch.version.cuda}" if args.device == "cuda" else ""
    if args.output == "json":
        print(json.dumps(dict(model=args.model, num_params=n, batch=args.batch, seq=args.seq,
                              warmup=args.warmup, steps=args.steps, flops_per_token=fpt,
                              torch=torch.__version__, timed=TIMED_NOTE, rows=rows)))
    else:
        c = cfg
        print(f"torch_gpu_step.py: {args.model} (L={c['layers']} NH={c['heads']} C={c['width']} "
              f"V={c['vocab']} Vp={c['padded_vocab']} maxT={c['context']}), {n} parameters, "
              f"B={args.batch} T={args.seq}, {args.warmup} warmup + {args.steps} timed steps, "
              f"torch {torch.__version__}{cuda}")
        print(f"Model FLOPs/token = 6 N + 12 L C T = {fpt:.4g} (nanoGPT/PaLM estimate).")
        print(TIMED_NOTE)
        print()
        print("| engine | precision | B x T | median ms | min ms | tokens/s | TFLOP/s | MFU | "
              "peak mem GiB | status |")
        print("|---|---|---|---|---|---|---|---|---|---|")
        shape = f"{args.batch} x {args.seq}"
        for r in rows:
            if r["status"] != "ok":
                reason = r["reason"].replace("|", "/")
                print(f"| {r['engine']} | {r['precision']} | {shape} | - | - | - | - | - | - | "
                      f"{r['status']}: {reason} |")
                continue
            mfu = f"{100 * r['mfu']:.1f}% of {r['peak_tflops']:g}" if r["mfu"] else "n/a"
            mem = f"{r['peak_mem_gib']:.2f}" if r["peak_mem_gib"] is not None else "n/a"
            print(f"| {r['engine']} | {r['precision']} | {shape} | {r['median_ms']:.2f} | "
                  f"{r['min_ms']:.2f} | {r['tokens_per_s']:.0f} | {r['model_tflops']:.3g} | "
                  f"{mfu} | {mem} | ok |")
    sys.stdout.flush()
    if any(r["status"] == "failed" for r in rows):
        return 1
    if any(r["status"] == "skipped" for r in rows):
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
