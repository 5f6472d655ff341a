"""Faults under the server: a step that raises, a tensor-parallel worker killed, a script without a main guard.
In each, clients get an error in OpenAI's shape (never a hang), ``/health`` says 503, and the server exits
non-zero for a supervisor to restart it."""

from __future__ import annotations

import concurrent.futures
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.helpers.server_utils import ROOT, running_server

pytestmark = [pytest.mark.server, pytest.mark.slow]
ARGS = ["--device", "cpu", "--max-model-len", "256", "--num-kvcache-blocks", "64"]
# NOTE: the test hook: the server's own command line, with LLMEngine.step failing at the 6th step that has two
# requests in flight (the test sends two; the 6th busy step alone could come before the second arrives)
FAILING_SERVER = """
import sys
from minivllm.engine import llm_engine
step, calls = llm_engine.LLMEngine.step, []
def failing_step(self):
    if len(self._requests) >= 2:
        calls.append(1)
        if len(calls) == 6:
            raise RuntimeError("injected step failure")
    return step(self)
llm_engine.LLMEngine.step = failing_step
from minivllm.entrypoints.cli import main
sys.exit(main(sys.argv[1:]))
"""


def _stream_events(url: str, body: dict) -> list[dict | str]:
    events = []
    with httpx.stream("POST", url + "/v1/completions", json={**body, "stream": True}, timeout=60) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: "):
                data = line.removeprefix("data: ")
                events.append(data if data == "[DONE]" else json.loads(data))
    return events


def _health_turns(url: str, status: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/health", timeout=2).status_code == status:
                return True
        except httpx.TransportError:  # the server is already gone
            return True
        time.sleep(0.05)
    return False


def _check_failure(srv, events: list) -> None:
    """The stream ended with a 5xx-class error event then [DONE]; /health 503; the server exits 1."""
    assert events[-1] == "[DONE]" and "error" in events[-2], events[-3:]
    assert events[-2]["error"]["code"] == "engine_dead" and events[-2]["error"]["type"] == "service_unavailable"
    assert _health_turns(srv.url, 503, 10)
    assert srv.proc.wait(timeout=60) == 1


def test_a_failing_step_ends_requests_with_an_error_and_the_server_exits_1(tiny_tied_model, tmp_path):
    command = [sys.executable, "-c", FAILING_SERVER, "serve", tiny_tied_model, *ARGS, "--port"]
    with running_server(tiny_tied_model, [], tmp_path, command=command) as srv:
        body = {"prompt": "x", "max_tokens": 100, "ignore_eos": True}
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            plain = pool.submit(httpx.post, srv.url + "/v1/completions", json=body, timeout=60)
            events = _stream_events(srv.url, body)
            answer = plain.result()
        assert sum("choices" in e for e in events if isinstance(e, dict)) >= 1
        assert answer.status_code == 503, answer.text  # NOTE: a request not streamed gets the error as its status
        assert answer.json()["error"]["code"] == "engine_dead"
        _check_failure(srv, events)


def _children(pid: int) -> list[int]:
    out = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        out += [int(c) for c in (task / "children").read_text().split()]
    return out


def test_a_killed_tensor_parallel_worker_fails_the_server_fast(tiny_tied_model, tmp_path):
    with running_server(tiny_tied_model, [*ARGS, "--tensor-parallel-size", "2"], tmp_path) as srv:
        # NOTE: the spawned rank 1 (the other child is multiprocessing's resource tracker)
        worker = next(p for p in _children(srv.proc.pid) if b"spawn_main" in Path(f"/proc/{p}/cmdline").read_bytes())
        body = {"prompt": "x", "max_tokens": 200, "ignore_eos": True, "stream": True}
        events, t0 = [], time.monotonic()
        with httpx.stream("POST", srv.url + "/v1/completions", json=body, timeout=60) as r:
            lines = r.iter_lines()
            events.append(json.loads(next(ln for ln in lines if ln.startswith("data: ")).removeprefix("data: ")))
            os.kill(worker, signal.SIGKILL)
            for line in lines:
                if line.startswith("data: "):
                    data = line.removeprefix("data: ")
                    events.append(data if data == "[DONE]" else json.loads(data))
        assert time.monotonic() - t0 < 30
        _check_failure(srv, events)


def test_a_script_without_a_main_guard_is_told_so(tiny_tied_model, tmp_path):
    script = tmp_path / "no_guard.py"
    script.write_text(f"from minivllm import LLM\nllm = LLM({tiny_tied_model!r}, device='cpu', "
                      "tensor_parallel_size=2, max_model_len=64, num_kvcache_blocks=8)\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode != 0
    assert "could not start" in done.stderr and 'if __name__ == "__main__":' in done.stderr
