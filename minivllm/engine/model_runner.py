"""ModelRunner: owns the model, the paged KV cache and (on CUDA) the decode CUDA graphs.

``launch(scheduler_output)`` builds the flattened batch, runs the forward pass and samples the
rows whose tokens are all computed, without waiting for the device: it returns a ``StepHandle``
whose ``result()`` brings the sampled tokens to the host. ``run`` = ``launch(...).result()``.
Rank 0 samples; other tensor-parallel ranks run ``execute_step`` on the same ``StepInputs``
(with ``MINIVLLM_TP_SHARDED_SAMPLING=1``, rank 0's ``prepare_inputs`` may mark a step for sharded
sampling: every rank then samples its vocabulary slice, see ``minivllm.layers.sharded_sampling``).

NOTE: asynchronous scheduling feeds each step's sampled ids to the next step on the device:
``prev_sampled`` holds the newest launched step's ``[num_sampled]`` int64 token ids (on every
rank: rank 0 broadcasts them when tensor parallel), and ``execute`` writes them over the
placeholders listed in ``StepInputs.prev_token_index``.
"""

from __future__ import annotations

import logging

import torch

from minivllm.config import Config
from minivllm.engine.executor import SampledTokens
from minivllm.engine.scheduler import SchedulerOutput
from minivllm.engine.startup import allocate_kv_cache, warm_sampling
from minivllm.engine.step_handle import StepHandle
from minivllm.engine.step_inputs import StepInputs, build_step_inputs
from minivllm.kernels.pdl import pdl_for_rows
from minivllm.kernels.reference import FP8_DTYPES
from minivllm.layers.attention import Attention
from minivllm.layers.attention_metadata import AttentionMetadata
from minivllm.layers.sampler import Sampler, SamplerOutput
from minivllm.layers.sampling_metadata import build_sampling_metadata, seeded_keys
from minivllm.layers.sharded_sampling import ShardedSampler, sharded_sampling_enabled, sharded_temperatures
from minivllm.models.loader import init_dummy_weights, load_weights
from minivllm.models.registry import get_model_class
from minivllm.utils.parallel import TPGroup, tp_group_context
from minivllm.utils.tp_switches import tp_cuda_graphs_enabled

logger = logging.getLogger(__name__)
_TORCH_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


class ModelRunner:
    """Runs the model for one rank. See the module docstring."""

    def __init__(self, config: Config, rank: int = 0, dist_init_method: str | None = None):
        self.config = config
        self.rank = rank
        self.block_size = config.kvcache_block_size
        self.dtype = _TORCH_DTYPES[config.dtype]
        self.kv_dtype = FP8_DTYPES.get(config.kv_cache_dtype, self.dtype)
        if config.device == "cpu":
            self.device = torch.device("cpu")
        else:
            index = rank if config.device == "cuda" else int(config.device.split(":")[1]) + rank
            self.device = torch.device("cuda", index)
            torch.cuda.set_device(self.device)
        self.tp_group = None  # this engine's tensor-parallel group; layers built below keep it
        if config.tensor_parallel_size > 1:
            self.tp_group = TPGroup(self.device, dist_init_method, config.tensor_parallel_size, rank)
        torch.manual_seed(config.seed)
        mc = config.model_config
        model_cls = get_model_class(mc.architecture)
        with torch.device(self.device), tp_group_context(self.tp_group):
            prev = torch.get_default_dtype()
            torch.set_default_dtype(self.dtype)
            try:
                self.model = model_cls(mc, max_position=config.max_model_len, backend=config.attention_backend)
            finally:
                torch.set_default_dtype(prev)
        self.model.eval()
        if config.load_format == "dummy":
            init_dummy_weights(self.model, seed=config.seed)
        else:
            load_weights(self.model, config.model)
        self.attn_layers = [m for m in self.model.modules() if isinstance(m, Attention)]
        self.sampler = Sampler()
        self.vocab_size = mc.vocab_size
        # tensor parallel: every rank can sample its slice; rank 0 decides per step (prepare_inputs)
        self.shard_sampler = ShardedSampler(self.model.lm_head, self.device) if self.tp_group is not None else None
        self.sharded_sampling = self.shard_sampler is not None and sharded_sampling_enabled(self.device)
        self.num_sharded_steps = 0  # rank 0's steps sampled sharded (a check for tests and benchmarks)
        self.eos_token_ids = list(mc.eos_token_ids)
        self.graph_runner = None
        self.prev_sampled: torch.Tensor | None = None
        self.share_sampled = config.tensor_parallel_size > 1 and config.async_scheduling
        self.kv_cache: torch.Tensor | None = None  # [2, layers, blocks, block_size, kv_heads, head_dim]
        self.num_kvcache_blocks = allocate_kv_cache(self)
        if self.device.type == "cuda" and not config.enforce_eager and self._graphs_allowed():
            from minivllm.engine.cuda_graphs import DecodeGraphRunner

            self.graph_runner = DecodeGraphRunner(self)
        warm_sampling(self)

    def _graphs_allowed(self) -> bool:
        """CUDA graphs with tensor parallelism only where ``tp_cuda_graphs_enabled()`` says (see there)."""
        if self.config.tensor_parallel_size == 1 or tp_cuda_graphs_enabled():
            return True
        if self.rank == 0:
            logger.warning("tensor_parallel_size > 1 with c10d NCCL: CUDA graphs are off (stalled on GPUs); "
                           "steps run eagerly (MINIVLLM_TP_COMM=pynccl captures them)")
        return False

    def release_graphs(self) -> None:
        """Drop the CUDA graphs. NOTE: NCCL frees (and aborts) a communicator only once no graph holds its kernels."""
        if self.graph_runner is not None:
            self.graph_runner.graphs.clear()
            self.graph_runner = None

    def shutdown(self) -> None:
        """Leave the tensor-parallel process group (if any); the runner must not be used afterwards."""
        self.release_graphs()
        if self.tp_group is not None:
            self.tp_group.shutdown()

    # ------------------------------------------------------------------- forward
    def _to_device(self, a, dtype=None) -> torch.Tensor:
        t = torch.from_numpy(a)
        if self.device.type == "cuda":
            t = t.pin_memory().to(self.device, non_blocking=True)
        return t if dtype is None else t.to(dtype)

    def attention_metadata(self, inp: StepInputs) -> AttentionMetadata:
        return AttentionMetadata(
            slot_mapping=self._to_device(inp.slot_mapping),
            cu_seqlens_q=self._to_device(inp.cu_seqlens_q),
            context_lens=self._to_device(inp.context_lens),
            block_tables=self._to_device(inp.block_tables),
            max_seqlen_q=inp.max_seqlen_q,
            max_context_len=inp.max_context_len,
            is_decode=inp.is_decode,
            num_rows=inp.num_rows,
            cu_seqlens_q_cpu=inp.cu_seqlens_q.tolist(),
            context_lens_cpu=inp.context_lens.tolist(),
            is_fresh_prefill=inp.is_fresh_prefill,
        )

    def _prev_tokens(self, inp: StepInputs) -> torch.Tensor | None:
        """[num_placeholders] device ids to write at ``inp.prev_token_index`` (None: no placeholders)."""
        if inp.prev_token_index is None:
            return None
        prev = self.prev_sampled
        if prev is None or int(inp.prev_token_src.max()) >= prev.shape[0]:
            raise RuntimeError("a step reads sampled tokens that the previous step did not produce")
        return prev

    @torch.inference_mode()
    def execute(self, inp: StepInputs) -> torch.Tensor | None:
        """Forward pass on every rank; returns logits of the sampled rows on rank 0 ([rows, vocab])."""
        prev = self._prev_tokens(inp)
        if self.graph_runner is not None and self.graph_runner.can_run(inp):
            hidden = self.graph_runner.run(inp, prev)
        else:
            meta = self.attention_metadata(inp)
            input_ids = self._to_device(inp.input_ids)  # [num_tokens]
            if prev is not None:
                input_ids[self._to_device(inp.prev_token_index)] = prev[self._to_device(inp.prev_token_src)]
            with pdl_for_rows(len(inp.input_ids)):
                hidden = self.model(input_ids, self._to_device(inp.positions), meta)
        if len(inp.sample_indices) == 0:
            return None
        if len(inp.sample_indices) < hidden.shape[0]:  # NOTE: all rows sampled means indices 0..n-1
            hidden = hidden[self._to_device(inp.sample_indices)]  # [rows, hidden]
        # NOTE: a sharded-sampling step keeps each rank's [rows, per_rank] slice (no gather)
        return self.model.compute_logits(hidden, gather=inp.sample_temperatures is None)

    @torch.inference_mode()
    def execute_step(self, inp: StepInputs) -> None:
        """A worker rank's step: the forward, its slice's share of a sharded sampling, then rank 0's sampled
        ids when they feed the next step."""
        logits = self.execute(inp)
        if inp.sample_temperatures is not None and logits is not None:
            self.shard_sampler(logits, inp.sample_temperatures)
        num_sampled = len(inp.sample_indices)
        if self.share_sampled:
            self.prev_sampled = None
            if num_sampled:
                self.prev_sampled = torch.empty(num_sampled, dtype=torch.int64, device=self.device)
                self.tp_group.broadcast(self.prev_sampled, src=0)

    @torch.inference_mode()
    def run(self, out: SchedulerOutput, inp: StepInputs | None = None) -> SampledTokens:
        """One step, waiting for its tokens: ``launch(out, inp).result()``."""
        return self.launch(out, inp).result()

    @torch.inference_mode()
    def launch(self, out: SchedulerOutput, inp: StepInputs | None = None) -> StepHandle:
        """Prepare, forward and sample one step without waiting for the device.

        NOTE: call before the scheduler's ``advance``: the sampled rows are those whose tokens
        are all computed once this step's ``num_new`` tokens are.
        """
        inp = inp if inp is not None else self.prepare_inputs(out)
        logits = self.execute(inp)
        self.prev_sampled = None
        if logits is None:
            return StepHandle.ready(SampledTokens([]))
        seqs = _sampled_seqs(out)
        if inp.sample_temperatures is not None:
            res, want = self._sample_sharded(logits, inp, seqs)
        else:
            res, want = self._sample(logits, seqs)
        self.prev_sampled = res.sampled_token_ids
        if self.share_sampled:
            self.tp_group.broadcast(res.sampled_token_ids, src=0)
        return StepHandle(res, want)

    def prepare_inputs(self, out: SchedulerOutput) -> StepInputs:
        """Rank 0: the step's ``StepInputs`` for every rank, marked for sharded sampling where it applies."""
        inp = build_step_inputs(out, self.block_size)
        if self.sharded_sampling and len(inp.sample_indices):
            seqs = _sampled_seqs(out)
            inp.sample_temperatures = sharded_temperatures(
                [s.sampling_params for s in seqs], [s.num_completion_tokens for s in seqs], self.vocab_size,
                self.sampler.uses_fused(self.device))
        return inp

    def _sample_sharded(self, logits: torch.Tensor, inp: StepInputs, seqs: list):
        """Rank 0's side of a sharded sampling step (``logits``: its own vocabulary slice)."""
        params = [s.sampling_params for s in seqs]
        keys = seeded_keys(params, [s.num_completion_tokens for s in seqs])
        self.num_sharded_steps += 1
        return SamplerOutput(self.shard_sampler(logits, inp.sample_temperatures, keys)), [p.logprobs for p in params]

    def _sample(self, logits: torch.Tensor, seqs: list):
        params = [s.sampling_params for s in seqs]
        if any(p.has_penalties for p in params):
            prompts, outputs = [s.prompt_token_ids for s in seqs], [s.completion_token_ids for s in seqs]
        else:  # NOTE: without penalties only the output lengths are read (seeds, min_tokens): no copies
            prompts, outputs = [()] * len(seqs), [range(s.num_completion_tokens) for s in seqs]
        meta = build_sampling_metadata(params, prompts, outputs, self.eos_token_ids, self.device, self.vocab_size)
        want = [p.logprobs for p in params]
        return self.sampler(logits, meta), want


def _sampled_seqs(out: SchedulerOutput) -> list:
    """The step's sampled sequences (batch order): those whose tokens are all computed after it."""
    return [seq for seq, n in out.scheduled if seq.num_computed_tokens + n == seq.num_tokens]
