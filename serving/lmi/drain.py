"""Graceful drain when the platform stops the container (SIGTERM on scale-in).

vLLM 0.32 calls `engine_client.shutdown(timeout=<--shutdown-timeout>)` in a worker thread when
the API server gets SIGTERM/SIGINT, while its HTTP server keeps running; when that call returns
it stops the HTTP server. We hook that call:

1. From the signal on, every new HTTP request (``/ping`` included, so the load balancer stops
   routing here) gets 503 and its connection is closed; ``/metrics`` still answers.
2. Requests already in flight run to their end, for at most the drain timeout (vLLM's
   ``shutdown_timeout``, which the launcher sets from the ``shutdown_timeout`` setting).
3. A request still running at the timeout is ended here: a stream gets a final error record in
   its own format (an LMI JSON line, or an SSE ``data:`` event) and is closed; a request with no
   answer yet gets 503. Its handler is cancelled, which aborts its engine request.
4. Only then does vLLM stop the engine (it has nothing left to do) and the HTTP server, whose
   connections are all finished, so uvicorn does not wait on them; the process exits 0.

A last guard ends the process (status 1) if it is still alive HARD_EXIT_GRACE_S after the drain
timeout, so a stop can never hang until the platform's SIGKILL.
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
import threading
import time

from .errors import LMIError, send_json

log = logging.getLogger("vllm.lmi")

# Stopping the idle engine after the drain (its process manager kills it after this).
ENGINE_STOP_S = 10.0
HARD_EXIT_GRACE_S = 30.0
HARD_EXIT_STATUS = 1
OPEN_DURING_DRAIN = ("/metrics",)


class InFlight:
    """One HTTP request: remembers what the app sent so the drain can end it properly."""

    __slots__ = ("_send", "task", "started", "done", "forced", "media_type")

    def __init__(self, send, task: asyncio.Task | None) -> None:
        self._send = send
        self.task = task
        self.started = self.done = self.forced = False
        self.media_type = b""

    async def send(self, message) -> None:
        if self.forced:
            return  # the drain already ended this response
        kind = message["type"]
        if kind == "http.response.start":
            self.started = True
            self.media_type = next((v for k, v in message.get("headers", ()) if k.lower() == b"content-type"), b"")
        elif kind == "http.response.body" and not message.get("more_body", False):
            self.done = True
        await self._send(message)

    async def force_end(self, reason: str) -> None:
        self.forced = True
        if not self.done:
            self.done = True
            try:
                if not self.started:
                    await send_json(self._send, 503, LMIError(reason, None, 503).body(), [(b"connection", b"close")])
                else:
                    await self._send({"type": "http.response.body", "body": final_record(self.media_type, reason),
                                      "more_body": False})
            except Exception:  # the client may be gone already
                pass
        if self.task is not None and self.task is not asyncio.current_task():
            self.task.cancel()


def final_record(media_type: bytes, reason: str) -> bytes:
    """The last piece of a stream cut by the drain, in the stream's own format."""
    if media_type.startswith(b"text/event-stream"):  # vLLM's OpenAI stream: its error event, then [DONE]
        err = {"error": {"message": reason, "type": "ServiceUnavailableError", "param": None, "code": 503}}
        return f"data: {json.dumps(err)}\n\ndata: [DONE]\n\n".encode()
    if media_type.startswith(b"application/jsonlines"):  # LMI: one more JSON line
        return (json.dumps({"error": reason, "code": 503}) + "\n").encode()
    return b""  # a plain body already under way: it can only be cut short


class Drain:
    def __init__(self) -> None:
        self.draining = False
        self.timeout_s = 0.0
        self.inflight: set[InFlight] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._idle: asyncio.Event | None = None
        self._done = False

    # -- per request (event loop) ----------------------------------------------------------

    def refuses(self, scope) -> bool:
        return self.draining and scope["path"] not in OPEN_DURING_DRAIN

    async def refuse(self, send) -> None:
        err = LMIError("the server is shutting down and takes no new requests; retry on another instance",
                       None, 503)
        await send_json(send, 503, err.body(), [(b"connection", b"close")])

    def track(self, send) -> InFlight:
        req = InFlight(send, asyncio.current_task())
        self.inflight.add(req)
        if self._idle is not None:
            self._idle.clear()
        return req

    def untrack(self, req: InFlight) -> None:
        self.inflight.discard(req)
        if not self.inflight and self._idle is not None:
            self._idle.set()

    # -- shutdown --------------------------------------------------------------------------

    def attach(self, engine_client) -> None:
        """Wrap engine_client.shutdown (called once the app started, on the event loop)."""
        self._loop = asyncio.get_running_loop()
        self._idle = asyncio.Event()
        if not self.inflight:
            self._idle.set()
        self.timeout_s = float(getattr(getattr(engine_client, "vllm_config", None), "shutdown_timeout", 0) or 0)
        original = engine_client.shutdown

        def shutdown(*args, **kwargs):
            if self._drain_from_thread() and "timeout" in kwargs:
                kwargs["timeout"] = min(kwargs["timeout"] or ENGINE_STOP_S, ENGINE_STOP_S)
            return original(*args, **kwargs)

        engine_client.shutdown = shutdown

    def _drain_from_thread(self) -> bool:
        """Run the drain on the event loop and wait for it; False where that cannot be done
        (called on the loop's own thread, or a second time)."""
        loop = self._loop
        if self._done or loop is None or loop.is_closed():
            return False
        try:
            if asyncio.get_running_loop() is loop:
                return False  # a shutdown from inside the loop: waiting here would block it
        except RuntimeError:
            pass
        self._done = True
        guard = threading.Timer(self.timeout_s + ENGINE_STOP_S + HARD_EXIT_GRACE_S, _hard_exit)
        guard.daemon = True
        guard.start()
        try:
            asyncio.run_coroutine_threadsafe(self.drain(), loop).result(self.timeout_s + ENGINE_STOP_S)
        except Exception:
            log.exception("drain: did not complete; stopping anyway")
        return True

    async def drain(self) -> None:
        self.draining = True
        t0 = time.monotonic()
        log.info("drain: stop requested; refusing new requests (/ping answers 503), waiting up to %gs for %d "
                 "request(s) in flight", self.timeout_s, len(self.inflight))
        try:
            await asyncio.wait_for(self._idle.wait(), self.timeout_s)
            log.info("drain: every request finished after %.1fs; stopping", time.monotonic() - t0)
            return
        except asyncio.TimeoutError:
            pass
        left = list(self.inflight)
        log.warning("drain: timeout of %gs reached; ending %d request(s) still running with an error",
                    self.timeout_s, len(left))
        reason = f"the server is shutting down: its drain timeout ({self.timeout_s:g}s) ended before this request"
        for req in left:
            await req.force_end(reason)


def _hard_exit() -> None:
    log.error("drain: the process is still running %gs after the drain timeout; exiting with status %d",
              ENGINE_STOP_S + HARD_EXIT_GRACE_S, HARD_EXIT_STATUS)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(HARD_EXIT_STATUS)
