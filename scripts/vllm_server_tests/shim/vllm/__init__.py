"""Staged as a package named ``vllm``, so that vLLM's test files import unchanged without vLLM installed.

vLLM's server tests import a few helpers from vLLM (the served model's tokenizer and vocabulary size, the
version, a free port...). Those are given here for real, answering with the model the harness serves
(run.py's ``--model``, staged and named in ``VLLMTESTS_MODEL``). Every other ``vllm.*`` name imports as a placeholder (``Placeholder``):
module-level code of the test files runs, but a test that *uses* one raises ``VLLMInternalsUsed``: such tests
exercise vLLM's own Python classes, not a server, and the harness deselects them (selection.py). Written for
this harness; no line of vLLM is used.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import json
import os
import sys
import tempfile
import types
from pathlib import Path


class VLLMInternalsUsed(RuntimeError):
    """A test used a vLLM Python object that the harness does not provide (it tests vLLM, not a server)."""


def _model_path() -> str:
    return os.environ["VLLMTESTS_MODEL"]


def _fail(name: str):
    raise VLLMInternalsUsed(f"{name}: a vLLM internal, not provided by the minivllm harness")


class _PlaceholderBase:
    """What a class deriving from a placeholder derives from instead."""


class Placeholder:
    """Any ``vllm.*`` name the harness does not provide: fine to import, decorate with or derive from."""

    def __init__(self, name: str):
        object.__setattr__(self, "_name", name)

    def __getattr__(self, attr: str):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return Placeholder(f"{self._name}.{attr}")

    def __call__(self, *args, **kwargs):
        # NOTE: a decorator with arguments returns a placeholder; one without replaces the function
        return Placeholder(f"{self._name}()")

    def __mro_entries__(self, bases):
        return (_PlaceholderBase,)

    def __getitem__(self, item):
        return self

    def __or__(self, other):
        return self

    __ror__ = __or__

    def __repr__(self) -> str:
        return f"<vllm placeholder {self._name}>"

    def __bool__(self):
        _fail(self._name)

    def __iter__(self):
        _fail(self._name)

    def __len__(self):
        _fail(self._name)

    def __await__(self):
        _fail(self._name)


# ---- what the server tests use, for real --------------------------------------------------------------

def get_tokenizer(tokenizer_name=None, *args, **kwargs):
    """The tokenizer of the served model, whatever vLLM model the test names."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(_model_path())


class ModelConfig:
    """Only what the server tests ask of it: the served model's vocabulary size."""

    def __init__(self, model=None, **kwargs):
        self.model = model

    def get_vocab_size(self) -> int:
        return json.loads((Path(_model_path()) / "config.json").read_text())["vocab_size"]


def _minivllm_version() -> str:
    import minivllm

    return minivllm.__version__


def _prev_minor_version() -> str:
    major, minor = _minivllm_version().split(".")[:2]
    return f"{major}.{max(int(minor) - 1, 0)}"


def get_open_port() -> int:
    from tests.utils import get_open_port as free_port  # the shim's, staged as tests/utils.py

    return free_port()


def download_weights_from_hf(model_name_or_path, *args, **kwargs) -> str:
    """The served checkpoint stands for every vLLM test model."""
    return _model_path()


class _HfApi:
    def snapshot_download(self, repo_id=None, **kwargs) -> str:
        # NOTE: only LoRA fixtures ask; LoRA is excluded and its flags dropped, so an empty folder does
        return tempfile.mkdtemp(prefix="vllmtests-lora-")


class _Platform:
    """A CPU machine: no CUDA, no ROCm, no FP8."""

    def is_cuda(self) -> bool:
        return False

    def is_rocm(self) -> bool:
        return False

    def is_cpu(self) -> bool:
        return True

    def is_tpu(self) -> bool:
        return False

    def is_xpu(self) -> bool:
        return False

    def device_count(self) -> int:
        return 0

    def supports_fp8(self) -> bool:
        return False

    def __getattr__(self, attr: str):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return Placeholder(f"vllm.platforms.current_platform.{attr}")


PROVIDED: dict[str, dict[str, object]] = {
    "vllm.tokenizers": {"get_tokenizer": get_tokenizer},
    "vllm.transformers_utils.tokenizer": {"get_tokenizer": get_tokenizer},
    "vllm.config": {"ModelConfig": ModelConfig},
    "vllm.version": {"__version__": None, "_prev_minor_version": _prev_minor_version},
    "vllm.envs": {"VLLM_USE_RUST_FRONTEND": False},
    "vllm.platforms": {"current_platform": _Platform()},
    "vllm.utils.network_utils": {"get_open_port": get_open_port},
    "vllm.model_executor.model_loader.weight_utils": {"download_weights_from_hf": download_weights_from_hf},
    "vllm.transformers_utils.repo_utils": {"hf_api": _HfApi},
}


class _PlaceholderModule(types.ModuleType):
    def __getattr__(self, attr: str):
        if attr.startswith("__"):
            raise AttributeError(attr)
        sub = f"{self.__name__}.{attr}"
        if sub in PROVIDED or any(name.startswith(sub + ".") for name in PROVIDED):
            return importlib.import_module(sub)
        return Placeholder(sub)


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path, target=None):
        if fullname.startswith("vllm."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = _PlaceholderModule(spec.name)
        module.__path__ = []
        for key, value in PROVIDED.get(spec.name, {}).items():
            setattr(module, key, value)
        if spec.name == "vllm.version":
            module.__version__ = _minivllm_version()
        return module

    def exec_module(self, module):
        pass


if not any(isinstance(f, _Finder) for f in sys.meta_path):
    sys.meta_path.insert(0, _Finder())

__version__ = _minivllm_version()


def __getattr__(attr: str):
    if attr.startswith("__"):
        raise AttributeError(attr)
    sub = f"vllm.{attr}"
    if sub in PROVIDED or any(name.startswith(sub + ".") for name in PROVIDED):
        return importlib.import_module(sub)
    return Placeholder(sub)
