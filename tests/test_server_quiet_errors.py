"""Bodies that once reached the server's log as tracebacks: JSON nested thousands of levels deep (a 500 from a
RecursionError; now a 400 in OpenAI's shape), and a client that leaves while sending its body (starlette's
ClientDisconnect as "Exception in ASGI application"; now one line at debug level)."""

from __future__ import annotations

import socket
import time

import httpx
import pytest

from tests.helpers.server_utils import running_server

pytestmark = pytest.mark.server
ARGS = ["--device", "cpu", "--max-model-len", "128", "--num-kvcache-blocks", "32", "--served-model-name", "tiny",
        "--log-level", "debug"]


@pytest.fixture(scope="module")
def server(tiny_tied_model, tmp_path_factory):
    log_dir = tmp_path_factory.mktemp("quiet")
    with running_server(tiny_tied_model, ARGS, log_dir) as srv:
        srv.log_path = log_dir / "server.log"
        yield srv


def _tracebacks(server) -> list[str]:
    text = server.log_path.read_text()
    return [line for line in text.splitlines()
            if "Traceback" in line or "Exception in ASGI application" in line or "ClientDisconnect" in line]


@pytest.mark.parametrize("depth, closed", [(3000, True), (3000, False), (1_000_000, True)])
@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions", "/tokenize"])
def test_deeply_nested_json_is_a_400(server, path, depth, closed):
    body = '{"model": "tiny", "prompt": ' + "[" * depth + ("]" * depth if closed else "") + "}"
    r = httpx.post(server.url + path, content=body, headers={"content-type": "application/json"}, timeout=30)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["type"] == "invalid_request_error"
    assert "more than 200 levels deep" in err["message"], err


def test_deep_json_after_a_lone_surrogate_is_a_400_too(server):
    """pydantic's parser refuses the surrogate first; the standard parser that reads such a body is held to the
    same depth (and names the bad text when the depth is fine)."""
    for depth, message in ((250, "more than 200 levels deep"), (5000, "more than 200 levels deep"),
                           (3, "not valid Unicode")):
        body = '{"model": "tiny", "prompt": "\\ud800", "stop": ' + "[" * depth + "]" * depth + "}"
        r = httpx.post(server.url + "/v1/completions", content=body, headers={"content-type": "application/json"},
                       timeout=30)
        assert r.status_code == 400 and message in r.json()["error"]["message"], r.text
    out = server.client.completions.create(model="tiny", prompt=[[1, 2, 3]], max_tokens=2)
    assert out.choices[0].finish_reason == "length"
    assert _tracebacks(server) == []


def test_a_client_that_leaves_mid_body_leaves_no_traceback(server):
    port = int(server.url.rsplit(":", 1)[1])
    for path in ("/v1/completions", "/v1/chat/completions", "/tokenize"):
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            sock.sendall(f"POST {path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                         f"content-length: 1000\r\n\r\n".encode() + b'{"model": "tiny", "prompt": ')
            sock.shutdown(socket.SHUT_RDWR)
        # NOTE: the server notes each departure at debug level: wait for that line, then read the log
        deadline = time.monotonic() + 30
        while f"the client left while sending POST {path}" not in server.log_path.read_text():
            assert time.monotonic() < deadline, server.log_path.read_text()[-3000:]
            time.sleep(0.05)
    assert _tracebacks(server) == []
    assert server.client.completions.create(model="tiny", prompt="x", max_tokens=2).choices
