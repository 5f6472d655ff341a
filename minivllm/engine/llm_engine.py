"""LLMEngine: joins the scheduler (bookkeeping) and the model runner (tensors); tokenizes and detokenizes."""

from __future__ import annotations

import time
import weakref
from dataclasses import replace
from itertools import count

from minivllm.config import Config
from minivllm.core.block_manager import BlockManager
from minivllm.core.scheduler import Scheduler
from minivllm.core.scheduler_output import SchedulerOutput
from minivllm.core.sequence import Sequence
from minivllm.engine.detokenizer import IncrementalDetokenizer, special_token_ids
from minivllm.engine.generate import GenerateMixin
from minivllm.engine.input_processor import InputProcessorMixin
from minivllm.engine.request_state import RequestState
from minivllm.engine.structured_output import StructuredOutputManager, StructuredOutputMixin
from minivllm.engine.tokenizer import bad_words_token_ids, load_tokenizer
from minivllm.outputs import RequestOutput, StepStats
from minivllm.sampling_params import SamplingParams


class LLMEngine(InputProcessorMixin, StructuredOutputMixin, GenerateMixin):
    """The offline engine: ``add_request`` / ``step`` / ``is_finished``, and ``generate`` on top."""

    def __init__(self, model: str, **kwargs):
        self.config = config = Config.create(model, **kwargs)
        if config.parallel_config.data_parallel_size > 1:
            raise ValueError("data_parallel_size > 1: one engine is one replica; LLM(model, data_parallel_size=N) "
                             "and `minivllm serve --data-parallel-size N` run N of them on Ray")
        mc, cc, sc = config.model_config, config.cache_config, config.scheduler_config
        from minivllm.worker.executor import create_executor

        self.executor = create_executor(config)
        self.num_kvcache_blocks = self.executor.num_kvcache_blocks
        self.tokenizer = load_tokenizer(mc.model)
        self.special_ids = special_token_ids(self.tokenizer) if self.tokenizer is not None else frozenset()
        eos = list(mc.arch.eos_token_ids)
        if not eos and self.tokenizer is not None and self.tokenizer.eos_token_id is not None:
            eos = [self.tokenizer.eos_token_id]
        self.eos_token_ids = eos
        self.block_manager = BlockManager(self.num_kvcache_blocks, cc.kvcache_block_size, cc.enable_prefix_caching)
        self.scheduler = Scheduler(
            self.block_manager, max_num_seqs=sc.max_num_seqs, max_num_batched_tokens=sc.max_num_batched_tokens,
            max_model_len=mc.max_model_len, eos_token_ids=eos, enable_chunked_prefill=sc.enable_chunked_prefill,
            max_num_partial_prefills=sc.max_num_partial_prefills,
            max_long_partial_prefills=sc.max_long_partial_prefills,
            long_prefill_threshold=sc.long_prefill_threshold)
        self.structured = None if self.tokenizer is None else StructuredOutputManager(
            self.tokenizer, mc.arch.vocab_size, eos, config.structured_outputs_config)
        self._awaiting_grammar: dict[str, tuple[RequestState, object]] = {}  # request id -> (state, compile future)
        self._requests: dict[str, RequestState] = {}
        self._seq_to_request: dict[int, tuple[RequestState, int]] = {}
        # asynchronous scheduling: the launched step whose tokens are not on the host yet
        self._inflight: tuple[SchedulerOutput, object] | None = None
        self._pending = None  # a step whose forward runs while its grammar masks are filled (StructuredOutputMixin)
        self._penalized: set[str] = set()  # live requests whose sampling reads their token values (penalties, bad words)
        self._ids = count()
        self._seq_ids = count()
        # NOTE: a finalizer (not atexit.register(self.close)) so a dropped engine can be collected;
        # it also runs at interpreter exit.
        self._finalizer = weakref.finalize(self, _close, self.executor, self.structured)

    def add_request(self, prompt: str | list[int], sampling_params: SamplingParams | None = None,
                    request_id: str | None = None, stream: bool = False, strict_length: bool = False) -> str:
        """Queue a prompt; returns its request id. Raises ValueError (engine unchanged) on bad input.

        ``stream=True`` reports every new token from ``step()`` (offline requests report once, when
        finished). ``strict_length=True`` (the OpenAI server) also rejects a request whose prompt
        plus ``max_tokens`` exceeds ``max_model_len``, instead of cutting it at that length.
        """
        params = sampling_params or SamplingParams()
        text, token_ids = self._tokenize(prompt, params)
        if strict_length and params.max_tokens is not None:
            total, limit = len(token_ids) + params.max_tokens, self.config.model_config.max_model_len
            if total > limit:
                raise ValueError(
                    f"This model's maximum context length is {limit} tokens. However, you requested {total} "
                    f"tokens ({len(token_ids)} in the prompt, {params.max_tokens} in the completion). Please "
                    f"reduce the length of the prompt or the completion.")
        return self._add(text, token_ids, params, request_id, stream)

    def _add(self, text: str | None, token_ids: list[int], params: SamplingParams,
             request_id: str | None = None, stream: bool = False) -> str:
        self._validate(token_ids, params)
        if params.bad_words and not params.bad_words_token_ids:  # NOTE: derived once, by this engine's tokenizer
            params.bad_words_token_ids = bad_words_token_ids(self.tokenizer, params.bad_words)
        request_id = request_id if request_id is not None else str(next(self._ids))
        if request_id in self._requests:
            raise ValueError(f"request id {request_id!r} is already in use")
        req = RequestState(request_id, text, token_ids, params, stream)
        for i in range(params.n):
            p = params if params.n == 1 or params.seed is None else replace(params, seed=params.seed + i)
            seq = Sequence(next(self._seq_ids), token_ids, p,
                           request_id=f"{request_id}-{i}" if params.n > 1 else request_id,
                           prompt_logprobs=params.prompt_logprobs if i == 0 else None)
            needs_detok = stream or bool(p.stop_strings)
            req.seqs.append(seq)
            req.detoks.append(IncrementalDetokenizer(
                self.tokenizer, token_ids, skip_special_tokens=p.skip_special_tokens, stop=p.stop_strings,
                include_stop_str_in_output=p.include_stop_str_in_output, min_tokens=p.min_tokens,
                special_ids=self.special_ids) if needs_detok and self.tokenizer is not None else None)
        for i, seq in enumerate(req.seqs):
            self._seq_to_request[seq.seq_id] = (req, i)
        self._requests[request_id] = req
        so = params.structured_outputs
        if so is not None and not self.structured.cached(so):
            # NOTE: compiled on the grammar thread; the request joins the scheduler when it is ready (step)
            self._awaiting_grammar[request_id] = (req, self.structured.submit(so))
        else:
            self._schedule(req, self.structured.prepare(so) if so is not None else None)
        if params.needs_output_tokens:
            self._penalized.add(request_id)
        return request_id

    def abort_request(self, request_id: str) -> None:
        """Stop a request now and free its KV blocks; unknown ids are ignored."""
        req = self._requests.pop(request_id, None)
        self._penalized.discard(request_id)
        if req is None:
            return
        scheduled = self._awaiting_grammar.pop(request_id, None) is None
        for i, seq in enumerate(req.seqs):
            if scheduled:
                self.scheduler.finish(seq, "abort")
            if self.structured is not None:
                self.structured.drop(seq.seq_id)
            self._seq_to_request.pop(seq.seq_id, None)
            if req.output.outputs[i].finish_reason is None:
                req.output.outputs[i].finish_reason = "abort"
        req.output.finished = True

    # ------------------------------------------------------------------- step
    def is_finished(self) -> bool:
        return self.scheduler.is_finished()

    def has_unfinished_requests(self) -> bool:
        return bool(self._requests)

    def step(self) -> tuple[list[RequestOutput], StepStats]:
        """Schedule, run the model, sample, and update requests.

        Returns the outputs of the requests that got tokens this step (``finished`` set on
        those that ended) and the step's ``StepStats``. With ``async_scheduling`` the step
        launched here reports at the next call: each call launches step N+1 and only then
        waits for step N's tokens, so the host prepares a step while the device runs one.
        """
        t0 = time.perf_counter()
        touched: dict[str, RequestState] = {}
        if self._awaiting_grammar:
            self._admit_compiled(touched)
        if (self._inflight is not None or self._pending is not None) and self._penalized and any(
                seq.sampling_params.needs_output_tokens for seq in self.scheduler.running):
            # NOTE: penalties and bad words read the token values: the step in flight reports before scheduling
            self._sample_pending()
            self._resolve(self._inflight, touched)
            self._inflight = None
        sched = self.scheduler.schedule()
        self._sample_pending()  # NOTE: before the next forward, which reads its tokens on the device
        launched = self._launch(sched) if not sched.is_empty else None
        previous, self._inflight = self._inflight, launched
        if previous is not None:
            self._resolve(previous, touched)
        if self._pending is not None:
            self._pending.fill = self.structured.fill_async(self._pending.sched)  # grammars hold every token now
        if not self.config.scheduler_config.async_scheduling:
            self._sample_pending()
            if self._inflight is not None:
                self._resolve(self._inflight, touched)
                self._inflight = None
        outputs = [self._snapshot(req) for req in touched.values()]
        bm = self.block_manager
        stats = StepStats(
            num_prefill_tokens=sched.num_prefill_tokens, num_decode_tokens=sched.num_decode_tokens,
            num_running=len(self.scheduler.running), num_waiting=len(self.scheduler.waiting),
            num_preempted=len(sched.preempted_seq_ids), num_scheduled_seqs=len(sched.rows),
            kv_blocks_used=bm.num_used_blocks, kv_blocks_total=bm.num_blocks,
            prefix_cache_hit_tokens=sched.num_cached_tokens, prefix_cache_query_tokens=sched.num_admitted_tokens,
            step_time=time.perf_counter() - t0)
        return outputs, stats

    def _resolve(self, launched: tuple[SchedulerOutput, object], touched: dict[str, RequestState]) -> None:
        """Wait for a launched step's tokens, hand them to the scheduler and the requests."""
        sched, handle = launched
        sampled = handle.result()
        for seq_id, first, entries in sampled.prompt_logprobs or ():
            owner = self._seq_to_request.get(seq_id)
            if owner is not None:
                owner[0].on_prompt_logprobs(first, entries)
        updated = self.scheduler.update_from_output(sched, sampled.token_ids)
        now = time.monotonic()
        grammars = self.structured.grammars if self.structured is not None else None
        for row, seq in updated:
            req, i = self._seq_to_request[seq.seq_id]
            if grammars and seq.seq_id in grammars and self.structured.accept(seq.seq_id, sampled.token_ids[row]):
                if not seq.is_finished:  # NOTE: the grammar is complete: nothing but EOS may follow
                    self.scheduler.finish(seq, "stop")
            req.on_token(i, seq, sampled.token_ids[row], sampled.logprobs_of(row), now, self.scheduler.finish)
            if req.stream or seq.is_finished:  # NOTE: offline requests report only at the end
                touched[req.request_id] = req

    def _snapshot(self, req: RequestState) -> RequestOutput:
        """The request's report for this step; forgets it once every completion has finished."""
        out, finished_seq_ids = req.snapshot(self.decode)
        for seq_id in finished_seq_ids:
            self._seq_to_request.pop(seq_id, None)
            if self.structured is not None:
                self.structured.drop(seq_id)
        if out.finished:
            self._requests.pop(req.request_id, None)
            self._penalized.discard(req.request_id)
        return out

    def decode(self, token_ids: list[int], skip_special_tokens: bool = True) -> str:
        if self.tokenizer is None:
            return ""
        n = len(self.tokenizer)
        return self.tokenizer.decode([t for t in token_ids if t < n], skip_special_tokens=skip_special_tokens)

    # -------------------------------------------------------------- lifecycle
    def close(self) -> None:
        """Release the model, the KV cache and any worker processes (idempotent)."""
        finalizer = getattr(self, "_finalizer", None)
        if finalizer is not None:
            finalizer()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _close(executor, structured) -> None:
    executor.close()
    if structured is not None:
        structured.close()
