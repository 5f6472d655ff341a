"""``POST /v1/decisions`` (vLLM's Decisions API, read as vLLM reads it on a model that generates text): each
question becomes one chat prompt, the input text then the question with its options labelled A, B, C...; the
engine generates one token greedily and reports the logprobs of the label tokens (``logprob_token_ids``); the
labels' probabilities, renormalised among themselves, are the answer's.

A predicate reads as the two options false and true (its probability is true's), a choice as its values (JSON),
a score as its levels in order (its score is the expected level, 0 for the first). ``confidence`` is the chosen
label's probability over the whole vocabulary (low when the model wanted to say something else). The label tokens
are those the chat template's generation prompt is followed by; a tokenizer whose labels are not one distinct
token there (or that has no chat template) cannot answer: 501, as vLLM."""

from __future__ import annotations

import json
import math
import string
import uuid

from fastapi import Request

from minivllm.engine.tokenizer import chat_template_args
from minivllm.entrypoints.openai import decisions_protocol as D
from minivllm.entrypoints.openai import protocol as P
from minivllm.entrypoints.openai.errors import APIError
from minivllm.entrypoints.openai.serving import OpenAIServing
from minivllm.entrypoints.openai.streams import collect
from minivllm.sampling_params import SamplingParams

#: the options' labels, in order: a capital letter is one token at the start of a reply for common tokenizers
LABELS = tuple(string.ascii_uppercase)
REPLY = "Answer with the letter of one option only."
MAX_QUESTIONS = 64  # vLLM's, for a model that reads one question per request
UNSUPPORTED = "The model does not support the Decisions API"


class DecisionServing:
    """Answers Decisions requests with the chat handler's tokenizer and engine (``serving``)."""

    def __init__(self, serving: OpenAIServing):
        self.serving = serving
        self._labels: tuple[list[int], list[int]] | None = None  # (prompt tail, label token ids), once known

    async def decide(self, req: D.DecisionRequest, raw: Request) -> dict:
        """The answers to ``req``'s questions, in order, with the tokens read (one generated token a question)."""
        serving = self.serving
        lora = serving.check_model(req.model)
        serving.llm.check_usable()
        if req.joint:
            raise APIError(400, "joint: this model reads each question on its own; joint reads need a diffusion "
                                "model", param="joint")
        if req.cache_salt is not None:
            raise APIError(400, "cache_salt is not supported by this server", param="cache_salt")
        if len(req.questions) > MAX_QUESTIONS:
            raise APIError(400, f"questions: at most {MAX_QUESTIONS} for this model", param="questions")
        tail, label_ids = self._label_tokens()
        options = [_options(q) for q in req.questions]
        state = req.input_text()
        prompts = []
        for i, opts in enumerate(options):
            ids = await serving.tokenization.chat([P.ChatMessage(role="user", content=_content(
                state, req.questions[i].instructions, opts))], _READ_ARGS)
            if ids[len(ids) - len(tail):] != tail:  # NOTE: the labels' tokens are known only after this tail
                raise APIError(501, UNSUPPORTED, type="not_implemented")
            prompts.append(ids)
        rid = f"decision-{uuid.uuid4().hex}"
        streams = []
        try:
            for i, (ids, opts) in enumerate(zip(prompts, options)):
                params = SamplingParams(max_tokens=1, temperature=0.0, logprob_token_ids=label_ids[:len(opts)])
                streams += await serving.start([ids], params, f"{rid}-{i}", lora)
        except BaseException:
            for s in streams:
                s.abort()
            raise
        finals = await collect(streams, raw)
        if any(out is None or not out.outputs[0].logprobs for out in finals):  # aborted: the client left, or a stop
            raise APIError(503, "the reads were aborted before they finished", "service_unavailable")
        answers = [_answer(q, [out.outputs[0].logprobs[0][t] for t in label_ids[:len(opts)]])
                   for q, opts, out in zip(req.questions, options, finals)]
        input_tokens = sum(len(out.prompt_token_ids) for out in finals)
        output_tokens = sum(len(out.outputs[0].token_ids) for out in finals)
        return {"model": serving.response_model(req), "answers": answers, "usage": {
            "input_tokens": input_tokens, "output_tokens": output_tokens, "total_tokens": input_tokens + output_tokens,
            "input_tokens_details": {"cached_tokens": sum(out.num_cached_tokens for out in finals),
                                     "cache_write_tokens": 0},
            "output_tokens_details": {"reasoning_tokens": 0}}}

    def _label_tokens(self) -> tuple[list[int], list[int]]:
        """The generation prompt's tokens after its last special token, and the token each label adds after them as
        a reply's first token (501 when a label is not one distinct token there)."""
        if self._labels is None:
            tok = self.serving.tokenization.tokenizer
            if tok is None or not getattr(tok, "chat_template", None):
                raise APIError(501, UNSUPPORTED, type="not_implemented")
            probe = tok.encode(tok.apply_chat_template([{"role": "user", "content": "x"}], tokenize=False,
                                                       **_READ_ARGS), add_special_tokens=False)
            special = set(tok.get_added_vocab().values())
            tail = probe[max((i + 1 for i, t in enumerate(probe) if t in special), default=0):]
            self._labels = (tail, label_token_ids(tok, tail))
        return self._labels


def label_token_ids(tok, tail: list[int]) -> list[int]:
    """The token a reply starting with each label begins with, after the prompt's ``tail`` tokens: the text's last
    token when ``tail``'s text and the label tokenize as ``tail`` plus one token; else (the tokenizer merges
    across the boundary differently, e.g. ``"\n\nA"`` as three tokens after a ``"\n\n"`` token) the label's
    own single token, which is what the model emits after the fixed prompt tokens. A 501 when a label is not one
    token or two labels share one."""
    text, ids = tok.decode(tail), []
    for label in LABELS:
        extended = tok.encode(text + label, add_special_tokens=False)
        alone = tok.encode(label, add_special_tokens=False)
        if extended[:-1] == tail:
            token = extended[-1]
        elif len(alone) == 1:
            token = alone[0]
        else:
            raise APIError(501, UNSUPPORTED, type="not_implemented")
        if token in ids:
            raise APIError(501, UNSUPPORTED, type="not_implemented")
        ids.append(token)
    return ids


# a read is the reply's first token: thinking off (templates without the switch ignore it)
_READ_ARGS = chat_template_args(True, False, None, {"enable_thinking": False}, "user")


def _options(q) -> list[tuple[str, str]]:
    """A question's options as (name, description), in label order (at most one per label: a 400 beyond)."""
    if isinstance(q, D.PredicateQuestion):
        opts = [("false", ""), ("true", "")]
    elif isinstance(q, D.ChoiceQuestion):
        opts = [(json.dumps(c.value, ensure_ascii=False), c.description) for c in q.choices]
    else:
        opts = [(level.label, level.description) for level in q.levels]
    if len(opts) > len(LABELS):
        raise APIError(400, f"This model supports at most {len(LABELS)} choices per question", param="questions")
    return opts


def _content(state: str, instructions: str, options: list[tuple[str, str]]) -> str:
    """The user turn of one read: the input, then the question and its labelled options."""
    lines = [f"{label}: {name} - {desc}" if desc else f"{label}: {name}" for label, (name, desc) in
             zip(LABELS, options)]
    body = "\n".join([*lines, REPLY])
    return f"{state}\n\n" + (f"Question: {instructions}\n{body}" if instructions else body)


def _answer(q, logprobs: list[float]) -> dict:
    """The answer of one question from its labels' logprobs."""
    top_lp = max(logprobs)
    weights = [math.exp(lp - top_lp) for lp in logprobs]
    probs = [w / sum(weights) for w in weights]
    mass = sum(math.exp(lp) for lp in logprobs)  # the labels' share of the whole vocabulary
    if isinstance(q, D.PredicateQuestion):
        return {"type": "predicate", "name": q.name, "probability": probs[1]}
    top = max(range(len(probs)), key=probs.__getitem__)
    if isinstance(q, D.ChoiceQuestion):
        return {"type": "choice", "name": q.name, "choice": q.choices[top].value, "confidence": probs[top] * mass,
                "probabilities": [{"value": c.value, "probability": p} for c, p in zip(q.choices, probs)]}
    return {"type": "score", "name": q.name, "score": sum(i * p for i, p in enumerate(probs)),
            "confidence": probs[top] * mass,
            "probabilities": [{"value": i, "label": level.label, "probability": p}
                              for i, (level, p) in enumerate(zip(q.levels, probs))]}
