"""The training text (the Python standard library, some packages held out) and its BPE tokenizer."""

from __future__ import annotations

import json
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path

import torch

from demo_model.constants import CHAT_TEMPLATE, EOS_TOKEN, EXCLUDED_DIRS, HELD_OUT_PACKAGES, SPECIAL_TOKENS


@dataclass
class Corpus:
    """Source files of the stdlib, split into a training part and a held-out part."""

    root: Path
    train_files: list[Path]
    held_files: list[Path]
    train_texts: list[str] = field(repr=False)
    held_texts: list[str] = field(repr=False)


def stdlib_root() -> Path:
    """The directory of the running Python's standard library."""
    return Path(sysconfig.get_paths()["stdlib"])


def is_held_out(rel: Path) -> bool:
    """Whether a stdlib file (path relative to the stdlib root) belongs to a held-out package."""
    return len(rel.parts) > 1 and rel.parts[0] in HELD_OUT_PACKAGES


def collect_files(root: Path) -> tuple[list[Path], list[Path]]:
    """All usable ``*.py`` files under ``root`` in sorted order, split into (train, held-out)."""
    train, held = [], []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if EXCLUDED_DIRS.intersection(rel.parts[:-1]):
            continue
        (held if is_held_out(rel) else train).append(path)
    return train, held


def read_texts(paths: list[Path]) -> tuple[list[Path], list[str]]:
    """Read files as UTF-8 and drop the empty ones; returns the kept paths and their texts."""
    kept, texts = [], []
    for path in paths:
        text = path.read_text(encoding="utf-8", errors="replace")
        if text.strip():
            kept.append(path)
            texts.append(text)
    return kept, texts


def load_corpus(max_files: int | None = None) -> Corpus:
    """Collect and read the training and held-out stdlib sources (optionally only a few files)."""
    root = stdlib_root()
    train, held = collect_files(root)
    if max_files is not None:
        train, held = train[:max_files], held[: max(1, max_files // 10)]
    train, train_texts = read_texts(train)
    held, held_texts = read_texts(held)
    if not train or not held:
        raise RuntimeError(f"no training or held-out files found under {root}")
    return Corpus(root, train, held, train_texts, held_texts)


def train_tokenizer(texts: list[str], vocab_size: int):
    """Train a byte-level BPE on ``texts`` and wrap it as a ``PreTrainedTokenizerFast``.

    The BPE trainer is deterministic for a given input order. ``<|endoftext|>`` is both eos and
    pad; there is no bos. Decoding never "cleans up" spaces, so code round-trips exactly.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(texts, trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token=EOS_TOKEN,
        pad_token=EOS_TOKEN,
        additional_special_tokens=list(SPECIAL_TOKENS[1:]),  # transformers 5 renames it extra_special_tokens
        clean_up_tokenization_spaces=False,
        model_max_length=2048,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def save_tokenizer(tokenizer, out: Path) -> None:
    """``save_pretrained`` plus a tokenizer_config that transformers 4.x can read too."""
    tokenizer.save_pretrained(out)
    path = out / "tokenizer_config.json"
    cfg = json.loads(path.read_text())
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    if "extra_special_tokens" in cfg:
        cfg["additional_special_tokens"] = cfg.pop("extra_special_tokens")
    path.write_text(json.dumps(cfg, indent=2) + "\n")


def encode_stream(tokenizer, texts: list[str]) -> torch.Tensor:
    """Tokenize every file and concatenate them, each followed by ``<|endoftext|>`` (int64 1-D)."""
    eos = tokenizer.eos_token_id
    ids: list[int] = []
    for enc in tokenizer.backend_tokenizer.encode_batch(texts, add_special_tokens=False):
        ids.extend(enc.ids)
        ids.append(eos)
    return torch.tensor(ids, dtype=torch.long)
