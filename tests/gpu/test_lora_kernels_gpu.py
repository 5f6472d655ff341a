"""The Triton multi-LoRA shrink and expand on a GPU against the torch reference: the issue's grid (ranks 8-64,
1-256 rows, 1-8 adapters of 8 slots, base-model rows mixed in) at bf16, fp16 and fp32 and real layer widths,
a prefill-sized batch, no host sync, and the whole step (grouping, shrink, expand) captured in a CUDA graph and
replayed with other slot mappings."""

from __future__ import annotations

import pytest
import torch

from minivllm.kernels.lora import lora_expand, lora_shrink
from minivllm.kernels.lora_segments import lora_segments
from tests.helpers.lora_cases import check_expand, check_shrink, lora_case, random_slots, shrink_out

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

HIDDEN = 2048
QKV = (2048, 512, 512)  # q, k, v of a 2048-wide model with 4 KV heads of 128
GATE_UP = (6144, 6144)
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def _run_and_check(case):
    out = lora_shrink(case.x, case.a_stacked, case.token_slot, shrink_out(case))
    check_shrink(out, case)
    y0 = torch.randn(case.x.shape[0], case.width, device="cuda").to(case.x.dtype)
    y = lora_expand(out, case.b_stacked, case.token_slot, y0.clone(), case.slice_offsets)
    check_expand(y, y0, out, case)


@pytest.mark.parametrize("dtype", list(DTYPES.values()), ids=list(DTYPES))
@pytest.mark.parametrize("rank", [8, 16, 32, 64])
@pytest.mark.parametrize("rows", [1, 5, 64, 256])
@pytest.mark.parametrize("adapters", [1, 3, 8])
@pytest.mark.parametrize("widths", [QKV, GATE_UP, (HIDDEN,)], ids=["qkv", "gate-up", "o"])
def test_issue_grid_matches_the_torch_reference(dtype, rank, rows, adapters, widths):
    _run_and_check(lora_case(rows, HIDDEN, widths, rank, 8, adapters, dtype, device="cuda",
                             seed=rank + rows + adapters))


@pytest.mark.parametrize("rows", [1024, 4096])
def test_prefill_sized_batch(rows):
    """Many row tiles per slot; the shrink without split-K."""
    _run_and_check(lora_case(rows, 4096, (4096, 1024, 1024), 16, 8, 8, torch.bfloat16, device="cuda", seed=rows))


def test_no_host_sync():
    """Grouping, shrink and expand queue their work without waiting on the GPU."""
    case = lora_case(64, HIDDEN, QKV, 16, 8, 8, torch.bfloat16, device="cuda", seed=1)
    out, y = shrink_out(case), torch.zeros(64, case.width, device="cuda", dtype=torch.bfloat16)
    lora_shrink(case.x, case.a_stacked, case.token_slot, out)  # compile first
    lora_expand(out, case.b_stacked, case.token_slot, y, case.slice_offsets)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        seg = lora_segments(case.token_slot, 8)
        lora_shrink(case.x, case.a_stacked, case.token_slot, out, segments=seg)
        lora_expand(out, case.b_stacked, case.token_slot, y, case.slice_offsets, segments=seg)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()


@pytest.mark.parametrize("rows", [1, 48])
def test_captured_step_replays_other_slot_mappings(rows):
    """One graph of grouping + shrink + expand, replayed after new slot mappings are copied into its input:
    another mix of adapters, all 8 slots, the base model alone."""
    case = lora_case(rows, HIDDEN, QKV, 32, 8, 3, torch.bfloat16, device="cuda", seed=rows)
    slot_buf = case.token_slot.clone()
    out = shrink_out(case)
    y0 = torch.randn(rows, case.width, device="cuda").to(torch.bfloat16)
    y = y0.clone()

    def step():
        seg = lora_segments(slot_buf, 8)
        lora_shrink(case.x, case.a_stacked, slot_buf, out, segments=seg)
        lora_expand(out, case.b_stacked, slot_buf, y, case.slice_offsets, segments=seg)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()  # compile outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    gen = torch.Generator().manual_seed(rows)
    mappings = [random_slots(rows, 8, 2, gen), random_slots(rows, 8, 8, gen, base_frac=0.0),
                torch.full((rows,), -1, dtype=torch.int32), case.token_slot.cpu()]
    for mapping in mappings:
        slot_buf.copy_(mapping)
        y.copy_(y0)
        graph.replay()
        torch.cuda.synchronize()
        replayed = case._replace(token_slot=slot_buf.clone())
        check_shrink(out, replayed)
        check_expand(y, y0, out, replayed)
