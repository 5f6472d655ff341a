"""LLMEngine: one engine step, from scheduling to outputs. It joins the scheduler (bookkeeping), the executor
(tensors), the grammars of structured outputs, tokenizing and detokenizing."""

from __future__ import annotations

import time
import weakref
from collections.abc import Iterable
from concurrent.futures import Future
from dataclasses import dataclass, replace
from itertools import count

from minivllm.config import Config
from minivllm.core.block_manager import BlockManager
from minivllm.core.kv_cache_manager import KVCacheManager
from minivllm.core.scheduler import Scheduler
from minivllm.core.scheduler_output import SchedulerOutput
from minivllm.core.sequence import Sequence
from minivllm.engine.detokenizer import IncrementalDetokenizer, special_token_ids
from minivllm.engine.input_processor import EngineRequest, InputProcessor
from minivllm.engine.progress import BatchProgress
from minivllm.engine.request_state import RequestState
from minivllm.engine.spec_decode_stats import SpecDecodeCounters
from minivllm.engine.structured_output import GrammarBitmask, StructuredOutputManager
from minivllm.engine.tokenizer import load_tokenizer
from minivllm.lora.request import LoRARequest
from minivllm.outputs import RequestOutput, StepStats
from minivllm.sample.metadata import watermark_history
from minivllm.sampling_params import SamplingParams
from minivllm.worker.executor import create_executor
from minivllm.worker.step_handle import Forward, StepHandle


@dataclass
class InFlightStep:
    """The step launched last, whose tokens have not reached the requests yet.

    Its phase: *queued* while only its forward is (a sampled row is under a grammar, so sampling waits for the
    rows' masks, ``masks``, filled on the mask thread while the forward runs); *sampled* once its tokens are
    on their way to the host (``tokens``). With asynchronous scheduling the next ``step()`` launches the next
    step before it takes these tokens; it samples a queued step first, since the next forward reads its tokens
    on the device.
    """

    sched: SchedulerOutput
    forward: Forward | None  # until sampled
    masks: Future[GrammarBitmask | None] | None = None  # the grammar masks being filled (a queued step)
    tokens: StepHandle | None = None  # once sampled

    @property
    def phase(self) -> str:
        return "sampled" if self.tokens is not None else "queued"


class LLMEngine:
    """The offline engine: ``add_request`` / ``step`` / ``has_unfinished_requests``, and ``run_batch`` on top."""

    def __init__(self, model: str, **kwargs):
        self.config = config = Config.create(model, **kwargs)
        if config.parallel_config.data_parallel_size > 1:
            raise ValueError("data_parallel_size > 1: one engine is one replica; LLM(model, data_parallel_size=N) "
                             "and `minivllm serve --data-parallel-size N` run N of them on Ray")
        mc, cc, sc = config.model_config, config.cache_config, config.scheduler_config
        spec = config.speculative_config
        self.executor = create_executor(config)
        self.num_kvcache_blocks = self.executor.num_kvcache_blocks
        self.tokenizer = None if mc.skip_tokenizer_init else load_tokenizer(mc.model)
        self.special_ids = special_token_ids(self.tokenizer) if self.tokenizer is not None else frozenset()
        eos = list(mc.arch.eos_token_ids)
        if not eos and self.tokenizer is not None and self.tokenizer.eos_token_id is not None:
            eos = [self.tokenizer.eos_token_id]
        self.eos_token_ids = eos
        # one block pool per KV cache group (one for a model of one attention type)
        self.block_manager = KVCacheManager([
            BlockManager(n, cc.kvcache_block_size, cc.enable_prefix_caching, sliding_window=window)
            for window, n in self.executor.kv_cache_groups])
        self.scheduler = Scheduler(
            self.block_manager, max_num_seqs=sc.max_num_seqs, max_num_batched_tokens=sc.max_num_batched_tokens,
            max_model_len=mc.max_model_len, eos_token_ids=eos, enable_chunked_prefill=sc.enable_chunked_prefill,
            max_num_partial_prefills=sc.max_num_partial_prefills,
            max_long_partial_prefills=sc.max_long_partial_prefills,
            long_prefill_threshold=sc.long_prefill_threshold,
            max_loras=config.lora_config.max_loras if config.lora_config.enable_lora else 0,
            num_speculative_tokens=spec.num_speculative_tokens if spec is not None else 0,
            disable_by_batch_size=spec.disable_by_batch_size if spec is not None else None)
        self.structured = None if self.tokenizer is None else StructuredOutputManager(
            self.tokenizer, mc.arch.vocab_size, eos, config.structured_outputs_config)
        self.processor = InputProcessor(config, self.tokenizer, self.structured)
        self.async_scheduling = sc.async_scheduling
        self.speculative = spec is not None
        # speculative decoding's counters since the engine started, and those of the results not yet reported
        self.spec_totals = SpecDecodeCounters(spec.num_speculative_tokens if spec is not None else 0)
        self._spec_step = SpecDecodeCounters(self.spec_totals.k)
        self._requests: dict[str, RequestState] = {}
        self._seq_to_request: dict[int, tuple[RequestState, int]] = {}
        self._in_flight: InFlightStep | None = None
        # live requests whose sampling reads token values on the host (bad words of several tokens)
        self._value_readers: set[str] = set()
        self._ids = count()
        self._seq_ids = count()
        # a finalizer (not atexit.register(self.close)) so a dropped engine can be collected;
        # it also runs at interpreter exit.
        self._finalizer = weakref.finalize(self, _close, self.executor, self.structured)

    # --------------------------------------------------------------- requests
    def add_request(self, prompt: str | list[int], sampling_params: SamplingParams | None = None,
                    request_id: str | None = None, stream: bool = False, strict_length: bool = False,
                    lora_request: LoRARequest | None = None) -> str:
        """Queue a prompt; returns its request id. Raises ValueError (engine unchanged) on bad input.

        ``stream=True`` reports every new token from ``step()`` (offline requests report once, when
        finished). ``strict_length=True`` (the OpenAI server) also rejects a request whose prompt
        plus ``max_tokens`` exceeds ``max_model_len``, instead of cutting it at that length.
        ``lora_request``: the LoRA adapter to run with (None: the base model; needs ``enable_lora``).
        """
        if request_id is not None and request_id in self._requests:
            raise ValueError(f"request id {request_id!r} is already in use")
        return self._add(self.processor.process(prompt, sampling_params, strict_length, lora_request), request_id,
                         stream)

    def _add(self, request: EngineRequest, request_id: str | None = None, stream: bool = False) -> str:
        """Queue a processed request: one sequence per completion, scheduled now or once its grammar compiled."""
        params = request.params
        request_id = request_id if request_id is not None else str(next(self._ids))
        req = RequestState(request_id, request.prompt, request.prompt_token_ids, params, stream)
        for i in range(params.n):
            p = params if params.n == 1 or params.seed is None else replace(params, seed=params.seed + i)
            seq = Sequence(next(self._seq_ids), request.prompt_token_ids, p,
                           request_id=f"{request_id}-{i}" if params.n > 1 else request_id,
                           prompt_logprobs=params.prompt_logprobs if i == 0 else None,
                           bad_words_token_ids=request.bad_words_token_ids,
                           watermark_history=watermark_history(self.config.sampling_config.watermark_config, p),
                           thinking_budget=request.thinking_budget, lora_request=request.lora_request)
            req.seqs.append(seq)
            req.detoks.append(IncrementalDetokenizer(
                self.tokenizer, request.prompt_token_ids, skip_special_tokens=p.skip_special_tokens,
                stop=p.stop_strings, include_stop_str_in_output=p.include_stop_str_in_output,
                min_tokens=p.min_tokens, special_ids=self.special_ids)
                if (stream or p.stop_strings) and self.tokenizer is not None else None)
            self._seq_to_request[seq.seq_id] = (req, i)
        self._requests[request_id] = req
        so = params.structured_outputs
        if so is not None and not self.structured.cached(so):
            self.structured.submit(request_id, so)  # joins the scheduler once compiled (step)
        else:
            self._schedule(req, self.structured.prepare(so) if so is not None else None)
        if req.seqs[0].reads_output_values:
            self._value_readers.add(request_id)
        return request_id

    def _schedule(self, req: RequestState, grammar) -> None:
        """Hand the request's sequences to the scheduler, each at the start of ``grammar``'s template if any (or
        waiting for its ``starts_after`` marker)."""
        so = req.params.structured_outputs
        for seq in req.seqs:
            if grammar is not None:
                self.structured.start(seq.seq_id, grammar, so.starts_after, so.opened_by)
            self.scheduler.add(seq)

    def abort_request(self, request_id: str) -> None:
        """Stop a request now and free its KV blocks; unknown ids are ignored."""
        req = self._requests.pop(request_id, None)
        self._value_readers.discard(request_id)
        if req is None:
            return
        compiling = self.structured is not None and self.structured.cancel(request_id)
        for i, seq in enumerate(req.seqs):
            if not compiling:
                self.scheduler.finish(seq, "abort")
            if self.structured is not None:
                self.structured.drop(seq.seq_id)
            self._seq_to_request.pop(seq.seq_id, None)
            if req.output.outputs[i].finish_reason is None:
                req.output.outputs[i].finish_reason = "abort"
        req.output.finished = True

    def has_unfinished_requests(self) -> bool:
        return bool(self._requests)

    # ------------------------------------------------------------------ LoRA
    def add_lora(self, lora_request: LoRARequest) -> bool:
        """Make a LoRA adapter known, its folder checked now (ValueError naming what is wrong); True once known.
        A request may also name an adapter never added: it is checked and added then."""
        return self.processor.loras.resolve(lora_request, required=True) is not None

    def remove_lora(self, lora_int_id: int) -> bool:
        """Forget a LoRA adapter (requests already queued with it still finish with it; the id may then name
        another folder); False if unknown."""
        if self.scheduler.lora_slots is not None:
            self.scheduler.lora_slots.forget(lora_int_id)
        return self.processor.loras.remove(lora_int_id)

    def list_loras(self) -> set[int]:
        """The ids of the known LoRA adapters (vLLM's ``list_loras``); ``lora_adapters()`` gives them whole."""
        return {lora.lora_int_id for lora in self.processor.loras.list()}

    def lora_adapters(self) -> list[LoRARequest]:
        """The known LoRA adapters, in the order they were added."""
        return self.processor.loras.list()

    # ------------------------------------------------------------------- step
    def step(self) -> tuple[list[RequestOutput], StepStats]:
        """Schedule, run the model, sample, and update requests.

        Returns the outputs of the requests that got tokens this step (``finished`` set on
        those that ended) and the step's ``StepStats``. With ``async_scheduling`` the step
        launched here reports at the next call: each call launches step N+1 and only then
        takes step N's tokens, so the host prepares a step while the device runs one.
        """
        t0 = time.perf_counter()
        touched: dict[str, RequestState] = {}
        # requests whose grammar finished compiling join the scheduler
        if self.structured is not None and self.structured.num_compiling:
            touched.update(self._admit_compiled())
        # bad words of several tokens read the newest token values, and drafts follow the newest token: the step
        # in flight reports before scheduling
        if self._in_flight is not None and (self._drafts_need_values(self._in_flight) or self._value_readers and any(
                seq.reads_output_values for seq in self.scheduler.running)):
            touched.update(self._resolve(self._sample(self._in_flight)))
            self._in_flight = None
        sched = self.scheduler.schedule()
        if sched.new_requests:
            self._mark_scheduled(sched)
        # the step in flight is sampled before the next forward, which reads its tokens on the device
        previous = self._sample(self._in_flight) if self._in_flight is not None else None
        self._in_flight = self._launch(sched) if not sched.is_empty else None
        if previous is not None:
            touched.update(self._resolve(previous))
        # the grammars now hold every token before this step's: its masks are filled while its forward runs
        if self._in_flight is not None and self._in_flight.phase == "queued":
            self._in_flight.masks = self.structured.fill_async(sched)
        if not self.async_scheduling and self._in_flight is not None:
            touched.update(self._resolve(self._sample(self._in_flight)))
            self._in_flight = None
        outputs = [self._snapshot(req) for req in touched.values()]
        bm = self.block_manager
        stats = StepStats(
            num_prefill_tokens=sched.num_prefill_tokens, num_decode_tokens=sched.num_decode_tokens,
            num_running=len(self.scheduler.running), num_waiting=len(self.scheduler.waiting),
            num_preempted=len(sched.preempted_seq_ids), num_scheduled_seqs=len(sched.rows),
            kv_blocks_used=bm.num_used_blocks, kv_blocks_total=bm.num_blocks,
            prefix_cache_hit_tokens=sched.num_cached_tokens, prefix_cache_query_tokens=sched.num_admitted_tokens,
            step_time=time.perf_counter() - t0)
        if self._spec_step.num_drafts:
            self._spec_step = self._spec_step.report(stats)
        return outputs, stats

    def _drafts_need_values(self, step: InFlightStep) -> bool:
        """Speculative decoding: the step in flight reports before the next is scheduled when it verified drafts
        (how many tokens it adds is unknown until then), when the next may carry drafts (they follow its tokens),
        or under tensor parallelism (only rank 0 reads a step's tokens on the device)."""
        return self.speculative and (step.sched.num_draft_tokens > 0 or self.scheduler.may_speculate()
                                     or self.config.parallel_config.tensor_parallel_size > 1)

    def _mark_scheduled(self, sched: SchedulerOutput) -> None:
        """The time a request's first sequence was first scheduled (not again after a preemption)."""
        now = time.monotonic()
        for new in sched.new_requests:
            owner = self._seq_to_request.get(new.seq_id)
            if owner is not None and owner[0].output.scheduled_time is None:
                owner[0].output.scheduled_time = now

    def _admit_compiled(self) -> dict[str, RequestState]:
        """Schedule the requests whose grammars finished compiling (waiting a moment when nothing else can run);
        a request whose grammar failed finishes with ``abort``, and is reported."""
        failed = {}
        for request_id, grammar, error in self.structured.take_compiled(wait=self.scheduler.is_finished()):
            req = self._requests.get(request_id)
            if req is None:  # aborted meanwhile
                continue
            if error is None:
                self._schedule(req, grammar)
                continue
            for out in req.output.outputs:
                out.finish_reason = "abort"
            failed[request_id] = req
        return failed

    def _launch(self, sched: SchedulerOutput) -> InFlightStep:
        """Queue a step's forward; sample it at once unless a sampled row is under a grammar (it then waits for
        its masks: ``_sample``)."""
        forward = self.executor.start_step(sched)
        if self.structured is not None and self.structured.constrains(sched):
            return InFlightStep(sched, forward)
        return InFlightStep(sched, None, tokens=self.executor.finish_step(forward))

    def _sample(self, step: InFlightStep) -> InFlightStep:
        """Sample a queued step with its grammar masks (waiting for them); its tokens start for the host."""
        if step.tokens is None:
            masks = step.masks.result() if step.masks is not None else self.structured.bitmask(step.sched)
            step.tokens = self.executor.finish_step(step.forward, masks)
            step.forward = step.masks = None
        return step

    def _resolve(self, step: InFlightStep) -> dict[str, RequestState]:
        """Wait for a sampled step's tokens, hand them to the scheduler, the grammars and the requests; returns the
        requests that have something to report."""
        sched = step.sched
        sampled = step.tokens.result()
        for seq_id, first, entries in sampled.prompt_logprobs or ():
            owner = self._seq_to_request.get(seq_id)
            if owner is not None:
                owner[0].on_prompt_logprobs(first, entries)
        updated = self.scheduler.update_from_output(sched, sampled.new_tokens(), sampled.draft_token_ids)
        if self.speculative:
            self.spec_totals.add(sampled)
            self._spec_step.add(sampled)
        now = time.monotonic()
        grammars = self.structured.grammars if self.structured is not None else None
        report: dict[str, RequestState] = {}
        for row, seq in updated:
            req, i = self._seq_to_request[seq.seq_id]
            tokens = sampled.tokens_of(row)[:seq.num_new_tokens]  # one, or the accepted drafts and one more
            for j, token in enumerate(tokens):
                complete = bool(grammars) and seq.seq_id in grammars and self.structured.accept(seq.seq_id, token)
                if complete:  # the grammar is complete: nothing but EOS may follow
                    if not seq.is_finished:
                        self.scheduler.finish(seq, "stop")
                    elif j < len(tokens) - 1:  # a later accepted token had ended it: the grammar ends it here
                        seq.finish_reason, seq.stop_reason = "stop", None
                if req.on_token(i, seq, token, sampled.logprobs_of(row, j), now, self.scheduler.finish,
                                last=complete or j == len(tokens) - 1):
                    break  # tokens after a stop string or the grammar's end are dropped
            if req.stream or seq.is_finished:  # offline requests report only at the end
                report[req.request_id] = req
        return report

    def _snapshot(self, req: RequestState) -> RequestOutput:
        """The request's report for this step; forgets it once every completion has finished."""
        out, finished_seq_ids = req.snapshot(self.decode)
        for seq_id in finished_seq_ids:
            self._seq_to_request.pop(seq_id, None)
            if self.structured is not None:
                self.structured.drop(seq_id)
        if out.finished:
            self._requests.pop(req.request_id, None)
            self._value_readers.discard(req.request_id)
        return out

    def decode(self, token_ids: list[int], skip_special_tokens: bool = True) -> str:
        """The text of ``token_ids`` (ids past the tokenizer's vocabulary give none)."""
        if self.tokenizer is None:
            return ""
        n = len(self.tokenizer)
        return self.tokenizer.decode([t for t in token_ids if t < n], skip_special_tokens=skip_special_tokens)

    # ---------------------------------------------------------------- batches
    def run_batch(self, prompts: Iterable[str | list[int]], params: Iterable[SamplingParams],
                  use_tqdm: bool = True, lora_requests: Iterable[LoRARequest | None] | None = None
                  ) -> list[RequestOutput]:
        """Run prompts to completion (``params[i]`` and ``lora_requests[i]`` for ``prompts[i]``; None: no adapter);
        their outputs in prompt order. Every request is checked before any is queued; on any error (or ^C) the
        batch's requests are aborted."""
        ids = [self._add(r) for r in self.processor.process_batch(prompts, params, lora_requests)]
        results: dict[str, RequestOutput] = {}
        pbar = BatchProgress(len(ids)) if use_tqdm else None
        try:
            pending = set(ids)
            while pending:
                outputs, stats = self.step()
                finished = 0
                for o in outputs:
                    if o.finished and o.request_id in pending:
                        results[o.request_id] = o
                        pending.discard(o.request_id)
                        finished += 1
                if pbar is not None:
                    pbar.step(stats, finished)
        except BaseException:
            for rid in ids:
                self.abort_request(rid)
            raise
        finally:
            if pbar is not None:
                pbar.close()
        return [results[rid] for rid in ids]

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
