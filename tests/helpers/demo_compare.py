"""Greedy generation of the demo model against transformers, explaining every divergence.

In bf16 the logits are coarse (one ulp is 0.0625 at 11 and 0.125 at 16), so two candidates can be
exactly tied in transformers' own logits, and which one argmax picks then depends on rounding
noise. A divergence is accepted only if it is such a near-tie in transformers' own logits: the two
candidates at most ``max_ulps`` ulps of the logit's magnitude apart in ``dtype`` (2 by default: each
implementation rounds its logits once, and the GPU kernels contract multiply-adds differently). A
real bug moves logits by far more than that, and early. A prompt "matches" when all its tokens
are identical.

transformers' model, tokenizer and generations are cached per process (by path, dtype, device, prompt and
length), so no test session computes the same reference twice.
"""

import math
from functools import cache, lru_cache

import torch

PROMPTS = [
    "def fibonacci(n):", "import os\n", "class Stack:", "for i in range(", "def main():\n    ",
    "with open(path) as f:", "try:\n    import json\nexcept", "    def __init__(self, name):",
    "if __name__ == '__main__':\n", "    def __repr__(self):\n", "from __future__ import annotations\n",
    "import sys\n\n\ndef ", "    return self.", "class Error(Exception):\n", "    @property\n    def ",
    "        raise ValueError(",
]


@lru_cache(maxsize=2)
def _tokenizer(path: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


@lru_cache(maxsize=2)
def _model(path: str, dtype: torch.dtype, device: str):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device).eval()


@cache
def _reference(path: str, prompt: str, dtype: torch.dtype, device: str, new: int) -> tuple[tuple[int, ...], ...]:
    """(prompt ids, transformers' greedy ``new`` tokens)."""
    x = _tokenizer(path)(prompt, return_tensors="pt").input_ids.to(device)
    with torch.no_grad():
        ref = _model(path, dtype, device).generate(x, max_new_tokens=new, min_new_tokens=new, do_sample=False,
                                                    eos_token_id=None, pad_token_id=0)[0, x.shape[1]:].tolist()
    return tuple(x[0].tolist()), tuple(ref)


def compare_with_transformers(path: str, ours: list[list[int]], device: str, dtype=torch.bfloat16, new=32,
                              max_ulps: float = 2.0):
    """Returns (number of prompts whose tokens all match, list of non-tie divergences)."""
    matches, bad = 0, []
    for prompt, got in zip(PROMPTS, ours):
        prompt_ids, ref = _reference(path, prompt, dtype, device, new)
        n = next((i for i, (a, b) in enumerate(zip(ref, got)) if a != b), None)
        if n is None:
            matches += 1
            continue
        ctx = torch.tensor([list(prompt_ids) + list(ref[:n])], device=device)
        with torch.no_grad():
            logits = _model(path, dtype, device)(ctx).logits[0, -1].float()  # [vocab], transformers' own logits
        a, b = logits[ref[n]].item(), logits[got[n]].item()
        mantissa_bits = {torch.bfloat16: 7, torch.float16: 10, torch.float32: 23}[dtype]
        ulp = 2.0 ** (math.floor(math.log2(max(abs(a), abs(b), 1e-30))) - mantissa_bits)
        if abs(a - b) > max_ulps * ulp:
            bad.append((prompt, n, ref[n], got[n], a, b))
    return matches, bad
