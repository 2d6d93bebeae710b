"""Clients that stall: a request head or body that stops arriving gets 408 and its connection closed
after client_body_timeout of silence, while other requests are served; a slow body that keeps arriving
is read to its end however long it takes.

Against user_code_server (client_body_timeout = STALL_BOUND_S), raw sockets on loopback, every wait
bounded by a deadline.

What a 6 MiB body (the size limit) needs over a slow link: 6 MiB is 50.3 Mbit, so 50 s at 1 Mbit/s and
101 s at 0.5 Mbit/s; a bound on the whole upload of 60 s (nginx's default figure) would cut the second. The
bound here is on silence (each byte restarts it): test_slow_upload_that_keeps_sending_is_served sends the
6 MiB body in pieces spread over about 3x the bound and it is served.
"""
from __future__ import annotations

import json
import selectors
import socket
import time
from urllib.parse import urlparse

import httpx
import pytest

from conftest import PLANTED_SECRETS, STALL_BOUND_S

pytestmark = pytest.mark.engine

STALLED = 150
LIMIT = 6 * 1024 * 1024  # max_request_bytes' default
SLACK_S = 15.0  # scheduling on a loaded 2-core machine; the measured figure is in the failure message


def _addr(url: str) -> tuple[str, int]:
    u = urlparse(url)
    return u.hostname, u.port


def _stalled_requests(host: str, port: int) -> list[bytes]:
    """What each stalled client sends before it goes silent: bodies cut short on /invocations and on a
    vLLM route, and request heads cut short."""
    body_head = (b"POST /invocations HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: 1000\r\n\r\n{\"inputs\": \"Hel")
    openai_head = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                   b"Authorization: Bearer " + PLANTED_SECRETS["OPTION_API_KEY"].encode() + b"\r\n"
                   b"Content-Length: 500\r\n\r\n{\"prompt\"")
    partial_head = b"POST /invocations HTTP/1.1\r\nHost: x\r\nContent-Le"
    return [body_head] * 120 + [openai_head] * 15 + [partial_head] * 15


def test_stalled_clients_get_408_and_are_closed_within_the_bound(user_code_server):
    host, port = _addr(user_code_server.url)
    sel = selectors.DefaultSelector()
    states = []
    for data in _stalled_requests(host, port):
        s = socket.create_connection((host, port), timeout=10)
        s.sendall(data)
        s.setblocking(False)
        st = {"sock": s, "sent": time.monotonic(), "got": b"", "closed": None,
              "head": b"\r\n\r\n" not in data}
        states.append(st)
        sel.register(s, selectors.EVENT_READ, st)
    assert len(states) == STALLED

    # normal requests are served meanwhile
    with httpx.Client(base_url=user_code_server.url, timeout=60) as c:
        t0 = time.monotonic()
        assert c.get("/ping").status_code == 200
        r = c.post("/invocations", json={"inputs": "Hello", "parameters": {"max_new_tokens": 4,
                                                                           "ignore_eos_token": True}})
        assert r.status_code == 200 and r.json()["tokens"] == 4, r.text  # the model's output formatter's shape
        served_s = time.monotonic() - t0

    deadline = states[-1]["sent"] + STALL_BOUND_S + SLACK_S
    left = STALLED
    try:
        while left and time.monotonic() < deadline:
            for key, _ in sel.select(timeout=0.5):
                st = key.data
                try:
                    chunk = st["sock"].recv(65536)
                except BlockingIOError:
                    continue
                except ConnectionResetError:
                    chunk = b""
                if chunk:
                    st["got"] += chunk
                    continue
                st["closed"] = time.monotonic()
                sel.unregister(st["sock"])
                left -= 1
    finally:
        for st in states:
            st["sock"].close()
    assert left == 0, f"{left} of {STALLED} stalled connections still open {STALL_BOUND_S + SLACK_S:g}s after the bound"
    waits = [st["closed"] - st["sent"] for st in states]
    assert min(waits) >= STALL_BOUND_S * 0.9, f"closed before the bound: {min(waits):.2f}s"
    assert max(waits) <= STALL_BOUND_S + SLACK_S, f"closed {max(waits):.2f}s after the last byte"
    for st in states:
        assert st["got"].startswith(b"HTTP/1.1 408 "), st["got"][:200]
        body = json.loads(st["got"].split(b"\r\n\r\n", 1)[1])
        assert body["code"] == 408 and body["field"] == ("head" if st["head"] else "body")
    print(f"{STALLED} stalled clients closed {min(waits):.2f}-{max(waits):.2f}s after their last byte "
          f"(bound {STALL_BOUND_S}s); a normal request took {served_s:.2f}s meanwhile")
    with httpx.Client(base_url=user_code_server.url, timeout=60) as c:
        assert c.get("/ping").status_code == 200


def test_slow_upload_that_keeps_sending_is_served(user_code_server):
    host, port = _addr(user_code_server.url)
    doc = json.dumps({"inputs": "Hello", "parameters": {"max_new_tokens": 2}}).encode()
    body = doc + b" " * (LIMIT - len(doc))  # 6 MiB, the limit: JSON allows the trailing spaces
    pieces = 24
    gap = STALL_BOUND_S * 3 / pieces  # the whole takes about 3x the bound; no silence reaches it
    size = -(-len(body) // pieces)
    t0 = time.monotonic()
    with socket.create_connection((host, port), timeout=120) as s:
        s.sendall(b"POST /invocations HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n")
        for i in range(0, len(body), size):
            time.sleep(gap)
            s.sendall(body[i:i + size])
        sent_s = time.monotonic() - t0
        got = b""
        while b"\r\n\r\n" not in got or len(got.split(b"\r\n\r\n", 1)[1]) < _length(got):
            chunk = s.recv(65536)
            if not chunk:
                break
            got += chunk
    assert sent_s > STALL_BOUND_S * 2, sent_s
    assert got.startswith(b"HTTP/1.1 200 "), got[:300]
    answer = json.loads(got.split(b"\r\n\r\n", 1)[1])
    assert answer["type"] == "CompletionResponse" and answer["tokens"] == 2
    print(f"6 MiB sent in {sent_s:.1f}s ({LIMIT / sent_s / 1024:.0f} KiB/s) against a {STALL_BOUND_S}s bound: served")


def _length(raw: bytes) -> int:
    head = raw.split(b"\r\n\r\n", 1)[0].lower()
    for line in head.split(b"\r\n"):
        if line.startswith(b"content-length:"):
            return int(line.split(b":")[1])
    return 0
