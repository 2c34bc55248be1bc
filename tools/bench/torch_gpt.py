"""The GPT-2 of tools/bench's PyTorch baselines (torch_train_bench.py,
torch_gpu_step.py), written like Cohort's worker/model: token + position
embedding, pre-LN blocks of causal self-attention and a tanh-GELU MLP, a final
LayerNorm, an LM head tied to the token embedding over all Vp (padded) rows,
cross-entropy over the first V columns (in fp32, also under autocast).

Attention is an explicit q @ k^T, masked softmax, @ v, as Cohort's kernels
compute it; sdpa=True uses F.scaled_dot_product_attention(is_causal=True)
instead (torch >= 2.0).
"""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, width, heads, sdpa):
        super().__init__()
        self.heads = heads
        self.sdpa = sdpa
        self.ln1 = nn.LayerNorm(width, eps=1e-5)
        self.qkv = nn.Linear(width, 3 * width)
        self.attproj = nn.Linear(width, width)
        self.ln2 = nn.LayerNorm(width, eps=1e-5)
        self.fc = nn.Linear(width, 4 * width)
        self.fcproj = nn.Linear(4 * width, width)

    def attention(self, q, k, v, mask):
        if self.sdpa:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
        T = q.shape[2]
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(q.shape[-1]))
        att = F.softmax(att.masked_fill(mask[:T, :T], float("-inf")), dim=-1)
        return att @ v

    def forward(self, x, mask):
        B, T, C = x.shape
        hs = C // self.heads
        q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
        q = q.view(B, T, self.heads, hs).transpose(1, 2)
        k = k.view(B, T, self.heads, hs).transpose(1, 2)
        v = v.view(B, T, self.heads, hs).transpose(1, 2)
        y = self.attention(q, k, v, mask).transpose(1, 2).contiguous().view(B, T, C)
        x = x + self.attproj(y)
        return x + self.fcproj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class Gpt(nn.Module):
    def __init__(self, cfg, sdpa=False):
        super().__init__()
        self.vocab = cfg["vocab"]
        self.wte = nn.Embedding(cfg["padded_vocab"], cfg["width"])
        self.wpe = nn.Embedding(cfg["context"], cfg["width"])
        self.blocks = nn.ModuleList(Block(cfg["width"], cfg["heads"], sdpa)
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
        return F.cross_entropy(logits[:, :, :self.vocab].reshape(-1, self.vocab).float(),
                               targets.reshape(-1))
