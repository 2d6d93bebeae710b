"""ASGI receive() and send() wrappers of the middleware: they replay a body already read, stop at a hang-up,
and rewrite vLLM's answers into the shapes LMI clients read."""
from __future__ import annotations

import asyncio
import json

from . import stream
from .sessions import SESSION_HEADER


class ClientGone(Exception):
    """The client hung up before its answer."""


def replay(body: bytes, receive):
    """A receive() that hands the already-read body to vLLM, then the real connection events."""
    sent = False

    async def replayed():
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()
    return replayed


async def unless_disconnected(coro, receive):
    """Await the handler, cancelling it (so vLLM aborts the request) if the client goes away."""
    work = asyncio.ensure_future(coro)

    async def disconnected():
        while (await receive())["type"] != "http.disconnect":
            pass

    watcher = asyncio.ensure_future(disconnected())
    try:
        done, _ = await asyncio.wait({work, watcher}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:  # e.g. the drain ended this request: vLLM aborts it
        work.cancel()
        raise
    finally:
        watcher.cancel()
    if work in done:
        return work.result()
    work.cancel()
    raise ClientGone()


async def discard(receive, budget: int, seconds: float) -> bool:
    """Read and drop the rest of the request body; False if it is longer than budget bytes,
    takes longer than `seconds`, or the client went away."""
    seen = 0
    deadline = asyncio.get_running_loop().time() + seconds
    try:
        async with asyncio.timeout_at(deadline):
            while seen <= budget:
                message = await receive()
                if message["type"] == "http.disconnect":
                    return False
                seen += len(message.get("body", b""))
                if not message.get("more_body", False):
                    return True
    except TimeoutError:
        pass
    return False


def with_header(scope, name: bytes, value: bytes):
    """The scope with the request header `name` (lower case) set to `value`, replacing any."""
    return {**scope, "headers": [(k, v) for k, v in scope["headers"] if k != name] + [(name, value)]}


def sse_to_jsonlines(send):
    """A send() that turns vLLM's server-sent events into LMI's jsonlines: each `data: {...}`
    event becomes `{...}` and a newline; `[DONE]` is dropped. Events may span body messages."""
    pending = b""
    is_sse = False

    async def wrapped(message):
        nonlocal pending, is_sse
        if message["type"] == "http.response.start":
            headers = dict(message.get("headers") or [])
            is_sse = headers.get(b"content-type", b"").startswith(b"text/event-stream")
            if is_sse:
                message = {**message, "headers": [(k, v) for k, v in message["headers"]
                                                  if k not in (b"content-type", b"content-length")]
                           + [(b"content-type", stream.MEDIA_TYPE.encode())]}
            await send(message)
            return
        if message["type"] != "http.response.body" or not is_sse:
            await send(message)
            return
        pending += message.get("body", b"")
        *events, pending = pending.split(b"\n\n")
        more = message.get("more_body", False)
        if not more and pending.strip():
            events.append(pending)
            pending = b""
        out = []
        for event in events:
            for line in event.split(b"\n"):
                if line.startswith(b"data:"):
                    data = line[5:].strip()
                    if data and data != b"[DONE]":
                        out.append(data + b"\n")
        await send({"type": "http.response.body", "body": b"".join(out), "more_body": more})
    return wrapped


def session_answer_as_json(send):
    """A send() that gives vLLM's session answers (plain text, no content type) a JSON body naming the
    session, beside SageMaker's headers (X-Amzn-SageMaker-New-Session-Id: <id>; Expires=..., or
    X-Amzn-SageMaker-Closed-Session-Id: <id>), so clients that parse the body read it too. A create
    also carries the id under the name LMI answers it with (X-Amzn-SageMaker-Session-Id: <id>;
    Expires=...), which LMI's own client reads."""
    held: dict | None = None
    parts: list[bytes] = []

    async def wrapped(message):
        nonlocal held
        if message["type"] == "http.response.start":
            names = {k.lower() for k, _ in message.get("headers") or []}
            if message["status"] == 200 and b"content-type" not in names:
                held = message  # until the whole (small) body is in
                return
            await send(message)
            return
        if held is None or message["type"] != "http.response.body":
            await send(message)
            return
        parts.append(message.get("body", b""))
        if message.get("more_body"):
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in held.get("headers") or []}
        text = b"".join(parts).decode("utf-8", "replace").strip()
        doc = {"message": text} if text else {}  # vLLM's hooks answer e.g. "Session <id> created"
        extra = []
        if "x-amzn-sagemaker-new-session-id" in headers:
            sid, _, expires = headers["x-amzn-sagemaker-new-session-id"].partition(";")
            doc.update(session_id=sid.strip(), expires=expires.strip().removeprefix("Expires=") or None)
            if SESSION_HEADER.lower() not in headers:
                # LMI answers the create with this name (its client reads it); same value
                value = headers["x-amzn-sagemaker-new-session-id"]
                extra.append((SESSION_HEADER.lower().encode(), value.encode("latin-1")))
        elif "x-amzn-sagemaker-closed-session-id" in headers:
            doc.update(closed_session_id=headers["x-amzn-sagemaker-closed-session-id"].strip())
        body = json.dumps(doc).encode()
        rest = [(k, v) for k, v in held.get("headers") or [] if k.lower() != b"content-length"]
        await send({**held, "headers": rest + extra + [(b"content-type", b"application/json"),
                                               (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})
    return wrapped
