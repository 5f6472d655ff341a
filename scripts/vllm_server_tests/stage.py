"""Lay out vLLM's test files beside the harness's shim, in a folder of their own, for pytest.

The staged tree: ``tests/entrypoints/...`` (vLLM's files, copied; the adaptations of selection.py applied to
the copies, never to the originals), ``tests/utils.py`` and ``tests/conftest.py`` (the shim's), ``vllm/``
(the shim's stand-in package), ``pytest.ini``, ``model/`` (the checkpoint served, by default
``DEFAULT_MODEL``, its context raised: see the README) and ``hf_home/`` (an offline Hugging Face cache in which
every model id the selected files name is the served model's tokenizer)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import selection

HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parents[1]
DEFAULT_MODEL = REPO_ROOT / "models" / "minivllm-demo-chat"
# NOTE: vLLM's tests ask for contexts up to 10100 tokens; RoPE has no limit of its own
SERVED_MAX_POSITION_EMBEDDINGS = 32768
PYTEST_INI = """[pytest]
asyncio_mode = strict
asyncio_default_fixture_loop_scope = function
asyncio_default_test_loop_scope = function
filterwarnings = ignore::DeprecationWarning
markers =
    slow_test
    skip_global_cleanup
    core_model
    hybrid_model
    cpu_model
    cpu_test
    split
    distributed
    optional
"""
HF_ID = re.compile(r"""["']([A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*)["']""")


def find_vllm_tests(path: Path) -> Path:
    """The folder holding vLLM's ``tests/entrypoints`` (the unpacked release or a checkout)."""
    for root in (path, path.parent):
        if (root / "tests" / "entrypoints" / "openai").is_dir():
            return root
    raise SystemExit(f"{path}: no tests/entrypoints/openai under it (give the root of vLLM's source)")


def stage_model(stage: Path, source: Path) -> Path:
    """``source`` linked under ``stage/model/``, with its context raised in its config and tokenizer config."""
    model = stage / "model" / source.name
    if model.exists():
        shutil.rmtree(model)
    model.mkdir(parents=True)
    for f in source.iterdir():
        if f.name not in ("config.json", "tokenizer_config.json"):
            (model / f.name).symlink_to(f)
    config = json.loads((source / "config.json").read_text())
    config["max_position_embeddings"] = SERVED_MAX_POSITION_EMBEDDINGS
    (model / "config.json").write_text(json.dumps(config, indent=2))
    # the tokenizer says the same context as the raised config (GET /tokenizer_info reports it)
    tokenizer_config = json.loads((source / "tokenizer_config.json").read_text())
    tokenizer_config["model_max_length"] = SERVED_MAX_POSITION_EMBEDDINGS
    (model / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2))
    return model


def stage_hf_cache(stage: Path, model_ids: set[str], source: Path) -> Path:
    """An offline Hugging Face cache in which each of ``model_ids`` is ``source``'s tokenizer and configs."""
    hub = stage / "hf_home" / "hub"
    if hub.exists():
        shutil.rmtree(hub)
    revision = "0" * 40
    for model_id in sorted(model_ids):
        repo = hub / ("models--" + model_id.replace("/", "--"))
        (repo / "refs").mkdir(parents=True)
        (repo / "refs" / "main").write_text(revision)
        snapshot = repo / "snapshots" / revision
        snapshot.mkdir(parents=True)
        for f in source.iterdir():
            if f.name.startswith("tokenizer") or f.name in ("config.json", "chat_template.jinja",
                                                            "generation_config.json"):
                (snapshot / f.name).symlink_to(f)
    return hub.parent


def stage(vllm_root: Path, stage_dir: Path, source: Path = DEFAULT_MODEL) -> dict:
    """Stage everything to serve the checkpoint folder ``source``; returns what run.py needs (paths, the
    adaptations applied)."""
    stage_dir.mkdir(parents=True, exist_ok=True)
    tests = stage_dir / "tests"
    if tests.exists():
        shutil.rmtree(tests)
    src = vllm_root / "tests" / "entrypoints"
    dst = tests / "entrypoints"
    shutil.copytree(src / "openai", dst / "openai", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(src / "serve", dst / "serve", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("__init__.py", "conftest.py"):
        shutil.copy2(src / name, dst / name)
    (tests / "__init__.py").write_text("")
    shutil.copy2(HERE / "shim" / "tests_utils.py", tests / "utils.py")
    shutil.copy2(HERE / "shim" / "conftest.py", tests / "conftest.py")
    if (stage_dir / "vllm").exists():
        shutil.rmtree(stage_dir / "vllm")
    shutil.copytree(HERE / "shim" / "vllm", stage_dir / "vllm", ignore=shutil.ignore_patterns("__pycache__"))
    (stage_dir / "pytest.ini").write_text(PYTEST_INI)
    model = stage_model(stage_dir, source)
    applied = selection.apply_adaptations(dst, source)
    ids = {m for rel in selection.SELECTED for m in HF_ID.findall((dst / rel).read_text())
           if not m.startswith(("v1/", "/"))}
    hf_home = stage_hf_cache(stage_dir, ids, source)
    return {"tests": dst, "model": model, "hf_home": hf_home, "adaptations": applied}
