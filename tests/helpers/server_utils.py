"""``minivllm serve`` as a real process for tests: start it, wait until it is healthy, read its metrics."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai
from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class SimpleServer:
    """A running server: its process, base URL, an ``openai`` client, its metrics."""

    def __init__(self, proc, url, model_path, api_key: str = "none"):
        self.proc, self.url, self.model_path = proc, url, model_path
        self.client = openai.OpenAI(base_url=f"{url}/v1", api_key=api_key, max_retries=0, timeout=60)

    def metrics(self) -> dict[str, float]:
        text = httpx.get(f"{self.url}/metrics").text
        return {s.name + json.dumps(dict(sorted((k, v) for k, v in s.labels.items() if k != "model_name"))): s.value
                for f in text_string_to_metric_families(text) for s in f.samples}

    def wait_idle(self, timeout: float = 20.0) -> dict[str, float]:
        """The metrics once nothing runs, waits or holds a KV block."""
        deadline = time.monotonic() + timeout
        while True:
            m = self.metrics()
            if (m["vllm:num_requests_running{}"] == 0 and m["vllm:num_requests_waiting{}"] == 0
                    and m["minivllm_kv_cache_blocks_used{}"] == 0):
                return m
            assert time.monotonic() < deadline, f"server not idle: {m}"
            time.sleep(0.05)


def wait_healthy(proc, url: str, log, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        assert proc.poll() is None, f"server exited early:\n{log.seek(0) or log.read()}"
        assert time.monotonic() < deadline, f"server not healthy in time:\n{log.seek(0) or log.read()}"
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)


@contextlib.contextmanager
def running_server(model: str, args: list[str], log_dir: Path, env: dict | None = None, api_key: str = "none",
                   command: list[str] | None = None):
    """``minivllm serve model *args`` (or ``command``, which gets the port appended) until the block ends."""
    port = free_port()
    log = open(log_dir / "server.log", "w+")
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""), **(env or {})}
    cmd = command or [sys.executable, "-m", "minivllm.entrypoints.cli", "serve", model, *args, "--port"]
    proc = subprocess.Popen([*cmd, str(port)], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(proc, url, log)
        yield SimpleServer(proc, url, model, api_key)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()


def stream_events(url: str, path: str, body: dict) -> list[dict]:
    """POST ``body`` with ``"stream": true`` to ``url + path``: the SSE events' JSON, after checking the 200 and
    the closing ``[DONE]``."""
    with httpx.stream("POST", url + path, json={**body, "stream": True}, timeout=60) as r:
        assert r.status_code == 200
        lines = [ln.removeprefix("data: ") for ln in r.iter_lines() if ln.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(ln) for ln in lines[:-1]]


def chat_message(client, stream: bool, **kw) -> tuple[dict, str | None]:
    """(message dict, finish_reason) of one chat completion through the ``openai`` client; a stream is put back
    together from its deltas (content, reasoning, and each tool call's id and name once, its arguments in
    pieces)."""
    if not stream:
        r = client.chat.completions.create(**kw)
        return r.choices[0].message.model_dump(), r.choices[0].finish_reason
    content, reasoning, calls, finish = "", "", {}, None
    for chunk in client.chat.completions.create(stream=True, **kw):
        for c in chunk.choices:
            d = c.delta
            content += d.content or ""
            reasoning += getattr(d, "reasoning", None) or ""
            for tc in d.tool_calls or []:
                call = calls.setdefault(tc.index, {"id": None, "name": None, "arguments": ""})
                if tc.id:
                    assert call["id"] is None, "a call's id comes once"
                    call["id"], call["name"] = tc.id, tc.function.name
                call["arguments"] += tc.function.arguments or ""
            finish = c.finish_reason or finish
    calls = [{"id": c["id"], "function": {"name": c["name"], "arguments": c["arguments"]}}
             for _, c in sorted(calls.items())]
    return {"content": content or None, "reasoning": reasoning or None, "tool_calls": calls}, finish
