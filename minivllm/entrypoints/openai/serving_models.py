"""The model names a server answers to (vLLM's ``OpenAIServingModels``): the served base model and its LoRA
adapters, each adapter a ``LoRARequest`` that the requests naming it run with.

Adapters come from ``--lora-modules`` (registered at once, loaded into the engine when it is ready) and, with
``--enable-lora-runtime-updates``, from ``POST /v1/load_lora_adapter`` (loaded before the name is answered to:
a folder the engine cannot read is a 400) and ``/v1/unload_lora_adapter``.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from minivllm.config.lora_modules import LoRAModulePath
from minivllm.engine.protocol import EngineClient
from minivllm.entrypoints.openai.errors import APIError
from minivllm.lora.request import LoRARequest

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ServedAdapter:
    """An adapter the server answers to: its request, and the base model ``/v1/models`` names as its parent."""

    lora_request: LoRARequest
    parent: str


class ServedModels:
    """The base model's name and the adapters' (names are unique across both); ``lora_request_of`` picks a
    request's adapter from its ``model``."""

    def __init__(self, llm: EngineClient, base_model_name: str, lora_modules: list[LoRAModulePath] = (),
                 lora_enabled: bool = False):
        """``lora_enabled``: the engine serves adapters (``--enable-lora``); without it a load is refused."""
        self.llm, self.base_model_name, self.lora_enabled = llm, base_model_name, lora_enabled
        self._adapters: dict[str, ServedAdapter] = {}
        self._next_id = 1
        self._lock = asyncio.Lock()  # NOTE: one load or unload at a time, so a name is checked and taken at once
        self._static = list(lora_modules)
        self.ready = not self._static  # True once the --lora-modules adapters are in the engine
        for module in self._static:
            if module.name == base_model_name or module.name in self._adapters:
                raise ValueError(f"lora_modules: the name {module.name!r} is taken (by the served model or an "
                                 f"adapter before it)")
            self._adapters[module.name] = ServedAdapter(self._new_request(module.name, module.path),
                                                        module.base_model_name or base_model_name)

    def lora_request_of(self, model: str | None) -> LoRARequest | None:
        """The adapter a request's ``model`` names (None: the base model, or no model given); a 404 in OpenAI's
        shape for a name the server does not serve."""
        if model is None or model == self.base_model_name:
            return None
        adapter = self._adapters.get(model)
        if adapter is None:
            raise APIError(404, f"The model `{model}` does not exist.", param="model", code="model_not_found")
        return adapter.lora_request

    def cards(self, created: int, max_model_len: int | None) -> list[dict]:
        """``/v1/models``' entries: the base model, then each adapter with its ``parent`` and folder (``root``)."""
        base = {"id": self.base_model_name, "object": "model", "created": created, "owned_by": "minivllm",
                "root": self.base_model_name, "parent": None}
        if max_model_len is not None:
            base["max_model_len"] = max_model_len
        out = [base]
        for name, adapter in self._adapters.items():
            out.append({"id": name, "object": "model", "created": created, "owned_by": "minivllm",
                        "root": adapter.lora_request.lora_path, "parent": adapter.parent})
        return out

    async def load_static(self) -> None:
        """Load the ``--lora-modules`` adapters into the engine (once it is ready); ValueError naming the first
        that fails."""
        for module in self._static:
            try:
                await self.llm.add_lora(self._adapters[module.name].lora_request)
            except ValueError as exc:  # its message names the adapter, its folder and what is wrong
                raise ValueError(f"lora_modules: {exc}") from None
            logger.info("LoRA adapter %r loaded from %s", module.name, module.path)
        self.ready = True

    async def load(self, lora_name: str, lora_path: str) -> LoRARequest:
        """Load an adapter into the engine and answer to its name from now on; a 400 for a name in use or a
        folder the engine refuses (its message says what is wrong)."""
        async with self._lock:
            self._check_new_name(lora_name, "lora_name")
            if not self.lora_enabled:
                raise APIError(400, "this server does not serve LoRA adapters: start it with --enable-lora",
                               param="lora_name")
            request = self._new_request(lora_name, lora_path)
            try:
                await self.llm.add_lora(request)
            except ValueError as exc:  # its message names the adapter, its folder and what is wrong
                raise APIError(400, str(exc), param="lora_path") from None
            self._adapters[lora_name] = ServedAdapter(request, self.base_model_name)
            logger.info("LoRA adapter %r loaded from %s", lora_name, lora_path)
            return request

    async def unload(self, lora_name: str) -> None:
        """Stop answering to an adapter's name and drop it from the engine; a 404 for a name not served."""
        async with self._lock:
            adapter = self._adapters.get(lora_name)
            if adapter is None:
                raise APIError(404, f"The LoRA adapter `{lora_name}` cannot be found.", param="lora_name",
                               code="model_not_found")
            del self._adapters[lora_name]
            await self.llm.remove_lora(adapter.lora_request.lora_int_id)
            logger.info("LoRA adapter %r unloaded", lora_name)

    def _check_new_name(self, name: str, param: str) -> None:
        if name == self.base_model_name:
            raise APIError(400, f"the name {name!r} is the base model's: an adapter needs another one", param=param)
        if name in self._adapters:
            raise APIError(400, f"The LoRA adapter `{name}` has already been loaded.", param=param)

    def _new_request(self, name: str, path: str) -> LoRARequest:
        """The adapter's request under a fresh id (an id is never reused, so the engine's prefix cache and host
        copy of an unloaded adapter never stand for another)."""
        request = LoRARequest(name, self._next_id, path)
        self._next_id += 1
        return request
