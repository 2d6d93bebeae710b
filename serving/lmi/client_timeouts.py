"""Clients that stall: a request head or body that stops arriving gets 408 and its connection closed.

The bound (setting client_body_timeout, 60 s by default, as nginx's client_header_timeout and
client_body_timeout) is on silence: each byte that arrives restarts it, so a slow upload that keeps
sending is read to its end, however long the whole takes.

- The body is read by the middleware through `receive_within`, which raises `BodyTimeout` when
  no part of it arrives within the bound.
- The head comes before the ASGI app sees the request, inside uvicorn's HTTP protocol, which bounds
  only the idle time between requests (keep-alive). `guard_request_heads` gives uvicorn's two HTTP
  protocols (h11 and httptools) a timer per connection that runs while a request head is
  incomplete (from the connection's first byte, or from the first byte after a finished response)
  and restarts at each byte that arrives; when it fires the connection gets 408 and is closed.
"""
from __future__ import annotations

import asyncio
import json
import logging

from ..settings import TABLE

log = logging.getLogger("vllm.lmi")

TIMEOUT_ENV = TABLE["client_body_timeout"].engine_env


class BodyTimeout(Exception):
    """No part of the request body arrived within the bound."""


def body_timeout_body(bound: float) -> bytes:
    return json.dumps({"error": f"body: no part of the request body arrived for {bound:g} s; send the whole "
                       f"body without pausing that long (set {TIMEOUT_ENV} to change the bound)",
                       "code": 408, "field": "body"}).encode()


def head_timeout_response(bound: float) -> bytes:
    body = json.dumps({"error": f"request head: incomplete after {bound:g} s without a byte; send the whole "
                       f"request line and headers (set {TIMEOUT_ENV} to change the bound)",
                       "code": 408, "field": "head"}).encode()
    return (b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\nconnection: close\r\n"
            b"content-length: " + str(len(body)).encode() + b"\r\n\r\n" + body)


async def receive_within(receive, bound: float):
    """The next request message, or BodyTimeout if none arrives within `bound` seconds."""
    try:
        async with asyncio.timeout(bound):
            return await receive()
    except TimeoutError:
        raise BodyTimeout() from None


_GUARDED: dict[type, float] = {}


def guard_request_heads(bound: float) -> list[str]:
    """Give uvicorn's HTTP protocols the idle-head bound; returns the names of those guarded."""
    classes = []
    try:
        from uvicorn.protocols.http.h11_impl import H11Protocol
        classes.append(H11Protocol)
    except ImportError:
        pass
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
        classes.append(HttpToolsProtocol)
    except ImportError:  # httptools not installed: uvicorn uses h11
        pass
    for cls in classes:
        if cls not in _GUARDED:
            _guard(cls)
        _GUARDED[cls] = bound
    return [c.__name__ for c in classes]


def _waiting_for_head(protocol) -> bool:
    cycle = getattr(protocol, "cycle", None)
    return cycle is None or cycle.response_complete


def _guard(cls) -> None:
    made, received, lost = cls.connection_made, cls.data_received, cls.connection_lost

    def disarm(self) -> None:
        timer = self.__dict__.pop("_lmi_head_timer", None)
        if timer is not None:
            timer.cancel()

    def arm(self) -> None:
        disarm(self)
        self._lmi_head_timer = asyncio.get_running_loop().call_later(_GUARDED[cls], fire, self)

    def fire(self) -> None:
        self.__dict__.pop("_lmi_head_timer", None)
        transport = getattr(self, "transport", None)
        if transport is None or transport.is_closing() or not _waiting_for_head(self):
            return
        log.info("closing a connection whose request head stayed incomplete for %gs (408)", _GUARDED[cls])
        transport.write(head_timeout_response(_GUARDED[cls]))
        transport.close()

    def connection_made(self, transport) -> None:
        made(self, transport)
        arm(self)  # a connection that never sends a whole head is bounded too

    def data_received(self, data: bytes) -> None:
        received(self, data)
        if _waiting_for_head(self) and data and not self.transport.is_closing():
            arm(self)  # part of a head: the bound restarts at each byte
        else:
            disarm(self)  # the head is complete: the body is bounded by the middleware

    def connection_lost(self, exc) -> None:
        disarm(self)
        lost(self, exc)

    cls.connection_made, cls.data_received, cls.connection_lost = connection_made, data_received, connection_lost
