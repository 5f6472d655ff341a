"""ModelRunner: owns the model, the paged KV cache and (on CUDA) the decode CUDA graphs of one rank.

``launch(scheduler_output)`` builds the flattened batch, runs the forward pass and samples the
rows whose tokens are all computed, without waiting for the device: it returns a ``StepHandle``
whose ``result()`` brings the sampled tokens to the host. It reads only the frozen
``SchedulerOutput``, never a ``Sequence``. Rank 0 samples; other tensor-parallel ranks run
``execute_step`` on the same ``StepInputs`` (rank 0's ``prepare_inputs`` may mark a step for sharded
sampling: every rank then samples its vocabulary slice, see ``minivllm.sample.sharded``).

NOTE: asynchronous scheduling feeds each step's sampled ids to the next step on the device:
``prev_sampled`` holds the newest launched step's ``[num_sampled]`` int64 token ids (on every
rank: rank 0 broadcasts them when tensor parallel), and ``execute`` writes them over the
placeholders listed in ``StepInputs.prev_token_index``.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from minivllm.config import Config
from minivllm.core.scheduler_output import SchedulerOutput
from minivllm.distributed.group import TPGroup
from minivllm.kernels.torch_backend import FP8_DTYPES
from minivllm.layers.attention import Attention
from minivllm.layers.attention_metadata import AttentionMetadata
from minivllm.models.loader import load_model_weights
from minivllm.models.registry import get_model_class
from minivllm.sample.metadata import build_sampling_metadata, seeded_keys
from minivllm.sample.prompt_logprobs import PromptLogprobs, prompt_logits, prompt_logprobs
from minivllm.sample.sampler import Sampler, SamplerOutput
from minivllm.sample.sharded import ShardedSampler, sharded_temperatures
from minivllm.worker.executor import SampledTokens
from minivllm.worker.input_batch import StepInputs, build_step_inputs
from minivllm.worker.kv_cache import allocate_kv_cache
from minivllm.worker.step_handle import StepHandle
from minivllm.worker.warmup import warm_sampling


class Forward(NamedTuple):
    """A step whose forward is queued and whose sampling is not: ``ModelRunner.finish_step`` takes it."""

    out: SchedulerOutput
    inp: StepInputs
    logits: torch.Tensor | None  # [sampled rows, vocab] (a sharded step: this rank's slice)
    prompt: PromptLogprobs | None


TORCH_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def device_for_rank(config: Config, rank: int) -> torch.device:
    """The device of tensor-parallel rank ``rank``: the CPU, or GPU ``index + rank`` of ``cuda[:index]``."""
    device = config.device_config.device
    if device == "cpu":
        return torch.device("cpu")
    return torch.device("cuda", (int(device.split(":")[1]) if ":" in device else 0) + rank)


class ModelRunner:
    """Runs the model for one rank (``tp_group``: its tensor-parallel group, None at TP=1). See the module
    docstring."""

    def __init__(self, config: Config, rank: int = 0, tp_group: TPGroup | None = None):
        self.config = config
        self.rank = rank
        self.tp_group = tp_group
        mc, dc = config.model_config, config.device_config
        self.block_size = config.cache_config.kvcache_block_size
        self.dtype = TORCH_DTYPES[mc.dtype]
        self.kv_dtype = FP8_DTYPES.get(config.cache_config.kv_cache_dtype, self.dtype)
        self.device = device_for_rank(config, rank)
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        torch.manual_seed(mc.seed)
        model_cls = get_model_class(mc.arch.architecture)
        with torch.device(self.device):
            prev = torch.get_default_dtype()
            torch.set_default_dtype(self.dtype)
            try:
                self.model = model_cls(mc.arch, max_position=mc.max_model_len, backend=dc.attention_backend,
                                       tp_group=tp_group)
            finally:
                torch.set_default_dtype(prev)
        self.model.eval()
        load_model_weights(self.model, mc)
        self.attn_layers = [m for m in self.model.modules() if isinstance(m, Attention)]
        self.sampler = Sampler(fused=dc.triton_sampling)
        self.vocab_size = mc.arch.vocab_size
        # tensor parallel: every rank can sample its slice; rank 0 decides per step (prepare_inputs)
        self.sharded_sampling = tp_group is not None and dc.triton_sampling
        self.shard_sampler = ShardedSampler(self.model.lm_head, self.device) if self.sharded_sampling else None
        self.num_sharded_steps = 0  # rank 0's steps sampled sharded (a check for tests and benchmarks)
        self.eos_token_ids = list(mc.arch.eos_token_ids)
        self.graph_runner = None
        self.prev_sampled: torch.Tensor | None = None
        self.prompt_logprobs: list[torch.Tensor] | None = None  # the step's prompt-position logprob slices
        self.share_sampled = tp_group is not None and config.scheduler_config.async_scheduling
        self.kv_cache: torch.Tensor | None = None  # [2, layers, blocks, block_size, kv_heads, head_dim]
        self.num_kvcache_blocks = allocate_kv_cache(self)
        if self.device.type == "cuda" and not dc.enforce_eager:
            from minivllm.worker.cuda_graphs import DecodeGraphRunner

            self.graph_runner = DecodeGraphRunner(self)
        warm_sampling(self)

    def release_graphs(self) -> None:
        """Drop the CUDA graphs. NOTE: NCCL frees (and aborts) a communicator only once no graph holds its kernels."""
        if self.graph_runner is not None:
            self.graph_runner.graphs.clear()
            self.graph_runner = None

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
        """Forward pass on every rank; returns logits of the sampled rows on rank 0 ([rows, vocab]). The prompt
        logprobs the step asks for are left in ``self.prompt_logprobs`` (rank 0; see ``prompt_logprobs.py``)."""
        self.prompt_logprobs = None
        prev = self._prev_tokens(inp)
        if self.graph_runner is not None and self.graph_runner.can_run(inp):
            hidden = self.graph_runner.run(inp, prev)
        else:
            meta = self.attention_metadata(inp)
            input_ids = self._to_device(inp.input_ids)  # [num_tokens]
            if prev is not None:
                input_ids[self._to_device(inp.prev_token_index)] = prev[self._to_device(inp.prev_token_src)]
            hidden = self.model(input_ids, self._to_device(inp.positions), meta)
        if inp.prompt_logprob_index is not None:
            self.prompt_logprobs = prompt_logits(self.model, hidden[self._to_device(inp.prompt_logprob_index)])
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
        """Prepare, forward and sample one step without waiting for the device."""
        return self._finish_step(self._start_step(out, inp))

    @torch.inference_mode()
    def start_step(self, out: SchedulerOutput, inp: StepInputs | None = None) -> Forward:
        """Queue one step's forward; ``finish_step`` samples it (grammar masks are filled in between)."""
        return self._start_step(out, inp)

    @torch.inference_mode()
    def finish_step(self, fwd: Forward, grammar=None) -> StepHandle:
        """Sample a started step (``grammar``: its masks, ``.rows`` and ``.bitmask``, or None) and start its tokens
        on their way to the host. NOTE: before the next step starts: that one reads these tokens on the device."""
        return self._finish_step(fwd, grammar)

    def _start_step(self, out: SchedulerOutput, inp: StepInputs | None) -> Forward:
        inp = inp if inp is not None else self.prepare_inputs(out)
        logits = self.execute(inp)
        prompt = prompt_logprobs(self.prompt_logprobs, out) if self.prompt_logprobs is not None else None
        return Forward(out, inp, logits, prompt)

    def _finish_step(self, fwd: Forward, grammar=None) -> StepHandle:
        out, inp, logits = fwd.out, fwd.inp, fwd.logits
        self.prev_sampled = None
        if logits is None:
            return StepHandle.ready(SampledTokens([]), fwd.prompt)
        if inp.sample_temperatures is not None:
            res = self._sample_sharded(logits, inp, out)
        else:
            res = self._sample(logits, out, grammar)
        self.prev_sampled = res.sampled_token_ids
        if self.share_sampled:
            self.tp_group.broadcast(res.sampled_token_ids, src=0)
        return StepHandle(res, [s.params.logprobs for s in out.sampled], fwd.prompt)

    def prepare_inputs(self, out: SchedulerOutput) -> StepInputs:
        """Rank 0: the step's ``StepInputs`` for every rank, marked for sharded sampling where it applies."""
        temps = None
        if self.sharded_sampling and out.sampled:
            temps = sharded_temperatures([s.params for s in out.sampled], [s.num_output_tokens for s in out.sampled],
                                         self.vocab_size, self.sampler.fused)
        return build_step_inputs(out, self.block_size, temps)

    def _sample_sharded(self, logits: torch.Tensor, inp: StepInputs, out: SchedulerOutput) -> SamplerOutput:
        """Rank 0's side of a sharded sampling step (``logits``: its own vocabulary slice)."""
        keys = seeded_keys([s.params for s in out.sampled], [s.num_output_tokens for s in out.sampled])
        self.num_sharded_steps += 1
        return SamplerOutput(self.shard_sampler(logits, inp.sample_temperatures, keys))

    def _sample(self, logits: torch.Tensor, out: SchedulerOutput, grammar=None) -> SamplerOutput:
        rows = out.sampled
        params = [s.params for s in rows]
        if any(s.penalty_token_ids is not None for s in rows):
            prompts = [s.penalty_token_ids[0] if s.penalty_token_ids else () for s in rows]
            outputs = [s.penalty_token_ids[1] if s.penalty_token_ids else range(s.num_output_tokens) for s in rows]
        else:  # NOTE: without penalties only the output lengths are read (seeds, min_tokens): no copies
            prompts, outputs = [()] * len(rows), [range(s.num_output_tokens) for s in rows]
        meta = build_sampling_metadata(params, prompts, outputs, self.eos_token_ids, self.device, self.vocab_size,
                                       grammar=(grammar.rows, grammar.bitmask) if grammar is not None else None)
        return self.sampler(logits, meta)
