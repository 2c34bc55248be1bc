#!/usr/bin/env python3
"""PyTorch reference for Cohort's GPT (worker/model) and its optimizer step.

Used by tests/unit/model/gpt_torch_test.cc, which writes a directory with

  config.txt   "key value" lines: layers heads width vocab_size context_length
               padded_vocab batch time steps max_lr min_lr warmup_steps
               total_steps beta1 beta2 eps weight_decay grad_clip threads
  params.bin   float32, the flat parameter arena in ParameterTable order
  tokens.bin   int32, (steps, 2, B, T): inputs then targets for each step

and runs `python3 gpt_reference.py DIR`. This script builds the same model in
PyTorch (float32, CPU, torch 1.13 API), runs `steps` training steps (forward,
backward, clip_grad_norm_, AdamW with the warmup + cosine schedule) and writes

  ref_logits.bin   float32 (B, T, Vp) logits of step 0
  ref_grads.bin    float32 flat gradients of step 0 (before clipping)
  ref_params.bin   float32 flat parameters after all steps
  ref_losses.bin   float64 (steps) mean loss of each step
  ref_norms.bin    float64 (steps) gradient norm of each step (before clipping)

Exit status 3 (with a message) when torch cannot be imported.
"""

import math
import os
import sys

try:
    import numpy as np
    import torch
    import torch.nn.functional as F
except ImportError as error:  # the C++ test turns this into a failure
    # Named after the script that was run: sample_reference.py and
    # hf_gpt2_reference.py import this module for its torch check.
    print(f"{os.path.basename(sys.argv[0])}: cannot import torch/numpy ({error}); "
          "run `tools/dev deps` to install python3-torch", file=sys.stderr)
    sys.exit(3)


def read_config(path):
    config = {}
    with open(path) as f:
        for line in f:
            if line.strip():
                key, value = line.split()
                config[key] = float(value) if "." in value or "e" in value else int(value)
    return config


def table(cfg):
    """(name, shape, weight_decay) in ParameterTable order."""
    L, C = cfg["layers"], cfg["width"]
    return [
        ("wte", (cfg["padded_vocab"], C), True),
        ("wpe", (cfg["context_length"], C), True),
        ("ln1w", (L, C), False), ("ln1b", (L, C), False),
        ("qkvw", (L, 3 * C, C), True), ("qkvb", (L, 3 * C), False),
        ("attprojw", (L, C, C), True), ("attprojb", (L, C), False),
        ("ln2w", (L, C), False), ("ln2b", (L, C), False),
        ("fcw", (L, 4 * C, C), True), ("fcb", (L, 4 * C), False),
        ("fcprojw", (L, C, 4 * C), True), ("fcprojb", (L, C), False),
        ("lnfw", (C,), False), ("lnfb", (C,), False),
    ]


def unflatten(flat, cfg):
    params, offset = {}, 0
    for name, shape, _ in table(cfg):
        n = math.prod(shape)
        params[name] = torch.nn.Parameter(flat[offset:offset + n].clone().view(shape))
        offset += n
    assert offset == flat.numel(), (offset, flat.numel())
    return params


def flatten(tensors, cfg):
    return torch.cat([tensors[name].reshape(-1) for name, _, _ in table(cfg)])


def forward(P, cfg, idx, targets):
    B, T = idx.shape
    L, NH, C, V = cfg["layers"], cfg["heads"], cfg["width"], cfg["vocab_size"]
    hs = C // NH
    mask = torch.tril(torch.ones(T, T, dtype=torch.bool))
    x = P["wte"][idx] + P["wpe"][:T]
    for l in range(L):
        h = F.layer_norm(x, (C,), P["ln1w"][l], P["ln1b"][l], eps=1e-5)
        qkv = F.linear(h, P["qkvw"][l], P["qkvb"][l])
        q, k, v = qkv.split(C, dim=2)
        q = q.view(B, T, NH, hs).transpose(1, 2)
        k = k.view(B, T, NH, hs).transpose(1, 2)
        v = v.view(B, T, NH, hs).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
        att = att.masked_fill(~mask, float("-inf"))
        att = F.softmax(att, dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        x = x + F.linear(y, P["attprojw"][l], P["attprojb"][l])
        h = F.layer_norm(x, (C,), P["ln2w"][l], P["ln2b"][l], eps=1e-5)
        h = F.gelu(F.linear(h, P["fcw"][l], P["fcb"][l]), approximate="tanh")
        x = x + F.linear(h, P["fcprojw"][l], P["fcprojb"][l])
    x = F.layer_norm(x, (C,), P["lnfw"], P["lnfb"], eps=1e-5)
    logits = F.linear(x, P["wte"])  # tied LM head over all Vp rows
    loss = F.cross_entropy(logits[:, :, :V].reshape(-1, V), targets.reshape(-1))
    return logits, loss


def learning_rate(cfg, step):
    """The schedule documented in worker/train/lr_schedule.h."""
    max_lr, min_lr = cfg["max_lr"], cfg["min_lr"]
    warmup, total = cfg["warmup_steps"], cfg["total_steps"]
    if step < warmup:
        return max_lr * (step + 1) / warmup
    if step >= total:
        return min_lr
    ratio = (step - warmup) / (total - warmup)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (max_lr - min_lr)


def main():
    if len(sys.argv) != 2:
        print("usage: gpt_reference.py DIR", file=sys.stderr)
        return 2
    work = sys.argv[1]
    cfg = read_config(os.path.join(work, "config.txt"))
    torch.set_num_threads(cfg["threads"])
    torch.manual_seed(0)  # nothing random is drawn; fixed anyway
    B, T, steps = cfg["batch"], cfg["time"], cfg["steps"]

    flat = torch.from_numpy(np.fromfile(os.path.join(work, "params.bin"), dtype=np.float32))
    P = unflatten(flat, cfg)
    tokens = torch.from_numpy(
        np.fromfile(os.path.join(work, "tokens.bin"), dtype=np.int32).astype(np.int64)
    ).view(steps, 2, B, T)

    decay = [P[name] for name, _, d in table(cfg) if d]
    no_decay = [P[name] for name, _, d in table(cfg) if not d]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": cfg["weight_decay"]},
         {"params": no_decay, "weight_decay": 0.0}],
        lr=cfg["max_lr"], betas=(cfg["beta1"], cfg["beta2"]), eps=cfg["eps"], foreach=False)
    all_params = [P[name] for name, _, _ in table(cfg)]

    losses, norms = [], []
    for step in range(steps):
        lr = learning_rate(cfg, step)
        for group in optimizer.param_groups:
            group["lr"] = lr
        optimizer.zero_grad(set_to_none=False)
        logits, loss = forward(P, cfg, tokens[step, 0], tokens[step, 1])
        loss.backward()
        if step == 0:
            logits.detach().numpy().astype(np.float32).tofile(os.path.join(work, "ref_logits.bin"))
            grads = {name: P[name].grad for name, _, _ in table(cfg)}
            flatten(grads, cfg).numpy().astype(np.float32).tofile(
                os.path.join(work, "ref_grads.bin"))
        norm = torch.nn.utils.clip_grad_norm_(all_params, cfg["grad_clip"])
        optimizer.step()
        losses.append(loss.item())
        norms.append(float(norm))

    with torch.no_grad():
        flatten(P, cfg).numpy().astype(np.float32).tofile(os.path.join(work, "ref_params.bin"))
    np.array(losses, dtype=np.float64).tofile(os.path.join(work, "ref_losses.bin"))
    np.array(norms, dtype=np.float64).tofile(os.path.join(work, "ref_norms.bin"))
    print(f"gpt_reference.py: torch {torch.__version__}, losses {losses}, norms {norms}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
