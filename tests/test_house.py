"""The rules of the code's layout (docs/design.md), checked on the source and on a running engine."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from minivllm import LLM, SamplingParams

PKG = Path(__file__).resolve().parents[1] / "minivllm"
SOURCES = sorted(PKG.rglob("*.py"))


def _module(path: Path) -> str:
    return ".".join(path.relative_to(PKG.parent).with_suffix("").parts).removesuffix(".__init__")


def _imports(path: Path) -> set[str]:
    """Every module a file imports (``from a.b import c`` gives ``a.b`` and ``a.b.c``), lazy imports included."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
            out.update(f"{node.module}.{a.name}" for a in node.names)
    return out


def test_at_most_five_environment_variables_of_our_own():
    names = set()
    for path in PKG.rglob("*"):
        if path.is_file() and path.suffix in (".py", ".json", ".md", ".jinja", ".txt"):
            names.update(re.findall(r"MINIVLLM_[A-Z0-9_]+", path.read_text()))
    assert len(names) <= 5, sorted(names)


def test_only_envs_reads_the_environment():
    """``os.environ`` / ``os.getenv`` appear in minivllm/envs.py alone: everything else gets ``Config.envs``."""
    readers = []
    for path in SOURCES:
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Attribute) and node.attr in ("environ", "getenv", "environb")
                    and isinstance(node.value, ast.Name) and node.value.id == "os"):
                readers.append(f"{_module(path)}:{node.lineno}")
            if isinstance(node, ast.ImportFrom) and node.module == "os" and {a.name for a in node.names} & {
                    "environ", "getenv"}:
                readers.append(f"{_module(path)}:{node.lineno}")
    assert readers and all(r.startswith("minivllm.envs:") for r in readers), readers


class _WatchedEnviron(dict):
    """A stand-in for ``os.environ`` that records every read made from minivllm's own code."""

    def __init__(self, env, reads: list[str]):
        super().__init__(env)
        self.reads = reads

    def _note(self, key) -> None:
        caller = sys._getframe(2)
        name = caller.f_globals.get("__name__", "")
        if name.startswith("minivllm"):
            self.reads.append(f"{name}:{caller.f_lineno} read {key}")

    def __getitem__(self, key):
        self._note(key)
        return super().__getitem__(key)

    def get(self, key, default=None):
        self._note(key)
        return super().get(key, default)

    def __contains__(self, key):
        self._note(key)
        return super().__contains__(key)


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_no_environment_reads_per_step(tiny_tied_model, monkeypatch, backend):
    """Steps of every kind (prefill, chunked prefill, decode, prefix hits, sampling with penalties, logprobs,
    seeds) read nothing from the environment."""
    with LLM(tiny_tied_model, device="cpu", attention_backend=backend, max_model_len=128, num_kvcache_blocks=32,
             max_num_batched_tokens=32) as llm:
        reads: list[str] = []
        monkeypatch.setattr(os, "environ", _WatchedEnviron(os.environ, reads))
        params = [SamplingParams(temperature=0, max_tokens=5),
                  SamplingParams(temperature=0.8, seed=3, max_tokens=5, repetition_penalty=1.2, logprobs=2),
                  SamplingParams(temperature=1.0, top_p=0.9, max_tokens=5)]
        llm.generate(["def f(x):", "def f(x): return", list(range(40, 90))], params, use_tqdm=False)
        monkeypatch.undo()
    assert reads == []


def test_core_imports_no_torch():
    """The bookkeeping layer is pure Python: importing it pulls in neither torch nor numpy. Of the rest of the
    package it reads only the request's parameters (``SamplingParams``, ``LoRARequest``)."""
    code = ("import sys, minivllm.core.sequence, minivllm.core.block_manager, minivllm.core.scheduler, "
            "minivllm.core.scheduler_output, minivllm.core.stop, minivllm.core.lora_slots; "
            "print(sorted(m for m in ('torch', 'numpy', 'triton') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
    for path in (PKG / "core").glob("*.py"):
        heavy = {m for m in _imports(path) if m.split(".")[0] in ("torch", "numpy", "triton")}
        inner = {m for m in _imports(path) if m.startswith("minivllm.") and not m.startswith(
            ("minivllm.core", "minivllm.sampling_params", "minivllm.lora.request"))}
        assert not heavy and not inner, (path.name, heavy, inner)


def test_the_model_side_never_sees_a_sequence():
    """worker/, layers/, models/, kernels/ and distributed/ read the frozen scheduler output, never a live
    ``Sequence`` or the scheduler's state."""
    live = ("minivllm.core.sequence", "minivllm.core.scheduler.", "minivllm.core.block_manager", "minivllm.core.stop")
    for part in ("worker", "layers", "models", "kernels", "distributed"):
        for path in (PKG / part).glob("*.py"):
            bad = {m for m in _imports(path) if m.startswith(live) or m == "minivllm.core.scheduler"}
            assert not bad, (path.name, bad)


def test_no_module_globals_are_assigned_at_run_time():
    """No ``global`` statements: metadata (the tensor-parallel group, attention metadata) travels as arguments."""
    found = [f"{_module(p)}:{n.lineno}" for p in SOURCES for n in ast.walk(ast.parse(p.read_text()))
             if isinstance(n, ast.Global)]
    assert found == []


def test_no_file_over_400_lines():
    """~250 lines is the guide; a cohesive class may take 400, and is never cut across files to fit."""
    long = {_module(p): n for p in SOURCES if (n := len(p.read_text().splitlines())) > 400}
    assert long == {}


def test_no_mixins_and_no_method_called_by_name():
    """A class has one clear shape: the package defines no mixin, and no engine class has a mixin base or
    several bases (Ray Serve's router API asks for its own ``FIFOMixin``, outside the engine); a message between
    threads or processes is a dataclass handled by ``match``, never a method name for ``getattr``."""
    mixins, multiple, by_name = [], [], []
    for path in SOURCES:
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                names = [ast.unparse(b) for b in node.bases]
                if node.name.endswith("Mixin"):
                    mixins.append(f"{_module(path)}.{node.name}")
                if _module(path).startswith("minivllm.engine"):
                    mixins += [f"{_module(path)}.{node.name}({n})" for n in names if n.endswith("Mixin")]
                    if len(names) > 1:
                        multiple.append(f"{_module(path)}.{node.name}{tuple(names)}")
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr"
                    and len(node.args) >= 2 and not isinstance(node.args[1], ast.Constant)):
                target = ast.unparse(node.args[0])
                if "runner" in target or "engine" in target or target in ("sl", "logger"):
                    by_name.append(f"{_module(path)}:{node.lineno} getattr({target}, {ast.unparse(node.args[1])})")
    assert mixins == [] and multiple == [] and by_name == []


def _docstrings(tree: ast.AST) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                ids.add(id(first.value))
    return ids


def test_the_package_does_not_reach_into_the_repository():
    """An installed wheel has no benchmarks/, scripts/, tests/ or models/ beside it: no code climbs out of the
    package (``Path(__file__).parents[1]`` and up) or names those folders outside of documentation."""
    for path in SOURCES:
        tree = ast.parse(path.read_text())
        docs = _docstrings(tree)
        for node in ast.walk(tree):
            if (isinstance(node, ast.Subscript) and isinstance(node.value, ast.Attribute)
                    and node.value.attr == "parents" and isinstance(node.slice, ast.Constant)):
                assert node.slice.value < 1, f"{_module(path)}:{node.lineno} climbs out of the package"
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
                for folder in ("benchmarks/", "scripts/", "tests/", "models/"):
                    assert not node.value.startswith(folder), f"{_module(path)}:{node.lineno} names {folder}"


@pytest.mark.slow
def test_the_wheel_works_without_the_repository(tmp_path):
    """Build the wheel, install it alone into a folder, and resolve a shipped benchmark config from elsewhere."""
    root = PKG.parent
    subprocess.run([sys.executable, "-m", "pip", "wheel", str(root), "--no-deps", "-q", "-w", str(tmp_path / "w")],
                   check=True, capture_output=True, timeout=300)
    wheel = next((tmp_path / "w").glob("minivllm-*.whl"))
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(tmp_path / "site"),
                    str(wheel)], check=True, capture_output=True, timeout=300)
    code = ("import minivllm, sys; from minivllm.entrypoints.bench.models import resolve_model, shipped_models; "
            "print(minivllm.__file__); print(shipped_models()); print(resolve_model('qwen3-8b'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, check=True,
                         env={"PYTHONPATH": str(tmp_path / "site"), "PATH": os.environ["PATH"]}).stdout.splitlines()
    assert out[0].startswith(str(tmp_path / "site"))
    assert {"qwen3-0.6b", "qwen3-8b", "qwen3-32b", "llama-3.1-8b", "tiny-qwen3"} <= set(ast.literal_eval(out[1]))
    path, hint = ast.literal_eval(out[2])
    assert path.startswith(str(tmp_path / "site")) and hint == "dummy"


def test_the_engine_changes_nothing_of_its_callers(tiny_tied_model):
    """Requests are copied on admission: the caller's ``SamplingParams`` (and what they hold) come back as they
    went in, the engine's copy is another object, and building and running an engine leaves torch's global
    random state alone (unseeded sampling draws from the engine's own generator)."""
    import copy

    import torch

    from minivllm.structured_outputs_params import StructuredOutputsParams

    params = SamplingParams(temperature=0.8, n=2, seed=7, max_tokens=6, bad_words=["def", "x y"],
                            logit_bias={5: 1.0}, stop=["\n\n"], repetition_penalty=1.1,
                            structured_outputs=StructuredOutputsParams(regex="[a-z ]+"))
    before = copy.deepcopy(params)
    rng = torch.get_rng_state()
    with LLM(tiny_tied_model, device="cpu", max_model_len=128, num_kvcache_blocks=32) as llm:
        llm.generate(["def f(x):", "import os"], params, use_tqdm=False)
        llm.generate(["a"], SamplingParams(temperature=1.0, max_tokens=4), use_tqdm=False)
        rid = llm.engine.add_request("def g(", params)
        assert llm.engine._requests[rid].params is not params
        assert llm.engine._requests[rid].seqs[0].bad_words_token_ids  # derived data lives on the request
        llm.engine.abort_request(rid)
    assert params == before and vars(params) == vars(before)
    assert torch.equal(torch.get_rng_state(), rng)
