"""The Triton multi-LoRA shrink and expand (minivllm/kernels/lora.py) against the torch reference, in Triton's
interpreter on the CPU: mixed batches of several adapters and base-model tokens, 1 to 3 slices, ranks 8 to 64,
bf16/fp16/fp32; the slot grouping they run on (minivllm/kernels/lora_segments.py); their argument checks.
The fast tier runs a modest grid; the issue's grid (ranks 8-64, 1-256 rows, 1-8 adapters, bf16 and fp32) is
``slow``. tests/gpu/test_lora_kernels_gpu.py runs them on a GPU, under CUDA-graph capture too."""

from __future__ import annotations

import pytest
import torch

from minivllm.kernels.lora import lora_expand, lora_shrink, max_row_tiles
from minivllm.kernels.lora_config import ExpandConfig, ShrinkConfig, shrink_config
from minivllm.kernels.lora_segments import lora_segments
from tests.helpers.kernel_checks import gpu_rounding_in_interpreter
from tests.helpers.lora_cases import check_expand, check_shrink, lora_case, random_slots, shrink_out

pytestmark = pytest.mark.triton

QKV = (96, 32, 32)  # q, k, v slices of different widths
GATE_UP = (80, 80)


@pytest.fixture(autouse=True)
def gpu_rounding(monkeypatch):
    """The interpreter's float32 -> bfloat16 casts round to nearest even, as the GPU's do."""
    return gpu_rounding_in_interpreter(monkeypatch)


def _run(case, segments=None, shrink_cfg=None, expand_cfg=None):
    """The kernels' shrink then expand of ``case`` into a random ``y``: ``(shrunk, y0, y)``."""
    out = lora_shrink(case.x, case.a_stacked, case.token_slot, shrink_out(case), segments=segments,
                      config=shrink_cfg)
    y0 = torch.randn(case.x.shape[0], case.width, generator=torch.Generator().manual_seed(7)).to(case.x.dtype)
    y = lora_expand(out, case.b_stacked, case.token_slot, y0.clone(), case.slice_offsets, segments=segments,
                    config=expand_cfg)
    return out, y0, y


def _check(case, **kw):
    out, y0, y = _run(case, **kw)
    check_shrink(out, case)
    check_expand(y, y0, out, case)


FAST = [  # (rows, widths, rank, slots, adapters)
    (37, QKV, 16, 4, 3),  # QKV, ragged row and column tiles, base rows mixed in
    (1, (64,), 8, 8, 1),  # one decode token, rank 8 (the rank tile padded to 16)
    (20, GATE_UP, 64, 3, 3),  # gate-up at rank 64
    (12, GATE_UP, 24, 3, 2),  # a rank not a power of two, the FMA variant (up to 16 tokens)
]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=["bf16", "fp16", "fp32"])
@pytest.mark.parametrize("rows,widths,rank,slots,adapters", FAST, ids=["qkv-37x16", "decode-r8", "gate-up-r64", "r24"])
def test_shrink_expand_match_the_torch_reference(dtype, rows, widths, rank, slots, adapters):
    _check(lora_case(rows, 96, widths, rank, slots, adapters, dtype, seed=rows + rank))


def _issue_grid():
    """Ranks 8-64 x 1-256 rows x 1-8 adapters in a batch (of 8 slots) x bf16/fp32, QKV and plain slices."""
    for dtype in (torch.bfloat16, torch.float32):
        for rank in (8, 16, 32, 64):
            for rows in (1, 5, 64, 256):
                for adapters in (1, 3, 8):
                    widths = QKV if (rank + rows + adapters) % 2 else (128,)
                    yield pytest.param(dtype, rank, rows, adapters, widths, marks=pytest.mark.slow,
                                       id=f"{str(dtype)[6:]}-r{rank}-{rows}rows-{adapters}lora-{len(widths)}slices")


@pytest.mark.parametrize("dtype,rank,rows,adapters,widths", list(_issue_grid()))
def test_issue_grid_matches_the_torch_reference(dtype, rank, rows, adapters, widths):
    _check(lora_case(rows, 128, widths, rank, 8, adapters, dtype, seed=rank * 1000 + rows * 10 + adapters))


@pytest.mark.parametrize("variant", [(1, 0), (2, 0), (4, 0), (1, 2), (1, 4), (1, 8)],
                         ids=["mma", "mma-split2", "mma-split4", "fma-2rows", "fma-4rows", "fma-8rows"])
def test_shrink_variants_and_small_tiles(variant):
    """The shrink's MMA variant with its ``H`` walk split over 1, 2, 4 programs (atomic float32 adds) and its
    FMA variant with 2, 4, 8 rank rows a program (rank 12: a ragged last block); small tiles everywhere,
    several row tiles per slot and column tiles per slice."""
    split_k, fma_rows = variant
    case = lora_case(21, 100, QKV, 12, 3, 3, torch.bfloat16, seed=split_k + fma_rows)
    _check(case, shrink_cfg=ShrinkConfig(16, 32, split_k, fma_rows, 4), expand_cfg=ExpandConfig(16, 32, 4))


@pytest.mark.parametrize("fma_rows", [0, 4], ids=["mma", "fma"])
def test_every_run_ending_in_a_partial_tile(fma_rows):
    """The mapping that needs the most row tiles: 8 slots and the base model, each run one token past a
    multiple of the tile (the grid's bound exactly); and a single slot."""
    case = lora_case(25, 64, GATE_UP, 8, 8, 8, torch.float32, seed=9)
    slots = torch.tensor([0] * 17 + [1, 2, 3, 4, 5, 6, 7, -1], dtype=torch.int32)
    assert max_row_tiles(25, 16, 9) == 2 + 8  # slot 0 two tiles, the other 8 groups one each
    _check(case._replace(token_slot=slots[torch.randperm(25, generator=torch.Generator().manual_seed(0))]),
           shrink_cfg=ShrinkConfig(16, 32, 1, fma_rows, 4), expand_cfg=ExpandConfig(16, 32, 4))
    one = lora_case(7, 64, (48,), 16, 1, 1, torch.float32, seed=3)
    _check(one, shrink_cfg=ShrinkConfig(16, 32, 1, fma_rows, 4))


def test_default_shrink_config_by_token_count():
    """A decode step: the FMA variant, rank rows spread over about 64 programs per slot; up to a few hundred
    tokens: the MMA variant splitting ``H``; a prefill's row tiles alone fill the GPU."""
    assert shrink_config(1, 4096, 16, 3) == ShrinkConfig(1, 512, 1, 1, 4)  # 48 programs a slot
    assert shrink_config(16, 4096, 64, 3).fma_rows == 2  # 32 rank blocks x 3 slices
    assert shrink_config(16, 4096, 64, 1).fma_rows == 1
    mid = shrink_config(48, 4096, 16, 3)
    assert mid.fma_rows == 0 and mid.split_k > 1
    assert shrink_config(4096, 4096, 16, 3).split_k == 1
    assert shrink_config(64, 64, 16, 1).split_k == 1  # one step of H: nothing to split


def test_segments_group_tokens_by_slot():
    gen = torch.Generator().manual_seed(3)
    token_slot = random_slots(50, 6, 4, gen)
    seg = lora_segments(token_slot, 6)
    assert seg.sorted_tokens.dtype == seg.counts.dtype == seg.starts.dtype == torch.int32
    order = [t for s in [*range(6), -1] for t in range(50) if token_slot[t] == s]  # slot by slot, base last
    assert seg.sorted_tokens.tolist() == order
    counts = [int((token_slot == s).sum()) for s in [*range(6), -1]]
    assert seg.counts.tolist() == counts
    assert seg.starts.tolist() == [sum(counts[:i]) for i in range(7)]


def test_given_segments_equal_built_ones():
    """The runner's once-a-step segments give the same result as those each op builds for itself."""
    case = lora_case(30, 64, GATE_UP, 16, 4, 2, torch.float32, seed=11)
    seg = lora_segments(case.token_slot, 4)
    for got, built in zip(_run(case, segments=seg), _run(case)):
        assert torch.equal(got, built)


def test_only_base_model_tokens():
    """No token has an adapter: every program exits, ``out`` is zero and ``y`` unchanged."""
    case = lora_case(9, 64, QKV, 16, 4, 1, torch.bfloat16)._replace(token_slot=torch.full((9,), -1, dtype=torch.int32))
    out, y0, y = _run(case)
    assert (out == 0).all() and torch.equal(y, y0)


def test_expand_writes_only_its_slices_columns():
    """``y`` wider than the slices, its rows strided, the slices starting at column 8: other columns untouched."""
    case = lora_case(13, 64, GATE_UP, 16, 3, 3, torch.float16, seed=5)
    out = lora_shrink(case.x, case.a_stacked, case.token_slot, shrink_out(case))
    big = torch.randn(13, 200, generator=torch.Generator().manual_seed(2)).half()
    y = big[:, :180]  # [13, 180], rows 200 apart
    before = big.clone()
    lora_expand(out, case.b_stacked, case.token_slot, y, (8, 88, 168))
    assert torch.equal(big[:, :8], before[:, :8]) and torch.equal(big[:, 168:], before[:, 168:])
    shifted = case._replace(slice_offsets=(0, 80, 160))
    check_expand(big[:, 8:168], before[:, 8:168], out, shifted)


def test_shrink_reads_strided_rows():
    """``x`` a view with rows 160 apart (a slice of a wider activation)."""
    case = lora_case(11, 96, QKV, 16, 3, 2, torch.bfloat16, seed=4)
    wide = torch.randn(11, 160, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    wide[:, 32:128] = case.x
    strided = case._replace(x=wide[:, 32:128])
    check_shrink(lora_shrink(strided.x, case.a_stacked, case.token_slot, shrink_out(case)), strided)


def test_zero_tokens():
    case = lora_case(0, 64, QKV, 8, 2, 1, torch.bfloat16)
    out, y0, y = _run(case)
    assert out.shape == (3, 0, 8) and y.shape == (0, 160)


def test_bad_arguments_are_rejected_by_name():
    case = lora_case(4, 64, GATE_UP, 16, 2, 2, torch.bfloat16)
    out = shrink_out(case)
    x, a, slots = case.x, case.a_stacked, case.token_slot
    with pytest.raises(ValueError, match="x must be"):
        lora_shrink(x[None], a, slots, out)
    with pytest.raises(ValueError, match="a_stacked must be a tuple of 1 to 3"):
        lora_shrink(x, a * 2, slots, out)
    with pytest.raises(ValueError, match="a_stacked: every slice"):
        lora_shrink(x, (a[0], a[1].float()), slots, out)
    with pytest.raises(ValueError, match="out must be"):
        lora_shrink(x, a, slots, out.double())
    with pytest.raises(ValueError, match="token_slot must be"):
        lora_shrink(x, a, slots[:3], out)
    with pytest.raises(ValueError, match="token_slot values"):
        lora_shrink(x, a, torch.tensor([0, 1, 2, -1], dtype=torch.int32), out)
    with pytest.raises(ValueError, match="the activations' device"):
        lora_shrink(x, a, slots.to("meta"), out)
    with pytest.raises(ValueError, match="segments are for"):
        lora_shrink(x, a, slots, out, segments=lora_segments(slots, 5))
    y = torch.zeros(4, 160, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="slice_offsets"):
        lora_expand(out, case.b_stacked, slots, y, (0, 80))
    with pytest.raises(ValueError, match="slice_offsets"):
        lora_expand(out, case.b_stacked, slots, y, (0, 70, 160))
    with pytest.raises(ValueError, match="shrunk must be"):
        lora_expand(out[:1], case.b_stacked, slots, y, (0, 80, 160))
    with pytest.raises(ValueError, match="num_slots"):
        lora_segments(slots, 0)
