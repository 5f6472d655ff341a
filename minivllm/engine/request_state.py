"""RequestState: one request's sequences, detokenizers and the output reported to the caller."""

from __future__ import annotations

import time
from dataclasses import replace

from minivllm.core.sequence import Sequence
from minivllm.engine.detokenizer import IncrementalDetokenizer
from minivllm.outputs import CompletionOutput, RequestOutput
from minivllm.sampling_params import SamplingParams


class RequestState:
    """Engine-side state of one request: its ``n`` sequences, detokenizers and output.

    ``on_token`` gathers each new token into per-completion deltas; ``snapshot`` folds the deltas
    into the request's output and returns what the caller sees for this step.
    """

    def __init__(self, request_id: str, prompt: str | None, prompt_token_ids: list[int],
                 params: SamplingParams, stream: bool):
        self.request_id = request_id
        self.params = params
        self.seqs: list[Sequence] = []
        self.detoks: list[IncrementalDetokenizer | None] = []
        self.stream = stream
        self.output = RequestOutput(request_id, prompt, prompt_token_ids,
                                    [CompletionOutput(i, logprobs=[] if params.num_logprobs is not None else None)
                                     for i in range(params.n)], arrival_time=time.monotonic(),
                                    prompt_logprobs=[None] if params.prompt_logprobs is not None else None,
                                    max_tokens=params.max_tokens)

    def on_prompt_logprobs(self, first: int, entries: list[dict]) -> None:
        """The logprob entries of prompt tokens ``first, first + 1, ...``; those already known (a recompute after
        preemption) are skipped."""
        known = self.output.prompt_logprobs
        if known is not None and first <= len(known) < first + len(entries):
            known.extend(entries[len(known) - first:])

    def on_token(self, i: int, seq: Sequence, token_id: int, logprobs: dict[int, float] | None, now: float,
                 finish, last: bool = True) -> bool:
        """Completion ``i`` (sequence ``seq``) got ``token_id``; ``finish(seq, "stop", s)`` ends it on a stop string.
        ``last``: the newest of the tokens the step gave it (speculative decoding gives several; a sequence the
        scheduler finished ends at its last one). Returns whether the completion ended at this token."""
        out = self.output.outputs[i]
        self.output.last_token_time = now
        if self.output.first_token_time is None:
            self.output.first_token_time = now
            self.output.num_cached_tokens = seq.num_cached_tokens
        out.delta_token_ids.append(token_id)
        if logprobs is not None:
            out.delta_logprobs = (out.delta_logprobs or []) + [logprobs]
        ended = seq.is_finished and last
        detok = self.detoks[i]
        if detok is not None:
            if ended and seq.finish_reason == "stop" and seq.stop_reason == token_id:
                out.delta_text += detok.finish()  # a stop token id adds no text (as in vLLM)
            else:
                out.delta_text += detok.step([token_id], finished=ended)
                if detok.finished_by_stop and not ended:
                    if seq.is_finished:  # a later token of this step had ended it: the stop string ends it here
                        seq.finish_reason, seq.stop_reason = "stop", detok.stop_reason
                    else:
                        finish(seq, "stop", detok.stop_reason)
                    ended = True
        if seq.is_finished and (ended or not last):
            out.finish_reason, out.stop_reason = seq.finish_reason, seq.stop_reason
        return ended

    def snapshot(self, decode) -> tuple[RequestOutput, list[int]]:
        """Fold the deltas gathered since the last report into the output; return a view of it.

        Also returns the seq ids of the completions that have finished. ``decode(ids,
        skip_special_tokens)`` gives the text of completions that had no detokenizer.
        NOTE: an unfinished completion's ``token_ids``/``logprobs`` in the returned object are the
        live lists (they keep growing); finished ones are final. Deltas are per report.
        """
        ro = self.output
        snaps = []
        finished_seq_ids = []
        for i, out in enumerate(ro.outputs):
            detok = self.detoks[i]
            out.token_ids.extend(out.delta_token_ids)
            if out.delta_logprobs:
                out.logprobs.extend(out.delta_logprobs)
            if detok is not None:
                out.text = detok.output_text
            elif out.finished and not out.text:
                out.text = decode(out.token_ids, self.params.skip_special_tokens)
            snaps.append(CompletionOutput(out.index, out.text, out.token_ids, out.finish_reason, out.stop_reason,
                                          out.logprobs, out.delta_text, out.delta_token_ids, out.delta_logprobs))
            out.delta_text, out.delta_token_ids, out.delta_logprobs = "", [], None
            if out.finished:
                finished_seq_ids.append(self.seqs[i].seq_id)
        ro.num_preemptions = sum(seq.num_preemptions for seq in self.seqs)
        ro.finished = all(o.finished for o in ro.outputs)
        if ro.finished:
            ro.finished_time = time.monotonic()
        return replace(ro, outputs=snaps), finished_seq_ids
