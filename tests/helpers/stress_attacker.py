"""One attacking client for tests/test_server_stress.py, run as its own process so that its work on the client
side (building and sending 10 MB) does not share a GIL with the client whose latency is measured.

Usage: ``python tests/helpers/stress_attacker.py ATTACK URL KEY``. It prints ``attacking`` once its first attack is
on the wire, attacks until its stdin is closed, then prints the outcomes it saw as one JSON object
({outcome: count}).
"""

from __future__ import annotations

import contextlib
import json
import socket
import sys
import threading
import time
from collections import Counter

import httpx

BIG = b'{"prompt": "' + b"x" * (10 << 20) + b'"}'
CHUNK = 64 << 10


def slow_upload(stop: threading.Event):
    """The 10 MB body in 64 KiB pieces, 10 ms apart."""
    for i in range(0, len(BIG), CHUNK):
        if stop.is_set():
            return
        yield BIG[i:i + CHUNK]
        time.sleep(0.01)


def attack(name: str, url: str, key: str, stop: threading.Event, started: threading.Event) -> Counter:
    """``name`` again and again until ``stop``; returns what the server answered each time. ``started`` is set
    once the first request's bytes are going out."""
    seen: Counter = Counter()
    port = int(url.rsplit(":", 1)[1])

    def trace(event: str, info: dict) -> None:  # NOTE: httpcore's trace events
        if event == "http11.send_request_body.started":
            started.set()

    while not stop.is_set():
        if name == "half-open connection":
            with socket.create_connection(("127.0.0.1", port)) as s:
                s.sendall(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-ty")
                started.set()
                s.settimeout(10)
                with contextlib.suppress(OSError):
                    s.recv(1024)  # NOTE: returns when the server closes it (the request timeout)
            seen["closed by the server"] += 1
            continue
        body = BIG if name == "10 MB body at once" else slow_upload(stop)
        try:
            with httpx.Client(timeout=60) as client:  # NOTE: a new connection each time, as httpx.post
                r = client.post(url + "/v1/completions", content=body, extensions={"trace": trace},
                                headers={"Authorization": f"Bearer {key}", "content-type": "application/json"})
            seen[str(r.status_code)] += 1
        except httpx.TransportError:  # NOTE: the server closes the connection after its 413 mid-upload
            seen["closed after 413"] += 1
    return seen


def main() -> None:
    name, url, key = sys.argv[1:4]
    stop, started = threading.Event(), threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
    threading.Thread(target=lambda: (started.wait(), print("attacking", flush=True)), daemon=True).start()
    print(json.dumps(attack(name, url, key, stop, started)), flush=True)


if __name__ == "__main__":
    main()
