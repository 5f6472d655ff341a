"""Beam search over HTTP (vLLM's ``use_beam_search``): a request's fields as ``BeamSearchParams``, and a 400 naming
each field that beam search cannot honour.

As in vLLM, the beam width is ``n`` (the ``n`` best beams are the choices), or ``best_of`` when given (the ``n`` best
of ``best_of`` beams, vLLM's older meaning); ``max_tokens``, ``ignore_eos``, ``temperature`` (default 1, as vLLM's),
``length_penalty`` and ``include_stop_str_in_output`` map to the parameters of the same names. Completions are not
streamed with beam search (a 400, as vLLM); a streamed chat sends each choice whole once the search ends (as vLLM).
"""

from __future__ import annotations

from minivllm.beam_search import BeamSearchParams
from minivllm.entrypoints.openai import protocol as P
from minivllm.entrypoints.openai.errors import APIError

#: sampling fields that beam search has no use for, with the values that ask for nothing; vLLM ignores them, here a
#: request that sets one gets a 400 naming it rather than an output that does not do what it asked
UNHONOURED: dict[str, tuple] = {
    "top_p": (None, 1.0), "top_k": (None, -1, 0), "min_p": (None, 0.0), "repetition_penalty": (None, 1.0),
    "presence_penalty": (None, 0.0), "frequency_penalty": (None, 0.0), "stop": (None, []),
    "stop_token_ids": (None, []), "min_tokens": (0,), "logit_bias": (None, {}), "allowed_token_ids": (None,),
    "bad_words": (None, []),
}


def check_beam_search_request(req: P.SamplingRequest, constraint_field: str | None, can_stream: bool) -> None:
    """A 400 naming the field of a ``use_beam_search`` request that beam search cannot honour: ``stream`` where
    ``can_stream`` is False, a sampling field of ``UNHONOURED``, or an output constraint (``constraint_field``:
    ``response_format``, ``structured_outputs`` or ``tool_choice``)."""
    if req.stream and not can_stream:
        raise APIError(400, "streaming is not supported with beam search (use_beam_search)", param="stream")
    for name, neutral in UNHONOURED.items():
        if getattr(req, name) not in neutral:
            raise APIError(400, f"{name} is not supported with beam search (use_beam_search)", param=name)
    if constraint_field is not None:
        raise APIError(400, f"{constraint_field} is not supported with beam search (use_beam_search)",
                       param=constraint_field)


def beam_search_params(req: P.SamplingRequest, max_tokens: int, max_logprobs: int) -> BeamSearchParams:
    """The request's ``BeamSearchParams`` (a 400 naming the field of a value out of range: ``n`` or ``best_of`` for
    the width, also when the engine's ``max_logprobs`` is too small for it, ``temperature``, ``length_penalty``,
    ``max_tokens``)."""
    width_field = "best_of" if req.best_of is not None else "n"
    width = req.best_of if req.best_of is not None else req.n
    try:
        params = BeamSearchParams(beam_width=width, max_tokens=max_tokens, ignore_eos=req.ignore_eos,
                                  temperature=1.0 if req.temperature is None else req.temperature,
                                  length_penalty=req.length_penalty,
                                  include_stop_str_in_output=req.include_stop_str_in_output)
        params.check_width(max_logprobs)
        return params
    except ValueError as exc:
        message = str(exc)
        name = message.split(" ", 1)[0]
        if name == "beam_width":
            name, message = width_field, f"{width_field} (the beam width){message.removeprefix('beam_width')}"
        raise APIError(400, message, param=name) from None
