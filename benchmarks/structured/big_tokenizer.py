"""A byte-level BPE tokenizer with Qwen3's vocabulary size (151,936 ids), for benchmarks of grammar masks.

No real checkpoint can be downloaded here, and a grammar's mask cost grows with the vocabulary, so the
benchmarks train one on Python's own sources: 151,643 BPE tokens plus Qwen's special tokens.

    python benchmarks/structured/big_tokenizer.py OUT_DIR     (a few minutes on 2 cores)
"""

from __future__ import annotations

import argparse
import sysconfig
from pathlib import Path

QWEN_VOCAB = 151_936
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>", "<think>", "</think>"]


def corpus(limit_bytes: int):
    """Python sources of the standard library and site-packages, up to ``limit_bytes``."""
    seen = 0
    for root in (sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["purelib"]):
        for path in sorted(Path(root).rglob("*.py")):
            try:
                text = path.read_text(encoding="utf-8")
            except (UnicodeDecodeError, OSError):
                continue
            seen += len(text)
            yield text
            if seen >= limit_bytes:
                return


def train(out: Path, vocab_size: int = QWEN_VOCAB - 293, limit_bytes: int = 120_000_000) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS, min_frequency=2,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(corpus(limit_bytes), trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    out.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(out)
    print(f"{len(fast)} tokens -> {out}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--limit-bytes", type=int, default=120_000_000)
    a = ap.parse_args()
    train(a.out, limit_bytes=a.limit_bytes)
