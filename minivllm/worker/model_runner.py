"""ModelRunner: owns the model, the paged KV cache, the persistent batch and (on CUDA) the decode CUDA graphs
of one rank.

A step comes in two halves. ``start_step(scheduler_output)`` applies the step's news to the persistent batch,
builds the flattened inputs and queues the forward, without waiting for the device; ``finish_step`` samples the
rows whose tokens are all computed (with the grammar masks filled in between, if any) and returns a
``StepHandle`` whose ``result()`` brings the sampled tokens to the host. It reads only the frozen
``SchedulerOutput``, never a ``Sequence``. Rank 0 samples; other tensor-parallel ranks run ``execute_step`` on
the same scheduler output: every rank keeps its own batch, so they build the same inputs and take the same
path (a step may sample each rank's vocabulary slice, see ``minivllm.sample.sharded``).

Asynchronous scheduling feeds each step's sampled ids to the next step on the device:
``prev_sampled`` holds the newest sampled step's ``[num_sampled]`` int64 token ids (on every rank: rank 0
broadcasts them when tensor parallel), and ``execute`` writes them over the placeholders listed in
``StepInputs.prev_token_index``.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from minivllm.config import Config
from minivllm.core.kv_cache_spec import blocks_per_seq, kv_cache_groups, split_blocks
from minivllm.core.scheduler_output import SchedulerOutput
from minivllm.distributed.group import TPGroup
from minivllm.kernels.torch_backend import FP8_DTYPES
from minivllm.layers.attention import Attention
from minivllm.layers.attention_metadata import AttentionMetadata
from minivllm.models.loader import build_context, load_model_weights
from minivllm.models.registry import get_model_class
from minivllm.sample.metadata import build_sampling_metadata, seeded_keys
from minivllm.sample.penalties import PenaltyState
from minivllm.sample.prompt_logprobs import prompt_logits, prompt_logprobs
from minivllm.sample.sampler import Sampler, SamplerOutput
from minivllm.sample.sharded import ShardedSampler, sharded_temperatures
from minivllm.sampling_params import SamplingParams
from minivllm.spec_decode.factory import build_proposer
from minivllm.worker.input_batch import InputBatch, StepInputs, dummy_prefill_inputs
from minivllm.worker.kv_cache import bind_cache, block_bytes, cpu_num_blocks, gpu_num_blocks, new_cache
from minivllm.worker.outputs import SampledTokens
from minivllm.worker.spec_decode import SpeculativeStep, proposer_block_bytes
from minivllm.worker.step_handle import Forward, StepHandle

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
        mc, dc, sc = config.model_config, config.device_config, config.scheduler_config
        self.block_size = config.cache_config.kvcache_block_size
        self.dtype = TORCH_DTYPES[mc.dtype]
        self.kv_dtype = FP8_DTYPES.get(config.cache_config.kv_cache_dtype, self.dtype)
        self.device = device_for_rank(config, rank)
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        with build_context(self.device, self.dtype):
            self.model = get_model_class(mc.arch.architecture)(mc.arch, max_position=mc.max_model_len,
                                                               backend=dc.attention_backend, tp_group=tp_group)
        self.model.eval()
        load_model_weights(self.model, mc)
        self.lora = None  # the LoRA slots and host cache (enable_lora)
        if config.lora_config.enable_lora:
            from minivllm.lora.manager import LoRAModelManager
            from minivllm.worker.cuda_graphs import graph_batch_sizes

            # a step's tokens, or a padded decode graph's rows
            max_tokens = max(sc.max_num_batched_tokens, graph_batch_sizes(sc.max_num_seqs)[-1])
            self.lora = LoRAModelManager(self.model, config, self.device, self.dtype, max_tokens)
        self.attn_layers = [m for m in self.model.modules() if isinstance(m, Attention)]
        # the KV cache groups (one per attention type; see minivllm.core.kv_cache_spec): each its own cache
        self.kv_cache_specs = kv_cache_groups([a.sliding_window for a in self.attn_layers],
                                              hybrid=not config.cache_config.disable_hybrid_kv_cache_manager)
        self.group_layers = [[self.attn_layers[i] for i in g.layers] for g in self.kv_cache_specs]
        for group, layers in enumerate(self.group_layers):
            for layer in layers:
                layer.kv_group = group
        self.vocab_size = mc.arch.vocab_size
        self.eos_token_ids = list(mc.arch.eos_token_ids)
        spec = config.speculative_config
        self.batch = InputBatch(sc.max_num_seqs, mc.max_model_len, self.block_size, len(self.kv_cache_specs),
                                track_tokens=spec is not None and rank == 0)
        # speculative decoding: rank 0 verifies drafts and proposes the next ones (every rank computes the drafts'
        # positions, which the scheduler sends in each row's tokens)
        self.spec_step = None
        if spec is not None and rank == 0:
            self.spec_step = SpeculativeStep(build_proposer(spec, self), self.batch, spec.disable_by_batch_size)
        self.aux_layers, self.aux_hidden = self.spec_step.proposer.hidden_state_layers if self.spec_step else (), None
        self.aux_args = (self.aux_layers,) if self.aux_layers else ()  # EAGLE-3: the target streams it reads
        # sampling: rank 0, or every rank on its vocabulary slice (decided per step from the batch, the same on
        # every rank); unseeded rows draw from this engine's own generator, not torch's global one
        self.sampler = Sampler(fused=dc.triton_sampling)
        self.generator = torch.Generator(device=self.device).manual_seed(mc.seed)
        self.penalties = PenaltyState(self.vocab_size, self.device) if rank == 0 else None
        self.watermark = config.sampling_config.watermark_config  # the watermark is sampled on rank 0 alone
        self.sharded_sampling = (tp_group is not None and dc.triton_sampling and self.watermark is None
                                 and spec is None)
        self.shard_sampler = ShardedSampler(self.model.lm_head, self.device) if self.sharded_sampling else None
        self.num_sharded_steps = 0  # steps sampled sharded (a check for tests and benchmarks)
        # NOTE: with speculative decoding every step's tokens are known to the scheduler before the next is built
        self.share_sampled = tp_group is not None and sc.async_scheduling and spec is None
        self.prev_sampled: torch.Tensor | None = None
        self.graph_runner = None  # NOTE: before the profiling forward, which runs eagerly
        #: each KV cache group's ``(sliding_window, num_blocks)``, in group order (the engine's block managers')
        self.kv_cache_groups = self._init_kv_cache()
        self.num_kvcache_blocks = sum(n for _, n in self.kv_cache_groups)
        if self.spec_step is not None:  # a draft model's or head's own cache, over the same block ids
            self.spec_step.init_proposer_cache(self.kv_cache_groups[0][1], self.block_size, sc.max_num_seqs,
                                               self.kv_dtype)
        if self.device.type == "cuda" and not dc.enforce_eager and not self.aux_layers and (
                self.lora is None or self.lora.graph_safe):
            from minivllm.worker.cuda_graphs import DecodeGraphRunner

            if self.lora is not None:  # the graphs read the per-token slots from the static buffer
                self.lora.set_token_slots(None, 0, graph=True)
            self.graph_runner = DecodeGraphRunner(self.model, self.device, self.dtype, mc.arch.hidden_size,
                                                  sc.max_num_seqs, mc.max_model_len, self.block_size,
                                                  len(self.kv_cache_specs))
        self._warm_up_sampling()

    # ------------------------------------------------------------------ KV cache
    def _init_kv_cache(self) -> list[tuple[int | None, int]]:
        """Size the KV cache (the minimum over tensor-parallel ranks), allocate and bind it; returns each group's
        ``(sliding_window, num_blocks)``.

        The budget is counted in blocks over every layer (``num_kvcache_blocks`` of them when set), then split
        between the groups by what one sequence of ``max_model_len`` tokens needs in each (``split_blocks``):
        one group gets exactly that many blocks."""
        cc, sc, mc = self.config.cache_config, self.config.scheduler_config, self.config.model_config
        extra = proposer_block_bytes(self.spec_step, self.block_size, self.kv_dtype, len(self.kv_cache_specs))
        nbytes = block_bytes(self.attn_layers, self.block_size, self.kv_dtype) + extra
        max_blocks = -(-mc.max_model_len // self.block_size)
        if cc.num_kvcache_blocks is not None:
            num_blocks = cc.num_kvcache_blocks
        elif self.device.type == "cpu":
            num_blocks = cpu_num_blocks(cc.cpu_kvcache_space_gib, nbytes, sc.max_num_seqs * max_blocks + 1)
        else:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(self.device)
            self._profile_run()
            # capped at four times what max_num_seqs full-length sequences can hold (the rest could only
            # keep prefix cache): a tiny model on a large GPU would otherwise get millions of blocks
            num_blocks = gpu_num_blocks(self.device, cc.gpu_memory_utilization, nbytes,
                                        4 * sc.max_num_seqs * max_blocks + 1)
        group_bytes = [block_bytes(layers, self.block_size, self.kv_dtype) for layers in self.group_layers]
        group_bytes[0] += extra
        per_seq = [blocks_per_seq(g.sliding_window, mc.max_model_len, self.block_size) for g in self.kv_cache_specs]
        chunk = sc.max_num_batched_tokens  # one sequence's worst: its whole chunk past the window
        worst = [blocks_per_seq(g.sliding_window, mc.max_model_len, self.block_size, chunk)
                 for g in self.kv_cache_specs]
        counts = split_blocks(max(num_blocks, 0) * nbytes, group_bytes, per_seq, worst)
        if self.tp_group is not None:
            t = torch.tensor(counts, device=self.device if self.device.type == "cuda" else "cpu")
            self.tp_group.all_reduce(t, op="min")
            counts = [int(n) for n in t.tolist()]
        if min(counts) < 1:
            raise RuntimeError(
                "no memory is left for the KV cache: raise gpu_memory_utilization, lower max_num_batched_tokens, "
                "or use a smaller model")
        self.kv_caches = [new_cache(layers, n, self.block_size, self.kv_dtype, self.device)
                          for layers, n in zip(self.group_layers, counts)]
        self.kv_cache = self.kv_caches[0]  # [2, group 0's layers, blocks, block_size, kv_heads, head_dim]
        for layers, cache in zip(self.group_layers, self.kv_caches):
            bind_cache(layers, cache)
        return [(g.sliding_window, n) for g, n in zip(self.kv_cache_specs, counts)]

    @torch.inference_mode()
    def _profile_run(self) -> None:
        """One forward at the largest batch (through a throw-away cache) to measure peak activations.

        NOTE: the weights (every expert of a mixture of experts too) are allocated before, so the peak counts them.
        The prompts are all token 0, so every token of a MoE layer routes to the same experts: the torch path's
        largest per-expert batch (all rows through one expert's matmuls)."""
        sc, max_model_len = self.config.scheduler_config, self.config.model_config.max_model_len
        num_tokens = min(sc.max_num_batched_tokens, sc.max_num_seqs * max_model_len)
        seq_len = min(max_model_len, num_tokens)
        num_seqs = max(1, num_tokens // seq_len)
        per_seq = -(-seq_len // self.block_size)
        for layers in self.group_layers:
            bind_cache(layers, new_cache(layers, num_seqs * per_seq, self.block_size, self.kv_dtype, self.device))
        logits, _ = self.execute(dummy_prefill_inputs(num_seqs, seq_len, self.block_size, len(self.group_layers)),
                                 gather=True)
        del logits
        bind_cache(self.attn_layers, None)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.empty_cache()

    @torch.inference_mode()
    def _warm_up_sampling(self) -> None:
        """Run each sampling path once on two dummy rows (every rank together: the paths gather), so that their
        Triton kernels compile at start-up rather than in a user's first steps (``benchmarks/engine/
        lazy_compiles.py`` checks that)."""
        hidden = torch.zeros(2, self.config.model_config.arch.hidden_size, dtype=self.dtype, device=self.device)
        if self.sharded_sampling:  # NOTE: rank 0 decides from its own flag; every rank has the same
            shard = self.model.compute_logits(hidden, gather=False)  # [2, per_rank]
            for temps in ((0.0, 0.0), (0.6, 0.0)):  # all greedy (no noise), then noisy
                self.shard_sampler(shard, np.asarray(temps, dtype=np.float32))
        logits = self.model.compute_logits(hidden, gather=True)  # [2, vocab] on rank 0, else None
        if logits is None:
            return
        # all-greedy batches take torch.argmax: nothing to compile. The last set loads torch's sort, top-k
        # and penalty kernels (lazily loaded CUDA modules)
        filtered = SamplingParams(temperature=0.7, top_p=0.9, top_k=50, repetition_penalty=1.1, logprobs=5)
        for params in ([SamplingParams(temperature=0.6), SamplingParams(temperature=0.0)],
                       [SamplingParams(temperature=1.0)] * 2, [filtered] * 2):
            meta = build_sampling_metadata(params, [()] * 2, [()] * 2, self.eos_token_ids, self.device,
                                           self.vocab_size, generator=self.generator)
            self.sampler(logits, meta)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def release_graphs(self) -> None:
        """Drop the CUDA graphs. NOTE: NCCL frees (and aborts) a communicator only once no graph holds its kernels."""
        if self.graph_runner is not None:
            self.graph_runner.graphs.clear()
            self.graph_runner = None

    # ------------------------------------------------------------------- steps
    @torch.inference_mode()
    def start_step(self, out: SchedulerOutput) -> Forward:
        """Apply the step to the batch and queue its forward; ``finish_step`` samples it."""
        inp, temps = self._prepare(out)
        logits, prompt_slices = self.execute(inp, gather=temps is None)
        prompt = prompt_logprobs(prompt_slices, out) if prompt_slices is not None else None
        params = [self.batch.params[s.seq_id] for s in out.sampled]
        words = self.batch.bad_words
        bad_words = [words.get(s.seq_id, ()) for s in out.sampled] if words else None
        return Forward(out, logits, prompt, params, bad_words, temps, inp if self.spec_step is not None else None,
                       self.aux_hidden)

    @torch.inference_mode()
    def finish_step(self, fwd: Forward, grammar=None) -> StepHandle:
        """Sample a started step (``grammar``: its masks, ``.rows`` and ``.bitmask``, or None) and start its tokens
        on their way to the host. NOTE: before the next step starts: that one reads these tokens on the device."""
        self.prev_sampled = None
        if fwd.logits is None:
            if self.spec_step is not None and self.spec_step.proposer_layers:  # its cache still takes the tokens
                self.spec_step.catch_up(self, fwd)
            return StepHandle.ready(SampledTokens([]), fwd.prompt)
        if self.spec_step is not None and self.spec_step.verifies(fwd.out):
            return StepHandle.ready(self.spec_step.sample(self, fwd, fwd.inputs, grammar), fwd.prompt)
        if fwd.temperatures is not None:
            res = self._sample_sharded(fwd)
        else:
            res = self._sample(fwd, grammar)
        self.prev_sampled = res.sampled_token_ids
        if self.share_sampled:
            self.tp_group.broadcast(res.sampled_token_ids, src=0)
        handle = StepHandle(res, [p.num_logprobs for p in fwd.params], fwd.prompt,
                            [p.logprob_token_ids for p in fwd.params])
        if self.spec_step is not None:  # speculation off for this batch: its tokens join the history later
            self.spec_step.defer(fwd.out.sampled, handle)
        return handle

    @torch.inference_mode()
    def execute_step(self, out: SchedulerOutput) -> None:
        """A worker rank's step: the forward, its slice's share of a sharded sampling, then rank 0's sampled
        ids when they feed the next step."""
        inp, temps = self._prepare(out)
        logits, _ = self.execute(inp, gather=temps is None)
        if temps is not None and logits is not None:
            self.shard_sampler(logits, temps)
        if self.share_sampled:
            self.prev_sampled = None
            if len(inp.sample_indices):
                self.prev_sampled = torch.empty(len(inp.sample_indices), dtype=torch.int64, device=self.device)
                self.tp_group.broadcast(self.prev_sampled, src=0)

    def _prepare(self, out: SchedulerOutput) -> tuple[StepInputs, np.ndarray | None]:
        """Apply the step's news to the batch (and to the penalty statistics on rank 0); the step's inputs, and
        its rows' temperatures when every rank samples its own vocabulary slice."""
        if out.lora_loads:
            self.lora.load_slots(out.lora_loads)
        self.batch.update(out)
        if self.penalties is not None:
            for seq_id in out.finished_seq_ids:
                self.penalties.remove(seq_id)
            for req in out.new_requests:
                if req.params.has_penalties:
                    self.penalties.add(req.seq_id, req.prompt_token_ids, req.output_token_ids or ())
        if self.spec_step is not None:
            self.spec_step.update(out)
        temps = None
        if self.sharded_sampling and out.sampled:
            temps = sharded_temperatures([self.batch.params[s.seq_id] for s in out.sampled],
                                         [s.num_output_tokens for s in out.sampled], self.vocab_size,
                                         self.sampler.fused)
        return self.batch.prepare_inputs(out), temps

    # ------------------------------------------------------------------- forward
    def _to_device(self, a: np.ndarray) -> torch.Tensor:
        t = torch.from_numpy(a)
        return t.pin_memory().to(self.device, non_blocking=True) if self.device.type == "cuda" else t

    def attention_metadata(self, inp: StepInputs) -> AttentionMetadata:
        """The step's attention metadata on the device, with each further KV cache group's."""
        meta = AttentionMetadata(
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
        for slots, tables in zip(inp.group_slot_mappings, inp.group_block_tables):
            meta.group_metas.append(dataclasses.replace(
                meta, slot_mapping=self._to_device(slots), block_tables=self._to_device(tables), group_metas=[]))
        return meta

    def _prev_tokens(self, inp: StepInputs) -> torch.Tensor | None:
        """[num_placeholders] device ids to write at ``inp.prev_token_index`` (None: no placeholders)."""
        if inp.prev_token_index is None:
            return None
        prev = self.prev_sampled
        if prev is None or int(inp.prev_token_src.max()) >= prev.shape[0]:
            raise RuntimeError("a step reads sampled tokens that the previous step did not produce")
        return prev

    @torch.inference_mode()
    def execute(self, inp: StepInputs, gather: bool = True) -> tuple[torch.Tensor | None, list[torch.Tensor] | None]:
        """The forward pass on every rank: the logits of the sampled rows (rank 0: ``[rows, vocab]``; with
        ``gather=False`` every rank keeps its ``[rows, vocab / N]`` slice), and the log-softmax slices of the
        positions that give prompt logprobs (rank 0; see ``minivllm.sample.prompt_logprobs``)."""
        prev = self._prev_tokens(inp)
        graph = self.graph_runner is not None and self.graph_runner.can_run(inp)
        if self.lora is not None:
            self.lora.set_token_slots(inp.lora_slots, len(inp.input_ids), graph)
        if graph:
            hidden = self.graph_runner.run(inp, prev)
        else:
            meta = self.attention_metadata(inp)
            input_ids = self._to_device(inp.input_ids)  # [num_tokens]
            if prev is not None:
                input_ids[self._to_device(inp.prev_token_index)] = prev[self._to_device(inp.prev_token_src)]
            hidden = self.model(input_ids, self._to_device(inp.positions), meta, *self.aux_args)
            if self.aux_layers:
                hidden, self.aux_hidden = hidden
        prompt = None
        if inp.prompt_logprob_index is not None:
            prompt = prompt_logits(self.model, hidden[self._to_device(inp.prompt_logprob_index)])
        if len(inp.sample_indices) == 0:
            return None, prompt
        if len(inp.sample_indices) < hidden.shape[0]:  # all rows sampled means indices 0..n-1
            hidden = hidden[self._to_device(inp.sample_indices)]  # [rows, hidden]
        return self.model.compute_logits(hidden, gather=gather), prompt

    # ------------------------------------------------------------------- sampling
    def _sample_sharded(self, fwd: Forward) -> SamplerOutput:
        """Rank 0's side of a sharded sampling step (``fwd.logits``: its own vocabulary slice)."""
        keys = seeded_keys(fwd.params, [s.num_output_tokens for s in fwd.out.sampled])
        self.num_sharded_steps += 1
        return SamplerOutput(self.shard_sampler(fwd.logits, fwd.temperatures, keys, self.generator))

    def _sample(self, fwd: Forward, grammar=None) -> SamplerOutput:
        rows = fwd.out.sampled
        seq_ids = [s.seq_id for s in rows]
        penalized = any(p.has_penalties for p in fwd.params)
        meta = build_sampling_metadata(
            fwd.params, [()] * len(rows), [s.output_tail or () for s in rows], self.eos_token_ids, self.device,
            self.vocab_size, self.generator,
            grammar=(grammar.rows, grammar.bitmask) if grammar is not None else None,
            bad_words=fwd.bad_words,
            num_generated=[s.num_output_tokens for s in rows],
            penalty_tensors=self.penalties.gather(seq_ids) if penalized else None, watermark=self.watermark,
            forced_tokens=[s.forced_token for s in rows] if any(s.forced_token is not None for s in rows) else None)
        res = self.sampler(fwd.logits, meta)
        if self.penalties.rows:
            self.penalties.record(seq_ids, res.sampled_token_ids)
        return res
