"""MXFP4 experts of a mixture-of-experts layer (vLLM's ``Mxfp4MoEMethod``): a ``FusedMoE``'s ``w13_weight`` and
``w2_weight`` held packed, two e2m1 values a byte, with one e8m0 scale a group of 32 input columns
(``kernels/mxfp4.py``); no copy of the experts in the model's dtype.

Layer layout (what the kernels and the torch path read): ``w13_weight`` uint8 ``[E, 2 * I_rank, H / 2]`` (the
gate's rows, then the up's), ``w13_weight_scale`` uint8 ``[E, 2 * I_rank, H / 32]``, ``w2_weight`` uint8
``[E, H, I_rank / 2]``, ``w2_weight_scale`` uint8 ``[E, H, I_rank / 32]``.

Checkpoint layout (gpt-oss): ``mlp.experts.gate_up_proj_blocks`` ``[E, 2I, H / 32, 16]`` and
``gate_up_proj_scales`` ``[E, 2I, H / 32]``, whose rows interleave gate and up (row ``2i`` gate channel
``i``, row ``2i + 1`` up channel ``i``, transformers' ``gate_up[..., ::2]`` / ``[..., 1::2]``), and
``down_proj_blocks`` ``[E, H, I / 32, 16]`` / ``down_proj_scales`` ``[E, H, I / 32]``: one tensor for all the
experts. A tensor-parallel rank keeps its slice of each expert's intermediate dimension, as for FP8 experts:
whole groups of 32 of ``down``'s input columns, so ``I / tp`` must be a multiple of 32.
"""

from __future__ import annotations

import torch
from torch import nn

from minivllm.config.quantization import Mxfp4Config, mxfp4_config
from minivllm.kernels.mxfp4 import E8M0_BIAS, MXFP4_BLOCK, quantize_mxfp4

#: dummy MXFP4 experts' scale code: 2^-7, so that uniform random e2m1 codes (RMS about 2.9) give weights of
#: about ``init_dummy_weights``' 0.02 standard deviation
DUMMY_SCALE = E8M0_BIAS - 7


class Mxfp4MoEMethod:
    """How a ``FusedMoE`` holds MXFP4 experts (the layer's forward passes the packed weights and their scales
    to the kernels, which tell MXFP4 by the uint8 dtype)."""

    def __init__(self, config: Mxfp4Config):
        self.config = config
        self.dummy = False  # set by ``apply_mxfp4`` for dummy weights: packed experts get random codes

    def check_layer(self, layer: nn.Module) -> None:
        """ValueError unless ``layer``'s hidden size and this rank's intermediate size are whole groups."""
        hidden, inter = layer.w2_weight.shape[1], layer.intermediate_size_per_rank
        if hidden % MXFP4_BLOCK or inter % MXFP4_BLOCK:
            raise ValueError(f"MXFP4 experts need the hidden size ({hidden}) and each rank's intermediate size "
                             f"({inter} at tensor_parallel_size {layer.tp_size}) to be multiples of {MXFP4_BLOCK}")

    def create_weights(self, layer: nn.Module) -> None:
        """Replace ``layer``'s expert weights by packed uint8 ones and give it scale parameters, shaped for this
        rank, each loading a whole checkpoint tensor (all the experts) through :meth:`load`. Nothing to do
        for a layer already packed (``pack_experts_at_construction``)."""
        if layer.w13_weight.dtype == torch.uint8:
            return
        self.check_layer(layer)
        num_experts, hidden, inter = layer.num_experts, layer.w2_weight.shape[1], layer.intermediate_size_per_rank
        device = layer.w13_weight.device
        shapes = {"w13": (num_experts, 2 * inter, hidden), "w2": (num_experts, hidden, inter)}
        for name, (e, n, k) in shapes.items():
            for suffix, cols in (("weight", k // 2), ("weight_scale", k // MXFP4_BLOCK)):
                param = nn.Parameter(torch.empty(e, n, cols, dtype=torch.uint8, device=device), requires_grad=False)
                param.weight_loader = lambda p, loaded, *shard, _name=name, _scale=suffix != "weight": self.load(
                    layer, p, loaded, _name, _scale, *shard)
                setattr(layer, f"{name}_{suffix}", param)
        layer.block_shape = None

    def load(self, layer: nn.Module, param: nn.Parameter, loaded: torch.Tensor, name: str, scale: bool,
             *shard) -> None:
        """This rank's part of one checkpoint tensor (``name``: ``"w13"`` or ``"w2"``) of all the experts:
        blocks ``[E, N, K / 32, 16]``, or scales ``[E, N, K / 32]`` (``scale``); the loader maps the checkpoint's names
        (``models/loader.py``). ``w13``'s
        interleaved gate and up rows are split (the gate's first), this rank's channels of each kept; ``w2``
        keeps this rank's groups of input columns."""
        if shard:
            raise ValueError("MXFP4 experts load from whole stacked tensors (gpt-oss's *_blocks / *_scales), "
                             f"not one expert's projection (got shard {shard})")
        if loaded.dtype != torch.uint8:
            raise ValueError(f"MXFP4 blocks and scales are uint8, got {loaded.dtype} for {name}")
        inter, rank = layer.intermediate_size_per_rank, layer.tp_rank
        rows, k = (2 * inter * layer.tp_size, layer.w2_weight.shape[1]) if name == "w13" else (
            layer.w2_weight.shape[1], inter * layer.tp_size)
        want = (layer.num_experts, rows, k // MXFP4_BLOCK) + (() if scale else (MXFP4_BLOCK // 2,))
        if tuple(loaded.shape) != want:
            raise ValueError(f"checkpoint MXFP4 {'scales' if scale else 'blocks'} of {name} must be {want}, got "
                             f"{tuple(loaded.shape)}")
        packed = loaded if scale else loaded.reshape(*loaded.shape[:2], -1)  # [E, N, cols]: blocks flattened
        if name == "w13":
            rows = torch.arange(rank * inter, (rank + 1) * inter, device=packed.device)
            picked = torch.cat([packed[:, 2 * rows], packed[:, 2 * rows + 1]], 1)  # [E, 2 * I_rank, cols]
        else:
            per_rank = inter // (MXFP4_BLOCK if scale else 2)
            picked = packed.narrow(2, rank * per_rank, per_rank)  # [E, H, cols of this rank]
        param.data.copy_(picked)

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        """Quantize experts that loaded in high precision (dummy weights), one expert at a time; nothing to do
        for a checkpoint in MXFP4. Each rank's groups are TP=1's (a group never straddles two ranks)."""
        if layer.w13_weight.dtype == torch.uint8:
            if self.dummy:
                self._random_codes(layer)
            return
        self.check_layer(layer)
        for name in ("w13", "w2"):
            w = getattr(layer, f"{name}_weight").data  # [E, N, K]
            blocks = torch.empty(*w.shape[:2], w.shape[2] // 2, dtype=torch.uint8, device=w.device)
            scales = torch.empty(*w.shape[:2], w.shape[2] // MXFP4_BLOCK, dtype=torch.uint8, device=w.device)
            for e in range(w.shape[0]):
                blocks[e], scales[e] = quantize_mxfp4(w[e])
            setattr(layer, f"{name}_weight", nn.Parameter(blocks, requires_grad=False))
            setattr(layer, f"{name}_weight_scale", nn.Parameter(scales, requires_grad=False))
        layer.block_shape = None

    @staticmethod
    def _random_codes(layer: nn.Module) -> None:
        """Dummy weights for packed experts: uniform random e2m1 codes (seeded, the same on every rank) at
        scale ``DUMMY_SCALE``."""
        gen = torch.Generator(device=layer.w13_weight.device).manual_seed(0)
        for name in ("w13", "w2"):
            blocks = getattr(layer, f"{name}_weight")
            blocks.data.copy_(torch.randint(0, 256, blocks.shape, generator=gen, device=blocks.device))
            getattr(layer, f"{name}_weight_scale").data.fill_(DUMMY_SCALE)


def pack_experts_at_construction(layer: nn.Module, checkpoint_quant: dict | None) -> None:
    """Give a just-built ``FusedMoE`` its packed MXFP4 parameters when the checkpoint's ``quantization_config``
    says MXFP4 (else nothing): a model's MoE block calls this right after building the layer, so that its
    float experts are freed layer by layer as the model is built, and the whole model never holds them (the
    loader's ``apply_mxfp4`` then finds the layer packed)."""
    config = mxfp4_config(checkpoint_quant)
    if config is not None:
        Mxfp4MoEMethod(config).create_weights(layer)
