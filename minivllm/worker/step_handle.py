"""A launched step between the runner's two halves: ``Forward`` (its forward queued, its sampling not) and
``StepHandle`` (its sampled tokens on their way from the device to the host)."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch

from minivllm.core.scheduler_output import SchedulerOutput
from minivllm.sample.prompt_logprobs import PromptLogprobs
from minivllm.sampling_params import SamplingParams
from minivllm.worker.input_batch import StepInputs
from minivllm.worker.outputs import SampledTokens


class Forward(NamedTuple):
    """A step whose forward is queued and whose sampling is not: ``ModelRunner.finish_step`` takes it. It holds
    what sampling needs, so that the next step's news may change the batch before it is sampled."""

    out: SchedulerOutput
    logits: torch.Tensor | None  # [sampled rows, vocab] (a sharded step: this rank's slice)
    prompt: PromptLogprobs | None
    params: list[SamplingParams]  # of the sampled rows
    bad_words: list[tuple[tuple[int, ...], ...]] | None  # of the sampled rows (None: no row has any)
    temperatures: np.ndarray | None  # [sampled rows]: the step samples each rank's slice (None: gathered)
    inputs: StepInputs | None = None  # the step's inputs (speculative decoding: the proposer reads them)
    hidden_states: torch.Tensor | None = None  # [step tokens, 3 * hidden]: EAGLE-3's target streams (aux_layers)


class StepHandle:
    """A launched step's sampled tokens on their way to the host; ``result()`` waits for them.

    On CUDA the device-to-host copies go to pinned memory right after the sampler's kernels and
    a CUDA event marks their end, so the host can launch the next step before waiting.
    """

    def __init__(self, res, want: list[int | None], prompt: PromptLogprobs | None = None,
                 want_ids: list[list[int] | None] | None = None):
        """``want``: each row's number of alternatives (None: no logprobs); ``want_ids``: each row's
        ``logprob_token_ids`` (None: its top ``want`` instead)."""
        self._done: SampledTokens | None = None
        self.want, self.want_ids, self.prompt = want, want_ids, prompt
        tensors = [res.sampled_token_ids]
        self.has_logprobs = res.logprobs is not None and any(w is not None for w in want)
        if self.has_logprobs:
            b = len(want)
            tensors += [res.logprobs,
                        res.top_logprobs_ids if res.top_logprobs_ids is not None else torch.empty(b, 0),
                        res.top_logprobs if res.top_logprobs is not None else torch.empty(b, 0),
                        res.token_id_logprobs if res.token_id_logprobs is not None else torch.empty(b, 0)]
        self.event = None
        if tensors[0].device.type == "cuda":
            host = []
            for t in tensors:
                h = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
                h.copy_(t, non_blocking=True)
                host.append(h)
            tensors = host
            self.event = torch.cuda.Event()
            self.event.record()
        self.tensors = tensors

    @classmethod
    def ready(cls, sampled: SampledTokens, prompt: PromptLogprobs | None = None) -> StepHandle:
        """A handle of a step that sampled nothing (its prompt logprobs, if any, still on their way)."""
        handle = cls.__new__(cls)
        handle._done, handle.prompt = sampled, prompt
        return handle

    @property
    def resolved(self) -> bool:
        """``result()`` has been taken (it returns at once)."""
        return self._done is not None

    def result(self) -> SampledTokens:
        if self._done is None:
            if self.event is not None:
                self.event.synchronize()
            lists = [t.tolist() for t in self.tensors]
            if self.has_logprobs:
                ids, lps, top_ids, top_lps, chosen = lists
                self._done = SampledTokens(ids, lps, top_ids, top_lps, self.want, chosen_ids=self.want_ids,
                                           chosen_logprobs=chosen)
            else:
                self._done = SampledTokens(lists[0])
            self.tensors = None
        if self.prompt is not None:
            self._done.prompt_logprobs = self.prompt.result()
            self.prompt = None
        return self._done
