"""The tiny Qwen3 config, its optimizer and residual dropout."""

from __future__ import annotations

import argparse
import contextlib

import torch
import torch.nn.functional as F

from demo_model.constants import VOCAB_MULTIPLE


def round_up(n: int, multiple: int) -> int:
    """Smallest multiple of ``multiple`` that is >= ``n``."""
    return (n + multiple - 1) // multiple * multiple


def build_config(args: argparse.Namespace, tokenizer):
    """The Qwen3 config: tied embeddings, GQA, vocab padded to a multiple of 64."""
    from transformers import Qwen3Config

    return Qwen3Config(
        vocab_size=round_up(len(tokenizer), VOCAB_MULTIPLE),
        hidden_size=args.hidden_size,
        intermediate_size=args.intermediate_size,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads,
        head_dim=args.head_dim,
        max_position_embeddings=2048,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )


def count_parameters(model) -> tuple[int, int]:
    """(all parameters with tied weights counted once, parameters outside the embedding)."""
    total = sum(p.numel() for p in model.parameters())
    return total, total - model.get_input_embeddings().weight.numel()


def make_optimizer(model, args: argparse.Namespace, device: torch.device) -> torch.optim.AdamW:
    """AdamW; weight decay on matrices (incl. the tied embedding), none on norm gains."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": args.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=args.lr, betas=(0.9, 0.95), eps=1e-8, fused=device.type == "cuda")


def add_residual_dropout(model, p: float) -> list:
    """Dropout on every attention and MLP output before it joins the residual stream.

    Qwen3 has no such dropout of its own; forward hooks add it for training only (they act only
    in ``train()`` mode and are not part of the saved checkpoint). Returns the hook handles.
    """

    def hook(module, inputs, output):
        if not module.training or p == 0:
            return output
        if isinstance(output, tuple):  # attention returns (output, weights)
            return (F.dropout(output[0], p, training=True), *output[1:])
        return F.dropout(output, p, training=True)

    layers = model.model.layers
    return [m.register_forward_hook(hook) for layer in layers for m in (layer.self_attn, layer.mlp)]


def autocast_for(device: torch.device):
    """bf16 autocast on CUDA; plain float32 elsewhere."""
    if device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def sync(device: torch.device) -> None:
    """Wait for queued GPU work so that wall-clock timings are real."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
