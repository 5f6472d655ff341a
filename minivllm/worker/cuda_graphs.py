"""CUDA graphs for decode-only steps, one per padded batch size, sharing one memory pool."""

from __future__ import annotations

import contextlib
import dataclasses

import torch

from minivllm.layers.attention_metadata import AttentionMetadata
from minivllm.worker.input_batch import StepInputs

#: decode graphs of these sizes capture their GEMMs with torch's cuBLASLt backend: faster than the default
#: cuBLAS path at 32-96 rows, equal at 128, slower at 256; the GEMV takes up to 16 rows (figures:
#: docs/performance-notes.md; per layer: ``benchmarks/kernels/gemv.py --cublaslt --configs none --rows 32``)
CUBLASLT_ROWS = range(17, 129)


def graph_batch_sizes(max_num_seqs: int) -> list[int]:
    """1, 2, 4, 8, then every 16, up to the first size that holds ``max_num_seqs`` rows."""
    sizes = []
    for s in [1, 2, 4, 8, *range(16, max_num_seqs + 16, 16)]:
        sizes.append(s)
        if s >= max_num_seqs:
            break
    return sizes


@contextlib.contextmanager
def blas_for_rows(rows: int):
    """cuBLASLt for the GEMMs run inside for a graph of ``rows`` rows in ``CUBLASLT_ROWS``, else unchanged."""
    if rows not in CUBLASLT_ROWS:
        yield
        return
    prev = torch.backends.cuda.preferred_blas_library()
    torch.backends.cuda.preferred_blas_library("cublaslt")
    try:
        yield
    finally:
        torch.backends.cuda.preferred_blas_library(prev)


class DecodeGraphRunner:
    """Captures the model's forward for decode batches and replays it with padded inputs.

    Static device buffers hold the inputs; ``run`` copies a step's host arrays into them
    (from pinned staging buffers, non-blocking), pads rows up to the captured size (token 0,
    slot -1, context length 1 over block 0, harmless), writes the previous step's sampled ids
    over placeholders, replays, and returns the real rows' hidden states. Each KV cache group past the first (a
    hybrid model) has its own slot mapping and block tables, staged and copied with the first group's.
    """

    def __init__(self, model, device: torch.device, dtype: torch.dtype, hidden_size: int, max_num_seqs: int,
                 max_model_len: int, block_size: int, num_groups: int = 1):
        self.model = model
        self.device = device
        self.sizes = graph_batch_sizes(max_num_seqs)
        self.max_bs = self.sizes[-1]
        self.max_blocks = -(-max_model_len // block_size)
        self.max_model_len = max_model_len
        hidden = hidden_size
        dev, bs, mb = self.device, self.max_bs, self.max_blocks
        self.input_ids = torch.zeros(bs, dtype=torch.int64, device=dev)
        self.positions = torch.zeros(bs, dtype=torch.int64, device=dev)
        self.slot_mapping = torch.full((bs,), -1, dtype=torch.int64, device=dev)
        self.context_lens = torch.ones(bs, dtype=torch.int32, device=dev)
        self.block_tables = torch.zeros(bs, mb, dtype=torch.int32, device=dev)
        self.num_extra = num_extra = num_groups - 1  # KV cache groups past the first
        self.group_slot_mappings = torch.full((num_extra, bs), -1, dtype=torch.int64, device=dev)
        self.group_block_tables = torch.zeros(num_extra, bs, mb, dtype=torch.int32, device=dev)
        self.cu_seqlens_q = torch.arange(bs + 1, dtype=torch.int32, device=dev)
        self.outputs = torch.zeros(bs, hidden, dtype=dtype, device=dev)
        # pinned staging, two sets used in turn (the host fills one while the device may still be
        # copying from the other): ids, positions, slots, placeholder index and source, the further groups' slots
        # as int64; context lens and every group's block tables as int32. An event per set marks its copies' end.
        self.host_i64 = torch.zeros(2, 5 + num_extra, bs, dtype=torch.int64).pin_memory()
        self.host_ctx = torch.ones(2, bs, dtype=torch.int32).pin_memory()
        self.host_bt = torch.zeros(2, num_groups, bs, mb, dtype=torch.int32).pin_memory()
        self.copied: list[torch.cuda.Event | None] = [None, None]
        self.turn = 0
        self.dev_i64 = torch.zeros(5 + num_extra, bs, dtype=torch.int64, device=dev)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self._capture()

    def _meta(self, bs: int) -> AttentionMetadata:
        meta = AttentionMetadata(
            slot_mapping=self.slot_mapping[:bs], cu_seqlens_q=self.cu_seqlens_q[: bs + 1],
            context_lens=self.context_lens[:bs], block_tables=self.block_tables[:bs], max_seqlen_q=1,
            max_context_len=self.max_model_len, is_decode=True, num_rows=bs)
        meta.group_metas = [dataclasses.replace(meta, slot_mapping=self.group_slot_mappings[g, :bs],
                                                block_tables=self.group_block_tables[g, :bs], group_metas=[])
                            for g in range(self.num_extra)]
        return meta

    @torch.inference_mode()
    def _capture(self) -> None:
        pool = None
        for bs in reversed(self.sizes):
            meta = self._meta(bs)
            graph = torch.cuda.CUDAGraph()
            with blas_for_rows(bs):
                self.outputs[:bs] = self.model(self.input_ids[:bs], self.positions[:bs], meta)  # warm-up
                with torch.cuda.graph(graph, pool):
                    self.outputs[:bs] = self.model(self.input_ids[:bs], self.positions[:bs], meta)
            if pool is None:
                pool = graph.pool()
            self.graphs[bs] = graph
            # the LM head runs eagerly after a replay; this compiles its Triton kernels for bs rows now
            # rather than in users' first decode steps (benchmarks/engine/lazy_compiles.py lists late ones)
            self.model.compute_logits(self.outputs[:bs], gather=False)
            torch.cuda.synchronize(self.device)

    def can_run(self, inp: StepInputs) -> bool:
        return inp.is_decode and inp.num_rows <= self.max_bs and inp.block_tables.shape[1] <= self.max_blocks

    def run(self, inp: StepInputs, prev: torch.Tensor | None = None) -> torch.Tensor:  # -> [num_rows, hidden]
        """Replay for ``inp``; ``prev`` holds the previous step's sampled ids for its placeholders."""
        n = inp.num_rows
        gbs = next(s for s in self.sizes if s >= n)
        width = inp.block_tables.shape[1]
        k, self.turn = self.turn, self.turn ^ 1
        if self.copied[k] is not None:
            self.copied[k].synchronize()  # normally long done: it was two steps ago
        h64 = self.host_i64[k].numpy()
        h64[0, :n], h64[1, :n], h64[2, :n] = inp.input_ids, inp.positions, inp.slot_mapping
        # NOTE: padding rows get token 0 at position 0 and no KV slot; their staging rows may hold
        # an earlier step's placeholder (-1), which the embedding would reject
        h64[0:2, n:gbs] = 0
        h64[2, n:gbs] = -1
        for g, slots in enumerate(inp.group_slot_mappings):
            h64[5 + g, :n] = slots
        h64[5:, n:gbs] = -1
        num_ph = 0 if inp.prev_token_index is None else len(inp.prev_token_index)
        if num_ph:
            h64[3, :num_ph], h64[4, :num_ph] = inp.prev_token_index, inp.prev_token_src
        ctx = self.host_ctx[k].numpy()
        ctx[:n] = inp.context_lens
        ctx[n:gbs] = 1
        bt = self.host_bt[k].numpy()  # [groups, rows, max_blocks]
        bt[0, :n, :width] = inp.block_tables
        for g, tables in enumerate(inp.group_block_tables):
            bt[1 + g, :n, :width] = tables
        bt[:, n:gbs, 0] = 0
        rows = 5 if num_ph or self.num_extra else 3
        self.dev_i64[:rows + self.num_extra, :gbs].copy_(self.host_i64[k, :rows + self.num_extra, :gbs],
                                                          non_blocking=True)
        self.context_lens[:gbs].copy_(self.host_ctx[k, :gbs], non_blocking=True)
        self.block_tables[:gbs, :width].copy_(self.host_bt[k, 0, :gbs, :width], non_blocking=True)
        if self.num_extra:
            self.group_block_tables[:, :gbs, :width].copy_(self.host_bt[k, 1:, :gbs, :width], non_blocking=True)
        event = torch.cuda.Event()
        event.record()
        self.copied[k] = event
        self.input_ids[:gbs].copy_(self.dev_i64[0, :gbs])
        self.positions[:gbs].copy_(self.dev_i64[1, :gbs])
        self.slot_mapping[:gbs].copy_(self.dev_i64[2, :gbs])
        if self.num_extra:
            self.group_slot_mappings[:, :gbs].copy_(self.dev_i64[5:, :gbs])
        if num_ph:
            self.input_ids.index_copy_(0, self.dev_i64[3, :num_ph], prev.index_select(0, self.dev_i64[4, :num_ph]))
        self.graphs[gbs].replay()
        return self.outputs[:n]
