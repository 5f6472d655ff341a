"""Request bodies into protocol models: small ones on the event loop, large ones (a long prompt, a list of a
million token ids) in a worker thread, so one request never stalls the server; text that is not valid
Unicode (a lone UTF-16 surrogate such as ``"\\ud800"``) is a 400 that names the field, and so is JSON nested
deeper than :data:`MAX_JSON_DEPTH` (thousands of ``[``), refused where the parser reaches that depth."""

from __future__ import annotations

import asyncio
import json
from typing import TypeVar

import pydantic
import pydantic_core
from fastapi import Request
from fastapi.exceptions import RequestValidationError

from minivllm.entrypoints.openai.errors import APIError

#: bodies above this many bytes are parsed and validated in a worker thread (below, a thread costs more)
THREAD_PARSE_BYTES = 64 << 10
#: how deep JSON arrays and objects may nest in a body: pydantic's parser stops past it, and the standard one
#: (for the rare body pydantic refuses) is held to it too, before its recursion would fail as a 500
MAX_JSON_DEPTH = 200
M = TypeVar("M", bound=pydantic.BaseModel)


def check_text(value, where: str = "") -> None:
    """Raise a 400 naming the field of the first string in ``value`` (parsed JSON) that UTF-8 cannot encode."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise APIError(400, f"{where or 'body'} is not valid Unicode text (a lone UTF-16 surrogate at "
                                f"character {exc.start})", param=where or None) from None
    elif isinstance(value, dict):
        for key, item in value.items():
            check_text(key, where)
            check_text(item, f"{where}.{key}" if where else str(key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            if not isinstance(item, (int, float, bool)) or item is None:
                check_text(item, f"{where}.{i}")


def _too_deep() -> APIError:
    return APIError(400, f"the request body nests JSON arrays and objects more than {MAX_JSON_DEPTH} levels deep")


def _deeper_than(value, limit: int) -> bool:
    """Whether parsed JSON nests arrays and objects more than ``limit`` levels (a loop: no recursion to exhaust)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (dict, list)):
            if depth > limit:
                return True
            stack.extend((v, depth + 1) for v in (item.values() if isinstance(item, dict) else item))
    return False


def _loads(body: bytes):
    """JSON with NaN / Infinity (rejected later, by field); pydantic's fast parser first, the standard one where
    it refuses a string (it rejects lone surrogates, which :func:`check_text` then names)."""
    try:
        return pydantic_core.from_json(body, allow_inf_nan=True)
    except ValueError as exc:
        if str(exc).startswith("recursion limit exceeded"):  # pydantic stopped at its depth: no second parse
            raise _too_deep() from None
        try:
            data = json.loads(body)
        except RecursionError:
            raise _too_deep() from None
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise APIError(400, f"the request body is not valid JSON: {exc}") from None
        if _deeper_than(data, MAX_JSON_DEPTH):
            raise _too_deep() from None
        return data


def _parse(body: bytes, model: type[M]) -> M:
    data = _loads(body)
    if b"\\ud" in body or b"\\uD" in body:  # only an escape can make a lone surrogate: skip the walk
        check_text(data)
    try:
        return model.model_validate(data)
    except pydantic.ValidationError as exc:
        raise RequestValidationError(exc.errors(include_url=False)) from None


async def parse_body(raw: Request, model: type[M]) -> M:
    """The request's body as ``model`` (a 400 in OpenAI's shape when it is not)."""
    body = await raw.body()
    if len(body) > THREAD_PARSE_BYTES:
        return await asyncio.to_thread(_parse, body, model)
    return _parse(body, model)


def _parse_first(body: bytes, models: tuple[type[pydantic.BaseModel], ...]) -> pydantic.BaseModel:
    data = _loads(body)
    if b"\\ud" in body or b"\\uD" in body:
        check_text(data)
    errors = {}
    for model in models:
        try:
            return model.model_validate(data)
        except pydantic.ValidationError as exc:
            errors[model] = exc
    # a body with all of a model's required fields was meant as that model: its own 400 names the bad field
    for model, exc in errors.items():
        if isinstance(data, dict) and all(n in data for n, f in model.model_fields.items() if f.is_required()):
            raise RequestValidationError(exc.errors(include_url=False)) from None
    raise APIError(400, f"Cannot find suitable handler for request. Expected one of: {[m.__name__ for m in models]}")


async def parse_first(raw: Request, models: tuple[type[pydantic.BaseModel], ...]) -> pydantic.BaseModel:
    """The request's body as the first of ``models`` that it validates as (SageMaker's ``/invocations``, as in
    vLLM); a 400 in OpenAI's shape when it is none of them."""
    body = await raw.body()
    if len(body) > THREAD_PARSE_BYTES:
        return await asyncio.to_thread(_parse_first, body, models)
    return _parse_first(body, models)


def body_schema(model: type[pydantic.BaseModel]) -> dict:
    """``openapi_extra`` of a route whose body is ``model`` but parsed by :func:`parse_body`."""
    return {"requestBody": {"required": True, "content": {"application/json": {
        "schema": {"$ref": f"#/components/schemas/{model.__name__}"}}}}}


def add_schemas(openapi: dict, models: list[type[pydantic.BaseModel]]) -> dict:
    """Put ``models`` (and the models they use) into an OpenAPI document's components."""
    schemas = openapi.setdefault("components", {}).setdefault("schemas", {})
    for model in models:
        schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
        schemas.update(schema.pop("$defs", {}))
        schemas[model.__name__] = schema
    return openapi
