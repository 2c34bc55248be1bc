#!/usr/bin/env python3
"""A GPT-2 written with Hugging Face's module and parameter names, for
tests/unit/model/initial_weights_test.cc.

The model mirrors transformers' GPT2LMHeadModel (Conv1D weights stored
(in, out), c_attn's outputs split into q, k, v blocks with the heads
contiguous in each, tanh GELU ("gelu_new"), LayerNorm eps 1e-5, the LM head
tied to transformer.wte) without importing transformers: only the standard
library, numpy and torch (Debian's python3-torch, torch 1.13 API); the
config reader is gpt_reference.py's, beside this script.

Usage: hf_gpt2_reference.py DIR, where DIR holds

  config.txt   "key value" lines: layers heads width vocab_size context_length
               batch time seed threads
  tokens.bin   int32 (2, B, T): inputs then targets

It draws the weights from `seed`, and writes to DIR

  hf.safetensors      the state dict as GPT2LMHeadModel.state_dict() gives
                      it: "transformer." names, the causal-mask buffers
                      attn.bias (BOOL) and attn.masked_bias (F32 scalar), and
                      lm_head.weight (equal to transformer.wte.weight)
  hub.safetensors     the same weights as files on the Hub often hold them:
                      no prefix, no buffers, no lm_head.weight
  untied.safetensors  hf.safetensors with lm_head.weight[3, 5] changed
  ref_logits.bin      float32 (B, T, vocab_size) logits
  ref_loss.bin        float64 mean cross-entropy of the targets

The safetensors files are written by hand (u64 little-endian header length,
JSON header, F32 little-endian data) with nothing but the format's
definition. Exit status 3 (with a message) when torch cannot be imported.
"""

import json
import math
import os
import struct
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# Exits 3 when torch or numpy is missing.
from gpt_reference import read_config  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402


class Conv1D(nn.Module):
    """transformers.pytorch_utils.Conv1D: a linear layer with weight (in, out)."""

    def __init__(self, nf, nx):
        super().__init__()
        self.nf = nf
        self.weight = nn.Parameter(torch.empty(nx, nf))
        self.bias = nn.Parameter(torch.zeros(nf))

    def forward(self, x):
        size_out = x.size()[:-1] + (self.nf,)
        x = torch.addmm(self.bias, x.view(-1, x.size(-1)), self.weight)
        return x.view(size_out)


class Attention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        n, C = cfg["context_length"], cfg["width"]
        self.heads = cfg["heads"]
        # The buffers older GPT-2 checkpoints carry (persistent, as then).
        self.register_buffer(
            "bias", torch.tril(torch.ones((n, n), dtype=torch.bool)).view(1, 1, n, n))
        self.register_buffer("masked_bias", torch.tensor(-1e4))
        self.c_attn = Conv1D(3 * C, C)
        self.c_proj = Conv1D(C, C)

    def split_heads(self, x):
        B, T, C = x.shape
        return x.view(B, T, self.heads, C // self.heads).permute(0, 2, 1, 3)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = self.split_heads(q), self.split_heads(k), self.split_heads(v)
        w = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(v.size(-1))
        mask = self.bias[:, :, :T, :T]
        w = torch.where(mask, w, torch.tensor(torch.finfo(w.dtype).min, dtype=w.dtype))
        w = F.softmax(w, dim=-1)
        a = torch.matmul(w, v).permute(0, 2, 1, 3).contiguous().view(B, T, C)
        return self.c_proj(a)


def gelu_new(x):
    """transformers.activations.NewGELUActivation."""
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


class MLP(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        C = cfg["width"]
        self.c_fc = Conv1D(4 * C, C)
        self.c_proj = Conv1D(C, 4 * C)

    def forward(self, x):
        return self.c_proj(gelu_new(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        C = cfg["width"]
        self.ln_1 = nn.LayerNorm(C, eps=1e-5)
        self.attn = Attention(cfg)
        self.ln_2 = nn.LayerNorm(C, eps=1e-5)
        self.mlp = MLP(cfg)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT2Model(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        C = cfg["width"]
        self.wte = nn.Embedding(cfg["vocab_size"], C)
        self.wpe = nn.Embedding(cfg["context_length"], C)
        self.h = nn.ModuleList([Block(cfg) for _ in range(cfg["layers"])])
        self.ln_f = nn.LayerNorm(C, eps=1e-5)

    def forward(self, idx):
        T = idx.size(1)
        x = self.wte(idx) + self.wpe(torch.arange(T))
        for block in self.h:
            x = block(x)
        return self.ln_f(x)


class GPT2LMHeadModel(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.transformer = GPT2Model(cfg)
        self.lm_head = nn.Linear(cfg["width"], cfg["vocab_size"], bias=False)
        self.lm_head.weight = self.transformer.wte.weight  # tied

    def forward(self, idx):
        return self.lm_head(self.transformer(idx))


def initialise(model, cfg, seed):
    """Random weights from `seed`; biases and LayerNorms random too, so that a
    mixed-up bias or LayerNorm parameter changes the logits."""
    generator = torch.Generator().manual_seed(seed)
    residual_std = 0.02 / math.sqrt(2 * cfg["layers"])
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=generator)
            if "ln_" in name and name.endswith(".weight"):
                p.copy_(1.0 + 0.2 * noise)
            elif name.endswith(".bias"):
                p.copy_(0.05 * noise)
            elif name.endswith("c_proj.weight"):
                p.copy_(residual_std * noise)
            elif name.endswith(("wte.weight", "wpe.weight")):
                # Larger than GPT-2's 0.02, so that the logits spread and the
                # loss is not just about ln(vocab_size).
                p.copy_(0.2 * noise)
            else:
                p.copy_(0.02 * noise)


def write_safetensors(path, tensors, metadata):
    header = {"__metadata__": metadata}
    blobs, offset = [], 0
    for name, t in tensors.items():
        t = t.detach().contiguous()
        if t.dtype == torch.float32:
            dtype, data = "F32", t.numpy().astype("<f4").tobytes()
        elif t.dtype == torch.bool:
            dtype, data = "BOOL", t.numpy().astype(np.uint8).tobytes()
        else:
            raise ValueError(f"{name}: {t.dtype}")
        header[name] = {"dtype": dtype, "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for data in blobs:
            f.write(data)


def main():
    if len(sys.argv) != 2:
        print("usage: hf_gpt2_reference.py DIR", file=sys.stderr)
        return 2
    work = sys.argv[1]
    cfg = read_config(os.path.join(work, "config.txt"))
    torch.set_num_threads(cfg["threads"])
    B, T, V = cfg["batch"], cfg["time"], cfg["vocab_size"]
    tokens = torch.from_numpy(
        np.fromfile(os.path.join(work, "tokens.bin"), dtype=np.int32).astype(np.int64)
    ).view(2, B, T)

    model = GPT2LMHeadModel(cfg)
    initialise(model, cfg, cfg["seed"])
    state = model.state_dict()
    metadata = {"format": "pt"}
    write_safetensors(os.path.join(work, "hf.safetensors"), state, metadata)
    hub = {name[len("transformer."):]: t for name, t in state.items()
           if name.startswith("transformer.") and not name.endswith((".attn.bias", ".attn.masked_bias"))}
    write_safetensors(os.path.join(work, "hub.safetensors"), hub, metadata)
    untied = dict(state)
    untied["lm_head.weight"] = state["lm_head.weight"].clone()
    untied["lm_head.weight"][3, 5] += 1.0
    write_safetensors(os.path.join(work, "untied.safetensors"), untied, metadata)

    with torch.no_grad():
        logits = model(tokens[0])
        loss = F.cross_entropy(logits.reshape(-1, V), tokens[1].reshape(-1))
    logits.numpy().astype("<f4").tofile(os.path.join(work, "ref_logits.bin"))
    np.array([loss.item()], dtype="<f8").tofile(os.path.join(work, "ref_loss.bin"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
