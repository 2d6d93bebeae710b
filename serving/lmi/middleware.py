"""ASGI middleware vLLM loads with `--middleware serving.lmi.middleware.LMIMiddleware`.

It sits in front of vLLM's own app and only touches `POST /invocations` (and the lifespan):
- enforces the request size limit (setting max_request_bytes, default 6 MiB, SageMaker's
  real-time payload limit) on every body kind;
- dispatches by body kind (schema.body_kind): an LMI/TGI body (`{"inputs": ...}`) is validated, turned
  into a completion request and served in-process by vLLM's own completion handler
  (app.state.openai_serving_completion): no second HTTP hop, no re-serialisation of the request; with
  tgi_compat it is answered in TGI's shapes;
- an OpenAI body (chat `messages` / completion `prompt`) goes on to vLLM unchanged, so it is
  answered exactly as vLLM answers it (SSE when streaming; with output_formatter=jsonlines the
  same chunks one a line, as LMI streams them); only the LoRA adapter it names (adapters.py) is
  handed to vLLM's SageMaker hooks in their adapter header;
- a SageMaker session request (`requestType`) goes to vLLM's hooks, and their answer gets a JSON body;
- a JSON body of none of these kinds gets LMI's 424 naming the kinds;
- `X-Amzn-SageMaker-Custom-Attributes: route=<path>` sends a body that is not an LMI body to that vLLM
  route as sent (custom_attributes.py);
- the user's code (formatters.py): LMI's @input_formatter of model.py rewrites each body first, and
  with an @output_formatter the request is served in-process and the formatter makes the body; a
  custom invocation handler registered through mhcs gets every body as sent instead;
- a request head or body that goes silent for client_body_timeout gets 408 and its connection
  closed (client_timeouts.py); every HTTP request's body is bounded so, not only /invocations.
SageMaker's sessions are read from their folder, so that every API server process (api_server_count) knows
every session (sessions.py).
On the lifespan it starts the engine watch that ends the process non-zero if the engine dies,
and hooks the graceful drain on SIGTERM (drain.py), which sees every HTTP request.
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
import re

from ..settings import TABLE, engine_value
from . import adapters, custom_attributes, formatters, schema, sessions, stream, translate
from .asgi_wrappers import (ClientGone, discard, replay, session_answer_as_json, sse_to_jsonlines,
                            unless_disconnected, with_header)
from .client_timeouts import BodyTimeout, body_timeout_body, guard_request_heads, receive_within
from .drain import Drain
from .engine_watch import EngineWatch
from .errors import LMIError, send_error, send_json

log = logging.getLogger("vllm.lmi")

LIMIT_ENV = TABLE["max_request_bytes"].engine_env
DEFAULT_MAX_REQUEST_BYTES = TABLE["max_request_bytes"].default
# A body over the limit is still read (and dropped), up to this many times the limit and this
# long, before the 413 goes out: clients such as requests and urllib send the whole body before
# they read an answer, and a connection closed under them reads as a reset, not a 413 (nginx's
# lingering close does the same).
DISCARD_FACTOR = 16
DISCARD_S = 30.0


def max_request_bytes(env=os.environ) -> int:
    """The limit the launcher handed over (the settings table parses and defaults it)."""
    return engine_value("max_request_bytes", env)


class LMIMiddleware:
    def __init__(self, app) -> None:
        self.app = app
        self.max_bytes = max_request_bytes()
        self.body_timeout = float(engine_value("client_body_timeout", os.environ))
        guard_request_heads(self.body_timeout)
        self.tgi = engine_value("tgi_compat", os.environ)
        self.openai_jsonlines = engine_value("output_formatter", os.environ) == "jsonlines"
        self.watch: EngineWatch | None = None
        self.drain = Drain()
        self.formatters = formatters.load()
        sessions.share_process_sessions()
        # body kind -> what serves it
        self.serves = {"lmi": self._serve_lmi, "chat": self._serve_openai, "completion": self._serve_openai,
                       "session": self._serve_session}

    async def __call__(self, scope, receive, send):
        kind = scope["type"]
        if kind == "http":
            if self.drain.refuses(scope):
                await self.drain.refuse(send)
                return
            req = self.drain.track(send)
            try:
                if scope["path"] == "/invocations" and scope["method"] == "POST":
                    await self._invocations(scope, receive, req.send)
                else:
                    await self._bounded(scope, receive, req.send)
            except asyncio.CancelledError:
                if not req.forced:  # not ended by the drain: someone else's cancellation
                    raise
            finally:
                self.drain.untrack(req)
        elif kind == "lifespan":
            await self.app(scope, self._lifespan_receive(scope, receive), self._lifespan_send(scope, send))
        else:
            await self.app(scope, receive, send)

    # -- lifespan: engine watch -------------------------------------------------------------

    def _lifespan_send(self, scope, send):
        async def wrapped(message):
            if message["type"] == "lifespan.startup.complete":
                client = getattr(scope["app"].state, "engine_client", None)
                if client is not None:
                    self.drain.attach(client)  # before the watch, whose shutdown hook must run first
                    self.watch = EngineWatch(client, scope["app"].state)
                    self.watch.start()
            await send(message)
        return wrapped

    def _lifespan_receive(self, scope, receive):
        async def wrapped():
            message = await receive()
            if message["type"] == "lifespan.shutdown" and self.watch is not None:
                # vLLM's own watchdog stops the server when the engine dies; exit non-zero then.
                if self.watch.engine_died():
                    self.watch.exit_now()
                self.watch.stop()
            return message
        return wrapped

    async def _send_body_timeout(self, send):
        """The answer to a body that went silent for client_body_timeout: 408, and the connection closed."""
        await send_json(send, 408, body_timeout_body(self.body_timeout), [(b"connection", b"close")])

    async def _bounded(self, scope, receive, send):
        """The app, with the request body bounded: silence for client_body_timeout while the body is
        incomplete ends the request with 408 and closes the connection; the app then reads a hang-up."""
        body_done = False
        answered = False
        started = False

        async def bounded_receive():
            nonlocal body_done, answered
            if body_done or answered:
                return await receive() if not answered else {"type": "http.disconnect"}
            try:
                message = await receive_within(receive, self.body_timeout)
            except BodyTimeout:
                answered = True
                if not started:
                    await self._send_body_timeout(send)
                return {"type": "http.disconnect"}
            if message["type"] != "http.request" or not message.get("more_body", False):
                body_done = True
            return message

        async def guarded_send(message):
            nonlocal started
            if answered:
                return  # the 408 is the answer
            started = True
            await send(message)

        await self.app(scope, bounded_receive, guarded_send)

    # -- /invocations -----------------------------------------------------------------------

    async def _invocations(self, scope, receive, send):
        body = await self._body(scope, receive, send)
        if body is None:
            return
        try:
            route = custom_attributes.requested_route(scope)
        except LMIError as e:
            await send_error(send, e)
            return
        doc, bad = _decode(body)
        if route is not None and schema.body_kind(doc) != "lmi":
            await self._routed(scope, receive, send, route, body, doc)
            return
        if bad is not None:
            await send_error(send, bad)
            return
        if _custom_invocation_handler():
            # The user replaced /invocations (mhcs): their handler gets every body as sent.
            await self.app(scope, replay(body, receive), send)
            return
        try:
            scope, body, doc, fmt = self._format_input(scope, body, doc)
        except LMIError as e:
            await send_error(send, e)
            return
        serve = self.serves.get(schema.body_kind(doc))
        if serve is None:
            await send_error(send, LMIError(schema.NO_KIND, "body"))
            return
        await serve(scope, receive, send, body, doc, fmt)

    async def _body(self, scope, receive, send) -> bytes | None:
        """The request body, or None when the request is answered already (too large, silent, gone)."""
        try:
            return await self._read_body(scope, receive)
        except ClientGone:
            return None
        except BodyTimeout:
            await self._send_body_timeout(send)
            return None
        except LMIError as e:
            # A client that asked to continue has sent nothing yet: answer at once.
            waiting = (b"expect", b"100-continue") in ((k, v.lower()) for k, v in scope["headers"])
            read_all = not waiting and await discard(receive, self.max_bytes * DISCARD_FACTOR, DISCARD_S)
            await send_json(send, e.status, e.body(), [] if read_all else [(b"connection", b"close")])
            return None

    async def _read_body(self, scope, receive) -> bytes:
        limit = self.max_bytes
        for name, value in scope["headers"]:
            if name == b"content-length" and value.isdigit() and int(value) > limit:
                raise _too_large(int(value), limit)  # before reading a byte of it
        parts, size = [], 0
        while True:
            message = await receive_within(receive, self.body_timeout)
            if message["type"] == "http.disconnect":
                raise ClientGone()
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                raise _too_large(size, limit, at_least=True)
            parts.append(chunk)
            if not message.get("more_body", False):
                return b"".join(parts)

    def _format_input(self, scope, body: bytes, doc):
        """(scope, body, doc, formatters) after the user's input formatter for the adapter the request names."""
        if not self.formatters:
            return scope, body, doc, formatters.Formatters()
        adapter = adapters.requested_adapter(scope, doc)
        fmt = formatters.pick(self.formatters, adapter)
        if fmt.input is not None:
            doc = formatters.apply_input(fmt, doc, _tokenizer(scope), adapter)
            body, scope = _reencoded(scope, doc)
        return scope, body, doc, fmt

    async def _forward(self, scope, receive, send, body: bytes, doc) -> None:
        """The request, with its body already read, on to vLLM's app."""
        if self.openai_jsonlines and isinstance(doc, dict) and doc.get("stream") is True:
            send = sse_to_jsonlines(send)
        await self.app(scope, replay(body, receive), send)

    async def _routed(self, scope, receive, send, route: str, body: bytes, doc) -> None:
        """The body on to the vLLM route its custom attributes name, with the adapter it names in `model`."""
        try:
            custom_attributes.check_served(scope, route)
            adapter = adapters.requested_adapter(scope, doc)
        except LMIError as e:
            await send_error(send, e)
            return
        if isinstance(doc, dict):
            if (too_big := _int_beyond_64_bits(doc)) is not None:
                await _send_int_error(send, doc, too_big)
                return
            if "adapters" in doc or (adapter and doc.get("model") != adapter):
                doc.pop("adapters", None)
                if adapter:
                    doc["model"] = adapter
                body, scope = _reencoded(scope, doc)
        await self._forward({**scope, "path": route, "raw_path": route.encode()}, receive, send, body, doc)

    async def _serve_session(self, scope, receive, send, body: bytes, doc: dict, fmt) -> None:
        await self._forward(scope, receive, session_answer_as_json(send), body, doc)

    async def _serve_openai(self, scope, receive, send, body: bytes, doc: dict, fmt) -> None:
        if (too_big := _int_beyond_64_bits(doc)) is not None:
            await _send_int_error(send, doc, too_big)
            return
        if fmt.output is not None:
            await self._formatted(scope, receive, send, doc, fmt)
            return
        try:
            adapter = adapters.requested_adapter(scope, doc)
        except LMIError as e:
            await send_error(send, e)
            return
        if "adapters" in doc:  # LMI's field: vLLM reads the adapter from the header
            del doc["adapters"]
            body, scope = _reencoded(scope, doc)
        if adapter and not adapters.header_adapter(scope):
            scope = with_header(scope, adapters.ADAPTER_HEADER, adapter.encode("latin-1"))
        await self._forward(scope, receive, send, body, doc)

    async def _serve_lmi(self, scope, receive, send, body: bytes, doc: dict, fmt) -> None:
        if fmt.output is not None:
            await self._formatted(scope, receive, send, doc, fmt)
            return
        started = False

        async def tracked_send(message):
            nonlocal started
            started = True
            await send(message)

        try:
            await self._lmi(scope, receive, tracked_send, doc)
        except ClientGone:
            pass
        except Exception as e:  # never echo the body: it may hold secrets
            err = e if isinstance(e, LMIError) else translate.from_exception(e)
            if started:  # mid-stream: the records already sent are all the client gets
                log.error("LMI stream failed after it started: %s", type(e).__name__, exc_info=True)
            else:
                await send_error(send, err)

    async def _lmi(self, scope, receive, send, doc) -> None:
        from starlette.requests import Request
        from starlette.responses import StreamingResponse
        from vllm.entrypoints.openai.completion.protocol import CompletionResponse
        from vllm.entrypoints.serve.engine.protocol import ErrorResponse

        req = schema.parse(doc)
        if self.tgi and req.parameters.details is None:
            req.parameters.details = True  # TGI answers with details unless asked not to
        handler = getattr(scope["app"].state, "openai_serving_completion", None)
        if handler is None:
            raise LMIError("inputs: this model does not generate text, so LMI bodies cannot be served; "
                           "use the body kind its task takes", "inputs")
        adapter = adapters.requested_adapter(scope, doc)
        raw_request = Request(scope, receive)
        sessions.check_session(raw_request)
        creq = translate.completion_request(req, handler, adapter)

        tokenizer = getattr(getattr(handler, "renderer", None), "tokenizer", None)
        if req.stream:
            opened = await stream.open_streams(handler, creq, raw_request)
            special = frozenset(getattr(tokenizer, "all_special_ids", ()) or ())
            body = stream.jsonlines(req, opened, self.tgi, special)
            media = stream.TGI_MEDIA_TYPE if self.tgi else stream.MEDIA_TYPE
            try:
                await StreamingResponse(body, media_type=media)(scope, receive, send)
            finally:
                # A hang-up that lands while a line is being sent leaves the stream suspended, and
                # only the garbage collector would close it (and so abort the engine request):
                # close it now. A no-op when the stream ran to its end.
                await body.aclose()
            return

        result = await unless_disconnected(handler.create_completion(creq, raw_request), receive)
        if isinstance(result, ErrorResponse):
            raise translate.vllm_error(result.error.message, result.error.param, result.error.code)
        if not isinstance(result, CompletionResponse):
            raise LMIError(f"internal error (unexpected {type(result).__name__})", None, 500)
        decode = (lambda tid: tokenizer.decode([tid])) if tokenizer is not None else None
        out = translate.from_completion(req, result, decode)
        if self.tgi and not isinstance(out, list):
            out = [out]  # TGI answers a list even for one input
        await send_json(send, 200, json.dumps(out, ensure_ascii=False).encode())

    async def _formatted(self, scope, receive, send, doc: dict, fmt: formatters.Formatters) -> None:
        """The answer the user's output formatter makes from vLLM's answer object, as LMI's vLLM
        handler makes it: the request is served in-process by vLLM's completion or chat handler and
        the formatter gets the CompletionResponse / ChatCompletionResponse, or each streamed chunk."""
        from starlette.requests import Request
        from starlette.responses import StreamingResponse
        from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
        from vllm.entrypoints.openai.completion.protocol import CompletionRequest
        from vllm.entrypoints.serve.engine.protocol import ErrorResponse

        state = scope["app"].state
        raw_request = Request(scope, receive)
        kind = schema.body_kind(doc)
        try:
            if kind == "lmi":
                req = schema.parse(doc)
                handler = state.openai_serving_completion
                creq = translate.completion_request(req, handler, adapters.requested_adapter(scope, doc))
                call = handler.create_completion
            else:
                adapter = adapters.requested_adapter(scope, doc)
                doc.pop("adapters", None)
                if adapter:
                    doc["model"] = adapter
                chat = kind == "chat"
                handler = state.openai_serving_chat if chat else state.openai_serving_completion
                try:
                    creq = (ChatCompletionRequest if chat else CompletionRequest).model_validate(doc)
                except Exception as e:  # vLLM's request model: a 400 naming the field, as vLLM answers it
                    raise LMIError(translate.first_line(e), translate.first_field(e), 400) from None
                call = handler.create_chat_completion if chat else handler.create_completion
            sessions.check_session(raw_request)
            result = await unless_disconnected(call(creq, raw_request), receive)
            if isinstance(result, ErrorResponse):
                if kind == "lmi":
                    raise translate.vllm_error(result.error.message, result.error.param, result.error.code)
                await send_json(send, result.error.code, result.model_dump_json().encode())
                return
            if not hasattr(result, "__aiter__"):
                await send_json(send, 200, formatters.apply_output(fmt, result))
                return
        except ClientGone:
            return
        except LMIError as e:
            await send_error(send, e)
            return

        async def formatted_chunks():
            try:
                async for chunk in result:
                    yield formatters.apply_output(fmt, chunk)
            except LMIError as e:  # mid-stream: one last line naming the failure
                yield json.dumps({"error": e.message, "code": e.status}).encode() + b"\n"

        body = formatted_chunks()
        try:
            await StreamingResponse(body, media_type=stream.MEDIA_TYPE)(scope, receive, send)
        finally:
            await body.aclose()
            await result.aclose()


INT64 = (-2**63, 2**63 - 1)


def _int_beyond_64_bits(doc: dict) -> str | None:
    """The first top-level field of an OpenAI body holding an integer that does not fit 64 bits:
    vLLM passes such a top_k or seed on to the engine, which fails with a 500 naming nothing."""
    for key, value in doc.items():
        if isinstance(value, int) and not isinstance(value, bool) and not INT64[0] <= value <= INT64[1]:
            return key
    return None


async def _send_int_error(send, doc: dict, field: str) -> None:
    await send_openai_error(send, f"{field}: {doc[field]} does not fit a 64-bit integer "
                            f"(allowed: -2^63 to 2^63-1, and what the field itself allows)", field)


async def send_openai_error(send, message: str, param: str | None, status: int = 400) -> None:
    """An error in vLLM's own shape (OpenAI bodies get vLLM's errors)."""
    body = {"error": {"message": message, "type": "BadRequestError", "param": param, "code": status}}
    await send_json(send, status, json.dumps(body).encode())


def _custom_invocation_handler() -> bool:
    """True when the user replaced /invocations through mhcs (CUSTOM_FASTAPI_INVOCATION_HANDLER,
    @custom_invocation_handler, or custom_sagemaker_invocation_handler in model.py)."""
    from model_hosting_container_standards.common.handler.registry import handler_registry
    return handler_registry.has_handler("invoke")


def _tokenizer(scope):
    handler = getattr(scope["app"].state, "openai_serving_completion", None)
    return getattr(getattr(handler, "renderer", None), "tokenizer", None)


def _too_large(size: int, limit: int, at_least: bool = False) -> LMIError:
    got = f"more than {limit}" if at_least else str(size)
    return LMIError(f"body: the request body is {got} bytes; the limit is {limit} bytes "
                    f"(set {LIMIT_ENV} to change it)", "body", 413)


def _reencoded(scope, doc) -> tuple[bytes, dict]:
    """(doc as the body, the scope with that body's content-length)."""
    body = json.dumps(doc, ensure_ascii=False).encode()
    return body, with_header(scope, b"content-length", str(len(body)).encode())


def _decode(body: bytes):
    """(the JSON document, None), or (what could be read, the LMIError naming why the body is no JSON text)."""
    try:
        doc = json.loads(body)
    except (ValueError, RecursionError) as e:  # JSONDecodeError, bad UTF-8, nesting deeper than Python's stack
        what = ("empty" if not body.strip() else "nested too deeply" if isinstance(e, RecursionError)
                else f"not valid JSON ({e})")
        return None, LMIError(f"body: the request body is {what}; send a JSON object", "body", 400)
    if _LONE_SURROGATE_ESCAPE.search(body) and not _is_text(doc):
        return doc, LMIError("body: a string holds a lone UTF-16 surrogate escape (\\ud800-\\udfff "
                             "without its pair), which is not text; send valid Unicode", "body", 400)
    return doc, None


# JSON may spell a surrogate as an escape; paired ones make one character, a lone one is no text
# (the tokenizer refuses it with a message that names nothing).
_LONE_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


def _is_text(doc) -> bool:
    """True if every string in the document (keys included) is valid Unicode."""
    todo = [doc]
    while todo:
        x = todo.pop()
        if isinstance(x, str):
            try:
                x.encode("utf-8")
            except UnicodeEncodeError:
                return False
        elif isinstance(x, dict):
            todo.extend(x.keys())
            todo.extend(x.values())
        elif isinstance(x, list):
            todo.extend(x)
    return True
