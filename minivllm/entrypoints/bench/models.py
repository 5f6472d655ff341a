"""Model names for benchmarks: configs shipped with the package (dummy weights) or checkpoint folders.

``configs/<name>/config.json`` beside this file holds the published ``config.json`` of a few public models
(no weights, no tokenizer), and ``tiny-qwen3`` and ``tiny-qwen3-moe`` (8 experts, top-2), made-up 2-layer models
for quick CPU runs.
``--model qwen3-0.6b`` resolves to that folder and the engine then defaults to ``load_format="dummy"``
(random weights of the right shapes); prompts are token ids.
"""

from __future__ import annotations

import os
from pathlib import Path

CONFIGS_DIR = Path(__file__).resolve().parent / "configs"
# Aliases -> shipped folder name (matched case-insensitively, after dropping an "org/" prefix).
ALIASES = {
    "qwen3-0.6b": "qwen3-0.6b",
    "qwen3-8b": "qwen3-8b",
    "qwen3-32b": "qwen3-32b",
    "llama-3.1-8b": "llama-3.1-8b",
    "llama-3.1-8b-instruct": "llama-3.1-8b",
    "meta-llama-3.1-8b": "llama-3.1-8b",
    "meta-llama-3.1-8b-instruct": "llama-3.1-8b",
    "tiny-qwen3": "tiny-qwen3",
    "qwen3-30b-a3b": "qwen3-30b-a3b",
    "tiny-qwen3-moe": "tiny-qwen3-moe",
    "mistral-7b-v0.1": "mistral-7b-v0.1",
    "mistral-7b": "mistral-7b-v0.1",
    "mistral-small-24b": "mistral-small-24b",
    "mistral-small-24b-base-2501": "mistral-small-24b",
    "mistral-small-24b-instruct-2501": "mistral-small-24b",
    "gpt-oss-20b": "gpt-oss-20b",
    "gpt-oss-120b": "gpt-oss-120b",
    **{f"gemma-3-{size}{tail}": f"gemma-3-{size}" for size in ("1b", "4b", "12b", "27b") for tail in ("", "-it", "-pt")},
}


def shipped_models() -> list[str]:
    """Names of the shipped config folders."""
    return sorted(p.name for p in CONFIGS_DIR.iterdir() if (p / "config.json").is_file())


def canonical_name(name_or_path: str) -> str | None:
    """``"Qwen/Qwen3-0.6B"`` or ``"/ckpt/Qwen3-0.6B"`` -> ``"qwen3-0.6b"``; None if not a known model."""
    base = os.path.basename(os.path.normpath(str(name_or_path))).lower()
    return ALIASES.get(base)


def resolve_model(name_or_path: str) -> tuple[str, str | None]:
    """Return ``(path, load_format_hint)``.

    An existing folder is used as is (hint ``None``: the engine's default, unless it has a
    ``config.json`` but no ``*.safetensors``, then ``"dummy"``). Otherwise the name is looked up
    among the shipped configs and the hint is ``"dummy"``. Raises ValueError when neither works.
    """
    p = Path(name_or_path).expanduser()
    if p.is_dir():
        has_weights = any(p.glob("*.safetensors"))
        return str(p), (None if has_weights or not (p / "config.json").is_file() else "dummy")
    key = str(name_or_path).lower()
    folder = ALIASES.get(key) or ALIASES.get(key.rsplit("/", 1)[-1]) or key.rsplit("/", 1)[-1]
    if (CONFIGS_DIR / folder / "config.json").is_file():
        return str(CONFIGS_DIR / folder), "dummy"
    raise ValueError(f"model {name_or_path!r} is neither a folder nor a shipped config; known: "
                     f"{', '.join(shipped_models())}")
