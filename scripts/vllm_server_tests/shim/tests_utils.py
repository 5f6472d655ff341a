"""Staged as ``tests/utils.py``: what vLLM's server tests import from their ``tests/utils.py``, for minivllm.

``RemoteOpenAIServer(model, args)`` starts ``minivllm serve`` on the harness's model (the checkpoint run.py
stages from its ``--model`` and names in ``VLLMTESTS_MODEL``), served under the name the test asked for, with the test's flags translated by
``translate_args``: the flags of ``DROPPED_FLAGS`` are left out (each with its reason), every other flag
reaches ``minivllm serve`` as it is, so a flag minivllm lacks makes the server refuse to start and the tests
that need it error with argparse's message. Written for this harness; no line of vLLM's file is used.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

# NOTE: the root of the unpacked vLLM tests (some tests read files under it)
VLLM_PATH = Path(os.environ.get("VLLMTESTS_VLLM_ROOT", Path(__file__).resolve().parent.parent))
ROCM_EXTRA_ARGS: list[str] = []
REPO_ROOT = Path(os.environ.get("VLLMTESTS_REPO_ROOT", "."))  # NOTE: minivllm's checkout (run.py sets it)

# flag -> (number of values: 0, 1 or "+", reason); the README lists them
DROPPED_FLAGS: dict[str, tuple[int | str, str]] = {
    "--dtype": (1, "hardware: the CPU computes in float32; vLLM's tests pick half precision for GPU memory"),
    "--trust-remote-code": (0, "the demo checkpoints have no remote code"),
    "--structured-outputs-config.backend": (1, "vLLM's choice among its grammar backends; minivllm has one"),
    "--runner": (1, "selects an embedding model's pooling runner; only the middleware tests of such a "
                    "server run, and they use no model output"),
    "--enable-lora": (0, "LoRA is excluded; the LoRA tests of the module are deselected"),
    "--lora-modules": ("+", "LoRA is excluded"),
    "--max-lora-rank": (1, "LoRA is excluded"),
    "--max-cpu-loras": (1, "LoRA is excluded"),
    "--max-loras": (1, "LoRA is excluded"),
    "--limit-mm-per-prompt": (1, "multimodal is excluded"),
    "--hf-overrides": (1, "overrides of a vLLM test model's config"),
}
# NOTE: flags of minivllm's own that the harness adds (hardware settings of this 2-core machine)
EXTRA_FLAGS = ["--cpu-kvcache-space-gib", "0.5"]


def get_open_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _split_flag(arg: str) -> tuple[str, str | None]:
    if arg.startswith("--") and "=" in arg:
        flag, value = arg.split("=", 1)
        return flag, value
    return arg, None


def translate_args(args: list[str]) -> tuple[list[str], list[str]]:
    """(the flags minivllm gets, the flags left out)."""
    out: list[str] = []
    dropped: list[str] = []
    i = 0
    while i < len(args):
        flag, inline = _split_flag(args[i])
        i += 1
        if flag not in DROPPED_FLAGS:
            out.append(args[i - 1])
            continue
        nvalues, _ = DROPPED_FLAGS[flag]
        taken = [args[i - 1]]
        if inline is None and nvalues == 1 and i < len(args):
            taken.append(args[i])
            i += 1
        elif inline is None and nvalues == "+":
            while i < len(args) and not args[i].startswith("--"):
                taken.append(args[i])
                i += 1
        dropped.extend(taken)
    return out, dropped


def _flag_value(args: list[str], *names: str) -> str | None:
    for i, arg in enumerate(args):
        flag, inline = _split_flag(arg)
        if flag in names:
            return inline if inline is not None else (args[i + 1] if i + 1 < len(args) else None)
    return None


class RemoteOpenAIServer:
    """``minivllm serve`` on the harness's model, with the interface of vLLM's test helper of the same name."""

    DUMMY_API_KEY = "token-abc123"

    def __init__(self, model: str, vllm_serve_args: list[str], *, env_dict: dict[str, str] | None = None,
                 seed: int | None = 0, auto_port: bool = True, max_wait_seconds: float | None = None,
                 override_hf_configs: dict[str, Any] | None = None) -> None:
        args = list(vllm_serve_args)
        if auto_port:
            if "-p" in args or "--port" in args:
                raise ValueError("You have manually specified the port when `auto_port=True`.")
            if "--uds" not in args:
                args += ["--port", str(get_open_port())]
        if seed is not None:
            if "--seed" in args:
                raise ValueError(f"You have manually specified the seed when `seed={seed}`.")
            args += ["--seed", str(seed)]
        self.uds = _flag_value(args, "--uds")
        self.host = None if self.uds else (_flag_value(args, "--host") or "127.0.0.1")
        port = _flag_value(args, "--port", "-p")
        self.port = None if self.uds else int(port)
        self.show_hidden_metrics = _flag_value(args, "--show-hidden-metrics-for-version") is not None
        if _flag_value(args, "--served-model-name") is None:
            args += ["--served-model-name", model]
        self.served_args, self.dropped_args = translate_args(args)
        self.model = model
        self._start(env_dict)
        self._wait_healthy(max_wait_seconds or 240)

    def _start(self, env_dict: dict[str, str] | None) -> None:
        env = os.environ.copy()
        env["PYTHONPATH"] = str(REPO_ROOT) + os.pathsep + env.get("PYTHONPATH", "")
        env.update(env_dict or {})
        log_dir = Path(os.environ.get("VLLMTESTS_LOG_DIR", "/tmp"))
        log_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = log_dir / f"server-{os.getpid()}-{time.monotonic_ns()}.log"
        model_path = os.environ["VLLMTESTS_MODEL"]
        cmd = [sys.executable, "-m", "minivllm.entrypoints.cli", "serve", model_path, *self.served_args,
               *EXTRA_FLAGS]
        self._log = open(self.log_path, "w+")
        self._log.write(f"# vLLM test asked: serve {self.model} {' '.join(self.served_args)}\n"
                        f"# dropped: {' '.join(self.dropped_args) or '-'}\n# command: {' '.join(cmd)}\n")
        self._log.flush()
        self.proc = subprocess.Popen(cmd, cwd=REPO_ROOT, env=env, stdout=self._log, stderr=subprocess.STDOUT,
                                     start_new_session=True)

    def _log_tail(self, n: int = 6) -> str:
        self._log.seek(0)
        lines = [line.rstrip() for line in self._log.read().splitlines()
                 if line.strip() and not line.startswith("# ")]
        errors = [line for line in lines if "error" in line.lower() or line.startswith("minivllm:")]
        return " | ".join((errors or lines)[-n:])

    def _wait_healthy(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        client = httpx.Client(transport=httpx.HTTPTransport(uds=self.uds)) if self.uds else httpx.Client()
        try:
            while True:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"minivllm serve exited ({self.proc.returncode}): {self._log_tail()}")
                try:
                    if client.get(self.url_for("health"), timeout=2).status_code == 200:
                        return
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline:
                    self._stop()
                    raise RuntimeError(f"minivllm serve not healthy in {timeout:.0f} s: {self._log_tail()}")
                time.sleep(0.3)
        finally:
            client.close()

    def _stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(8)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self._log.close()

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc_value, traceback):
        self._stop()

    @property
    def url_root(self) -> str:
        return f"http://{self.uds.split('/')[-1]}" if self.uds else f"http://{self.host}:{self.port}"

    def url_for(self, *parts: str) -> str:
        return self.url_root + "/" + "/".join(parts)

    def get_client(self, **kwargs):
        kwargs.setdefault("timeout", 600)
        return openai.OpenAI(base_url=self.url_for("v1"), api_key=self.DUMMY_API_KEY, max_retries=0, **kwargs)

    def get_async_client(self, **kwargs):
        kwargs.setdefault("timeout", 600)
        return openai.AsyncOpenAI(base_url=self.url_for("v1"), api_key=self.DUMMY_API_KEY, max_retries=0,
                                  **kwargs)


def _needs_hardware(what: str):
    return pytest.mark.skip(reason=f"needs {what} (not on this CPU machine)")


def multi_gpu_only(*, num_gpus: int = 2):
    return _needs_hardware(f"{num_gpus} GPUs")


def requires_fp8(func=None):
    mark = _needs_hardware("FP8 hardware")
    return mark(func) if func is not None else mark


def __getattr__(name: str):
    raise AttributeError(f"tests.utils.{name} is not provided by the minivllm harness "
                         "(scripts/vllm_server_tests/shim/tests_utils.py)")
