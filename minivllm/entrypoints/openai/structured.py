"""Structured outputs and tools in requests: OpenAI's ``response_format``, vLLM's ``structured_outputs``, and
``tools`` / ``tool_choice`` (their models are ``protocol``'s) turned into the one grammar a request's output must
follow.

``tool_choice: "required"`` and a named function are enforced by a JSON schema, as in vLLM: a named function's
output is its arguments object; ``required`` gives a JSON array of ``{"name", "parameters"}`` calls. Either way
the arguments always parse and validate against the tool's parameters. For gpt-oss (a server that reads harmony)
the forced choices are instead a grammar of one harmony call (``harmony_call_grammar``), and a ``response_format``
one of a harmony final message (``harmony_answer_grammar``).
"""

from __future__ import annotations

import json
from typing import Any

from minivllm.entrypoints.openai.errors import APIError
from minivllm.entrypoints.openai.protocol import (
    FunctionDefinition,
    NamedToolChoice,
    ResponseFormat,
    StructuredOutputsRequest,
    Tool,
    ToolChoice,
)
from minivllm.structured_outputs_params import StructuredOutputsParams


def _params_schema(fn: FunctionDefinition) -> dict[str, Any]:
    return fn.parameters if fn.parameters is not None else {"type": "object", "properties": {}}


def tool_schema(tools: list[Tool], choice: ToolChoice, parallel: bool) -> tuple[dict[str, Any], str | None] | None:
    """The JSON schema a tool choice enforces and the forced function's name (None for ``required``), or None
    when the choice enforces nothing (``none``, ``auto``)."""
    if isinstance(choice, NamedToolChoice):
        fn = next((t.function for t in tools if t.function.name == choice.function.name), None)
        if fn is None:
            raise APIError(400, f"tool_choice names the function {choice.function.name!r}, which is not among the "
                                f"tools", param="tool_choice")
        return _params_schema(fn), fn.name
    if choice != "required":
        return None
    params = [dict(_params_schema(t.function)) for t in tools]  # copies: the hoisting edits them
    defs = _hoist_defs(tools, params)
    calls = [{"type": "object", "properties": {"name": {"const": t.function.name}, "parameters": p},
              "required": ["name", "parameters"], "additionalProperties": False} for t, p in zip(tools, params)]
    array = {"type": "array", "minItems": 1, "items": calls[0] if len(calls) == 1 else {"anyOf": calls}}
    if not parallel:
        array["maxItems"] = 1
    if defs:
        array["$defs"] = defs
    return array, None


def _hoist_defs(tools: list[Tool], params: list[dict[str, Any]]) -> dict[str, Any]:
    """Moves each tool's ``$defs`` out of its ``params`` into one table for the root of the combined schema,
    where their ``#/$defs/...`` references point (as vLLM). Two tools may share a definition only if it is
    the same schema."""
    defs: dict[str, Any] = {}
    for tool, p in zip(tools, params):
        own = p.pop("$defs", {})
        if not isinstance(own, dict):
            raise APIError(400, f"`$defs` in the parameters of tool {tool.function.name!r} must be an object, "
                                f"got {type(own).__name__}", param="tools")
        for name, schema in own.items():
            if name in defs and defs[name] != schema:
                raise APIError(400, f"tool definition {name!r} has different schemas in two tools' `$defs`, "
                                    f"which tool_choice='required' cannot combine", param="tools")
            defs[name] = schema
    return defs


def harmony_call_grammar(tools: list[Tool], name: str | None) -> str:
    """The Lark grammar (llguidance's dialect) of one harmony tool call, for gpt-oss's ``tool_choice``
    ``required`` (any of ``tools``) or a named function (``name``)::

        <|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{arguments}<|call|>

    Harmony makes one call per turn: ``<|call|>`` ends it. The arguments follow the function's parameters
    schema, without whitespace between JSON tokens (as the JSON tool choices)."""
    chosen = [t.function for t in tools if name is None or t.function.name == name]
    rules = ["start: <|channel|> \"commentary to=functions.\" call",
             "call: " + " | ".join(f"f{i}" for i in range(len(chosen)))]
    for i, fn in enumerate(chosen):
        rules.append(f"f{i}: {json.dumps(fn.name + ' ')} <|constrain|> \"json\" <|message|> a{i} <|call|>")
        rules.append(f"a{i}: {_lark_json(_params_schema(fn))}")
    return "\n".join(rules)


def harmony_answer_grammar(schema: Any) -> str:
    """The Lark grammar of a harmony answer that is JSON valid under ``schema`` (gpt-oss's ``response_format``,
    which constrains the answer, not the whole output)::

        <|channel|>final<|message|>{...}<|return|>
    """
    return f"start: <|channel|> \"final\" <|message|> answer <|return|>\nanswer: {_lark_json(schema)}"


def _lark_json(schema: Any) -> str:
    """A Lark rule's body for JSON valid under ``schema``, without whitespace between its tokens."""
    if isinstance(schema, dict):
        schema = {**schema, "x-guidance": {"whitespace_flexible": False}}
    return f"%json {json.dumps(schema, ensure_ascii=False)}"


def constraint(response_format: ResponseFormat | None, structured: StructuredOutputsRequest | None,
               tools: list[Tool] | None = None, tool_choice: ToolChoice | None = None,
               parallel_tool_calls: bool = True,
               harmony: bool = False) -> tuple[StructuredOutputsParams | None, str | None]:
    """The request's one output constraint and the field it came from (for errors), or ``(None, None)``.
    ``harmony``: a forced tool choice is a harmony call (``harmony_call_grammar``), a ``response_format`` the
    answer of a harmony final message (``harmony_answer_grammar``); ``structured_outputs`` still covers the
    whole output, harmony's tokens included."""
    given = []
    if response_format is not None and response_format.type != "text":
        given.append("response_format")
    if structured is not None:
        given.append("structured_outputs")
    forced = tool_schema(tools, tool_choice, parallel_tool_calls) if tools and tool_choice is not None else None
    if forced is not None:
        given.append("tool_choice")
    if len(given) > 1:
        raise APIError(400, f"{' and '.join(given)} cannot be combined: each constrains the whole output",
                       param=given[1])
    if not given:
        return None, None
    field = given[0]
    try:
        if field == "tool_choice" and harmony:
            return StructuredOutputsParams(grammar=harmony_call_grammar(tools, forced[1])), field
        if field == "tool_choice":
            return StructuredOutputsParams(json=forced[0]), field
        if field == "response_format":
            if response_format.type == "json_object":
                if harmony:
                    return StructuredOutputsParams(grammar=harmony_answer_grammar({"type": "object"})), field
                return StructuredOutputsParams(json_object=True), field
            if response_format.json_schema is None or response_format.json_schema.schema_ is None:
                raise APIError(400, "response_format of type json_schema needs json_schema.schema",
                               param="response_format")
            if harmony:
                return StructuredOutputsParams(grammar=harmony_answer_grammar(response_format.json_schema.schema_)), field
            return StructuredOutputsParams(json=response_format.json_schema.schema_), field
        return StructuredOutputsParams(**structured.model_dump(by_alias=True, exclude_none=True)), field
    except ValueError as exc:
        raise APIError(400, str(exc).replace("structured_outputs", field, 1), param=field) from None


def after_reasoning(so: StructuredOutputsParams | None, thinking: bool | None, start_ids: list[int],
                    end_ids: list[int]) -> StructuredOutputsParams | None:
    """``so`` held back while a thinking model reasons, as vLLM holds a grammar while its reasoning parser says the
    model reasons. ``thinking``: what the prompt decided (``ChatOutputReader.thinking``); ``start_ids`` /
    ``end_ids``: the reasoning's markers as token ids.

    A prompt that opened the think block: the grammar starts after the end marker. One that did not decide: the
    model may open its reasoning with its first token (a start marker of one token, allowed then beside the
    grammar's tokens), and the grammar then starts after the end marker; otherwise at the first token. Unlike
    vLLM, which holds the grammar until ``</think>`` even when the model does not think. Thinking off: unchanged.
    """
    if so is None or thinking is False or not end_ids:
        return so
    if thinking:
        return so.starting_after(end_ids)
    return so.starting_after(end_ids, opened_by=start_ids[0]) if len(start_ids) == 1 else so
