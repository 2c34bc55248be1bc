#!/usr/bin/env python3
"""Greedy generation with the PyTorch reference GPT, for cohort-sample's sampler.

Used by tests/unit/sample/sample_torch_test.cc, which writes a directory with

  config.txt   "key value" lines: layers heads width vocab_size context_length
               padded_vocab tokens
  params.bin   float32, the flat parameter arena in ParameterTable order
  prompt.bin   int32, the prompt's token ids

and runs `python3 sample_reference.py DIR`. The model is gpt_reference.py's
(table(), unflatten(), forward()). Each of `tokens` steps runs the model over
the last context_length tokens and appends the argmax of the last position's
logits over the real vocabulary (ids < vocab_size; torch.argmax gives the
first maximum, the lowest id). Writes

  ref_tokens.bin   int32 (tokens) the generated ids
  ref_logits.bin   float32 (padded_vocab) the last position's logits of step 0
  ref_gaps.bin     float64 (tokens) the largest logit minus the second largest
                   at each step: how far each choice is from a tie

Exit status 3 (with a message) when torch cannot be imported.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# Exits 3 when torch or numpy is missing.
from gpt_reference import forward, read_config, unflatten  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402


def main():
    if len(sys.argv) != 2:
        print("usage: sample_reference.py DIR", file=sys.stderr)
        return 2
    work = sys.argv[1]
    cfg = read_config(os.path.join(work, "config.txt"))
    torch.set_num_threads(1)
    V, T, steps = cfg["vocab_size"], cfg["context_length"], cfg["tokens"]
    flat = torch.from_numpy(np.fromfile(os.path.join(work, "params.bin"), dtype=np.float32))
    P = unflatten(flat, cfg)
    tokens = np.fromfile(os.path.join(work, "prompt.bin"), dtype=np.int32).astype(np.int64).tolist()
    generated, gaps = [], []
    with torch.no_grad():
        for step in range(steps):
            idx = torch.tensor([tokens[-T:]], dtype=torch.int64)
            logits, _ = forward(P, cfg, idx, torch.zeros_like(idx))
            last = logits[0, -1]
            if step == 0:
                last.numpy().astype(np.float32).tofile(os.path.join(work, "ref_logits.bin"))
            real = last[:V]
            top = torch.topk(real, 2).values
            gaps.append(float(top[0] - top[1]))
            token = int(torch.argmax(real))
            generated.append(token)
            tokens.append(token)
    np.array(generated, dtype=np.int32).tofile(os.path.join(work, "ref_tokens.bin"))
    np.array(gaps, dtype=np.float64).tofile(os.path.join(work, "ref_gaps.bin"))
    print(f"sample_reference.py: torch {torch.__version__}, {steps} tokens, "
          f"smallest top-2 gap {min(gaps):.3g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
