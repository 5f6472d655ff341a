"""Batches of the chat fine-tunes: chat examples learned on their replies only, and code windows of the corpus."""

from __future__ import annotations

import random

import torch


def pad_examples(picked: list[tuple[list[int], list[int]]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(input ids, labels)`` pairs padded to the longest: ([B, T] inputs, [B, T] next-token labels, -100 where
    nothing is learned)."""
    width = max(len(ids) for ids, _ in picked)
    ids = torch.full((len(picked), width), pad, dtype=torch.long)
    labels = torch.full((len(picked), width), -100, dtype=torch.long)
    for i, (x, y) in enumerate(picked):
        ids[i, :len(x)] = torch.tensor(x)
        labels[i, :len(y) - 1] = torch.tensor(y[1:])  # NOTE: position t predicts token t + 1
    return ids, labels


def chat_batch(examples, rng: random.Random, size: int, pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``size`` examples drawn at random, padded to the longest: ([B, T] inputs, [B, T] labels)."""
    return pad_examples([examples[rng.randrange(len(examples))] for _ in range(size)], pad)


def code_batch(tokens: torch.Tensor, rng: random.Random, size: int, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``size`` windows of ``seq_len`` tokens at random starts of the corpus: ([B, T] inputs, [B, T] labels)."""
    starts = [rng.randrange(len(tokens) - seq_len - 1) for _ in range(size)]
    windows = torch.stack([tokens[s:s + seq_len + 1] for s in starts])  # [B, T + 1]
    return windows[:, :-1], windows[:, 1:]


def length_batches(examples, rng: random.Random, size: int) -> list[list]:
    """The examples in batches of ``size`` of similar lengths (little padding), the batches in random order."""
    ordered = sorted(examples, key=lambda e: len(e[0]))
    batches = [ordered[i:i + size] for i in range(0, len(ordered) - size + 1, size)]
    rng.shuffle(batches)
    return batches
