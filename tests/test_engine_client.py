"""Both engine clients (one engine, the Ray Serve front) implement ``EngineClient``, member for member, and the
HTTP layer uses nothing of an engine but that protocol."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

from minivllm.engine.async_engine import AsyncLLM
from minivllm.engine.protocol import EngineClient

pytest.importorskip("prometheus_client")  # the Ray front's module imports the server's metrics

from minivllm.scale_out.serve.engine_client import ReplicaEngineClient  # noqa: E402

OPENAI = Path(__file__).resolve().parents[1] / "minivllm" / "entrypoints" / "openai"


def _members(proto) -> dict[str, object]:
    return {name: value for name, value in vars(proto).items() if not name.startswith("_")}


def _params(fn) -> list[tuple[str, object, object]]:
    return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]


def test_the_protocol_names_what_the_server_needs():
    assert set(_members(EngineClient)) == {
        "start", "is_ready", "error", "wait_ready", "wait_dead", "check_usable", "tokenizer", "model_info",
        "add_request", "abort", "compile_grammar", "add_stat_logger", "begin_shutdown", "shutdown", "add_lora",
        "remove_lora", "list_loras"}


@pytest.mark.parametrize("client", [AsyncLLM, ReplicaEngineClient], ids=lambda c: c.__name__)
def test_a_client_has_every_member_of_the_protocol_with_its_signature(client):
    for name, spec in _members(EngineClient).items():
        impl = inspect.getattr_static(client, name, None)
        assert impl is not None, f"{client.__name__} has no {name}"
        if isinstance(spec, property):
            assert isinstance(impl, property), f"{client.__name__}.{name} must be a property"
            continue
        assert inspect.isfunction(impl), f"{client.__name__}.{name} must be a method"
        assert inspect.iscoroutinefunction(impl) == inspect.iscoroutinefunction(spec), \
            f"{client.__name__}.{name}: async in one, not in the other"
        assert _params(impl) == _params(spec), f"{client.__name__}.{name}{inspect.signature(impl)} is not " \
                                               f"{name}{inspect.signature(spec)}"


def test_the_http_layer_reads_no_engine_and_no_private_attribute_of_its_client():
    """``entrypoints/openai`` types its engine as ``EngineClient``: no ``.engine``, no ``hasattr`` to tell the
    clients apart, no private attribute of the client (``async_llm._loop``, ``llm._streams``)."""
    bad = []
    for path in sorted(OPENAI.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name | ast.Attribute):
                owner = node.value.id if isinstance(node.value, ast.Name) else node.value.attr
                if owner in ("llm", "async_llm", "engine") and (node.attr == "engine" or node.attr.startswith("_")):
                    bad.append(f"{path.name}:{node.lineno} {owner}.{node.attr}")
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "hasattr":
                bad.append(f"{path.name}:{node.lineno} hasattr")
    assert bad == []
