"""The demo model's held-out loss in bf16 and with FP8 weights quantized when loaded (the model card's figures).

    python scripts/fp8_heldout_loss.py [WINDOWS]      (default 40 windows of 512 tokens; ~1 min on 2 cores)

Held-out text: the standard library's email, json and xml packages, which the model never saw. Loss: the mean
negative log-likelihood of every token after the first of each window, from the engine's prompt logprobs.
"""

import glob
import os
import statistics
import sys
import sysconfig

from transformers import AutoTokenizer

from minivllm import LLM, SamplingParams

MODEL = os.path.join(os.path.dirname(__file__), "..", "models", "minivllm-demo-py")


def windows(n: int, width: int = 512) -> list[list[int]]:
    root = sysconfig.get_paths()["stdlib"]
    files = sorted(f for p in ("email", "json", "xml") for f in glob.glob(os.path.join(root, p, "**", "*.py"),
                                                                       recursive=True))
    tok, ids = AutoTokenizer.from_pretrained(MODEL), []
    for f in files:
        ids += tok.encode(open(f, encoding="utf-8").read())
    return [ids[i:i + width] for i in range(0, len(ids) - width, width)][:n]


if __name__ == "__main__":
    ws = windows(int(sys.argv[1]) if len(sys.argv) > 1 else 40)
    params = SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=0)
    for dtype, q in (("bfloat16", None), ("bfloat16", "fp8"), ("float32", None), ("float32", "fp8")):
        with LLM(MODEL, device="cpu", dtype=dtype, quantization=q, max_model_len=1024) as llm:
            outs = llm.generate(ws, params, use_tqdm=False)
        nll = [-o["prompt_logprobs"][j][w[j]].logprob for o, w in zip(outs, ws) for j in range(1, len(w))]
        print(f"{dtype:9} {q or 'none':5} {len(ws)} windows, {len(nll)} tokens: held-out loss {statistics.mean(nll):.4f}")
