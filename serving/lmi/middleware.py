"""ASGI middleware vLLM loads with `--middleware serving.lmi.middleware.LMIMiddleware`.

It sits in front of vLLM's own app and only touches `POST /invocations` (and the lifespan):
- enforces the request size limit (setting max_request_bytes, default 6 MiB, SageMaker's
  real-time payload limit) on every body kind;
- an LMI/TGI body (`{"inputs": ...}`) is validated, turned into a completion request and
  served in-process by vLLM's own completion handler (app.state.openai_serving_completion):
  no second HTTP hop, no re-serialisation of the request; with tgi_compat it is answered in
  TGI's shapes;
- an OpenAI body (chat `messages` / completion `prompt`) goes on to vLLM unchanged, so it is
  answered exactly as vLLM answers it (SSE when streaming; with output_formatter=jsonlines the
  same chunks one a line, as LMI streams them); only the LoRA adapter it names in LMI's field
  `adapters` or in `model` is handed to vLLM's SageMaker hooks in their adapter header;
- a JSON body of none of these kinds gets LMI's 424 naming the three;
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
from . import formatters, schema, sessions, stream, translate
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
ADAPTER_HEADER = b"x-amzn-sagemaker-adapter-identifier"  # SageMaker's LoRA adapter header
SESSION_HEADER = "X-Amzn-SageMaker-Session-Id"


def max_request_bytes(env=os.environ) -> int:
    """The limit the launcher handed over (the settings table parses and defaults it)."""
    return engine_value("max_request_bytes", env)


class _ClientGone(Exception):
    pass


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
        try:
            body = await self._read_body(scope, receive)
        except _ClientGone:
            return
        except BodyTimeout:
            await self._send_body_timeout(send)
            return
        except LMIError as e:
            # A client that asked to continue has sent nothing yet: answer at once.
            waiting = (b"expect", b"100-continue") in ((k, v.lower()) for k, v in scope["headers"])
            read_all = not waiting and await _discard(receive, self.max_bytes * DISCARD_FACTOR, DISCARD_S)
            await send_json(send, e.status, e.body(), [] if read_all else [(b"connection", b"close")])
            return
        try:
            doc = json.loads(body)
        except (ValueError, RecursionError) as e:  # JSONDecodeError, bad UTF-8, nesting deeper than Python's stack
            what = ("empty" if not body.strip() else "nested too deeply" if isinstance(e, RecursionError)
                    else f"not valid JSON ({e})")
            await send_error(send, LMIError(f"body: the request body is {what}; send a JSON object", "body", 400))
            return
        if _LONE_SURROGATE_ESCAPE.search(body) and not _is_text(doc):
            await send_error(send, LMIError("body: a string holds a lone UTF-16 surrogate escape (\\ud800-\\udfff "
                                            "without its pair), which is not text; send valid Unicode", "body", 400))
            return
        if _custom_invocation_handler():
            # The user replaced /invocations (mhcs): their handler gets every body as sent.
            await self.app(scope, _replay(body, receive), send)
            return
        fmt = formatters.Formatters()
        if self.formatters:
            try:
                adapter = _requested_adapter(scope, doc)
                fmt = formatters.pick(self.formatters, adapter)
                if fmt.input is not None:
                    doc = formatters.apply_input(fmt, doc, _tokenizer(scope), adapter)
                    body = json.dumps(doc, ensure_ascii=False).encode()
                    scope = _with_header(scope, b"content-length", str(len(body)).encode())
            except LMIError as e:
                await send_error(send, e)
                return
        kind = schema.body_kind(doc)
        if kind is None:
            await send_error(send, LMIError(schema.NO_KIND, "body"))
            return
        if kind in ("chat", "completion") and (too_big := _int_beyond_64_bits(doc)) is not None:
            await send_openai_error(send, f"{too_big}: {doc[too_big]} does not fit a 64-bit integer "
                                    f"(allowed: -2^63 to 2^63-1, and what the field itself allows)", too_big)
            return
        if fmt.output is not None and kind in ("lmi", "chat", "completion"):
            await self._formatted(scope, receive, send, doc, kind, fmt)
            return
        if kind != "lmi":
            if kind in ("chat", "completion"):
                rewrite = "adapters" in doc
                try:
                    adapter = _openai_adapter(scope, doc)
                except LMIError as e:
                    await send_error(send, e)
                    return
                if rewrite:
                    body = json.dumps(doc, ensure_ascii=False).encode()
                    scope = _with_header(scope, b"content-length", str(len(body)).encode())
                if adapter:
                    scope = _with_header(scope, ADAPTER_HEADER, adapter.encode("latin-1"))
            if self.openai_jsonlines and doc.get("stream") is True:
                send = sse_to_jsonlines(send)
            if kind == "session":
                send = session_answer_as_json(send)
            await self.app(scope, _replay(body, receive), send)
            return
        started = False

        async def tracked_send(message):
            nonlocal started
            started = True
            await send(message)

        try:
            await self._lmi(scope, receive, tracked_send, doc)
        except _ClientGone:
            pass
        except Exception as e:  # never echo the body: it may hold secrets
            err = e if isinstance(e, LMIError) else _from_exception(e)
            if started:  # mid-stream: the records already sent are all the client gets
                log.error("LMI stream failed after it started: %s", type(e).__name__, exc_info=True)
            else:
                await send_error(send, err)

    async def _read_body(self, scope, receive) -> bytes:
        limit = self.max_bytes
        for name, value in scope["headers"]:
            if name == b"content-length" and value.isdigit() and int(value) > limit:
                raise _too_large(int(value), limit)  # before reading a byte of it
        parts, size = [], 0
        while True:
            message = await receive_within(receive, self.body_timeout)
            if message["type"] == "http.disconnect":
                raise _ClientGone()
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                raise _too_large(size, limit, at_least=True)
            parts.append(chunk)
            if not message.get("more_body", False):
                return b"".join(parts)

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
        adapter = _lmi_adapter(scope, req)
        raw_request = Request(scope, receive)
        _check_session(raw_request)
        creq = _completion_request(req, handler, adapter)

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

        result = await _unless_disconnected(handler.create_completion(creq, raw_request), receive)
        if isinstance(result, ErrorResponse):
            raise translate.vllm_error(result.error.message, result.error.param, result.error.code)
        if not isinstance(result, CompletionResponse):
            raise LMIError(f"internal error (unexpected {type(result).__name__})", None, 500)
        decode = (lambda tid: tokenizer.decode([tid])) if tokenizer is not None else None
        out = translate.from_completion(req, result, decode)
        if self.tgi and not isinstance(out, list):
            out = [out]  # TGI answers a list even for one input
        await send_json(send, 200, json.dumps(out, ensure_ascii=False).encode())

    async def _formatted(self, scope, receive, send, doc: dict, kind: str, fmt: formatters.Formatters) -> None:
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
        try:
            if kind == "lmi":
                req = schema.parse(doc)
                handler = state.openai_serving_completion
                creq = _completion_request(req, handler, _lmi_adapter(scope, req))
                call = handler.create_completion
            else:
                adapter = _openai_adapter(scope, doc)
                if adapter:
                    doc["model"] = adapter
                chat = kind == "chat"
                handler = state.openai_serving_chat if chat else state.openai_serving_completion
                try:
                    creq = (ChatCompletionRequest if chat else CompletionRequest).model_validate(doc)
                except Exception as e:  # vLLM's request model: a 400 naming the field, as vLLM answers it
                    raise LMIError(_first_line(e), _first_field(e), 400) from None
                call = handler.create_chat_completion if chat else handler.create_completion
            _check_session(raw_request)
            result = await _unless_disconnected(call(creq, raw_request), receive)
            if isinstance(result, ErrorResponse):
                if kind == "lmi":
                    raise translate.vllm_error(result.error.message, result.error.param, result.error.code)
                await send_json(send, result.error.code, result.model_dump_json().encode())
                return
            if not hasattr(result, "__aiter__"):
                await send_json(send, 200, formatters.apply_output(fmt, result))
                return
        except _ClientGone:
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


async def send_openai_error(send, message: str, param: str | None, status: int = 400) -> None:
    """An error in vLLM's own shape (OpenAI bodies get vLLM's errors)."""
    body = {"error": {"message": message, "type": "BadRequestError", "param": param, "code": status}}
    await send_json(send, status, json.dumps(body).encode())


def _custom_invocation_handler() -> bool:
    """True when the user replaced /invocations through mhcs (CUSTOM_FASTAPI_INVOCATION_HANDLER,
    @custom_invocation_handler, or custom_sagemaker_invocation_handler in model.py)."""
    from model_hosting_container_standards.common.handler.registry import handler_registry
    return handler_registry.has_handler("invoke")


def _body_adapter(req) -> str | None:
    """The adapter an LMI body names (a list of inputs names one, or the same one for each)."""
    return req.adapters[0] if isinstance(req.adapters, list) else req.adapters


def _lmi_adapter(scope, req) -> str | None:
    """The adapter an LMI request names: its body's `adapters`, or SageMaker's adapter header; a body and a header
    that name different adapters are an error naming both."""
    header, body = _adapter_header(scope), _body_adapter(req)
    if header and body and header != body:
        raise LMIError(f"adapters: {body!r} differs from the X-Amzn-SageMaker-Adapter-Identifier header "
                       f"({header!r}); send one of them", "adapters")
    return body or header


def _completion_request(req, handler, adapter: str | None):
    """An LMI request as vLLM's CompletionRequest for `handler`; vLLM's own checks on the translated values
    fail as vLLM's error."""
    from vllm.entrypoints.openai.completion.protocol import CompletionRequest

    fields = translate.to_completion(req, handler.model_config.max_model_len, adapter)
    try:
        return CompletionRequest.model_validate(fields)
    except Exception as e:
        raise translate.vllm_error(_first_line(e), getattr(e, "parameter", None), 400) from None


def _adapter_header(scope) -> str | None:
    """The LoRA adapter SageMaker's adapter header names, if the request has the header."""
    return next((v.decode("latin-1") for k, v in scope["headers"] if k == ADAPTER_HEADER), None)


def _requested_adapter(scope, doc) -> str | None:
    """The LoRA adapter a request names: SageMaker's header, else LMI's `adapters` field."""
    header = _adapter_header(scope)
    if header:
        return header
    adapters = doc.get("adapters") if isinstance(doc, dict) else None
    if isinstance(adapters, list) and adapters and isinstance(adapters[0], str):
        return adapters[0]
    return adapters if isinstance(adapters, str) else None


def _tokenizer(scope):
    handler = getattr(scope["app"].state, "openai_serving_completion", None)
    return getattr(getattr(handler, "renderer", None), "tokenizer", None)


def _first_field(e: Exception) -> str | None:
    import pydantic
    if isinstance(e, pydantic.ValidationError):
        loc = e.errors(include_url=False)[0]["loc"]
        return str(loc[0]) if loc else None
    return None


def _too_large(size: int, limit: int, at_least: bool = False) -> LMIError:
    got = f"more than {limit}" if at_least else str(size)
    return LMIError(f"body: the request body is {got} bytes; the limit is {limit} bytes "
                    f"(set {LIMIT_ENV} to change it)", "body", 413)


def _from_exception(e: Exception) -> LMIError:
    """Classify an exception the way vLLM's own exception handler does, in LMI's shape."""
    from vllm.entrypoints.serve.exception_handling.error_response import create_error_response

    info = create_error_response(e).error
    if info.code >= 500:
        log.error("LMI request failed: %s", type(e).__name__, exc_info=True)
        return LMIError(f"internal error ({type(e).__name__})", None, info.code)
    return translate.vllm_error(info.message, info.param, info.code)


def _first_line(e: Exception) -> str:
    import pydantic
    if isinstance(e, pydantic.ValidationError):
        err = e.errors(include_url=False)[0]
        return f"{'.'.join(str(x) for x in err['loc'])}: {err['msg']}"
    return str(e).splitlines()[0] if str(e) else type(e).__name__


async def _discard(receive, budget: int, seconds: float) -> bool:
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


def _openai_adapter(scope, doc: dict) -> str | None:
    """The LoRA adapter an OpenAI body asks for without SageMaker's adapter header, to be put in that
    header; None if the header names it already, or none is asked for.

    vLLM's SageMaker hooks on /invocations set the body's `model` from the header only (no header:
    the base model, whatever `model` says). Here a body may also name its adapter, as LMI's vLLM
    handler reads it: with LMI's field `adapters` (removed from the body; null: not given; a list:
    the same name for each entry) or with OpenAI's `model` when that names a served adapter. Names
    that disagree with each other or with the header, and unknown names in `adapters`, get 424."""
    header = _adapter_header(scope)
    models = getattr(scope["app"].state, "openai_serving_models", None)
    known = getattr(models, "lora_requests", None) or {}
    asked: list[tuple[str, str]] = []
    adapters = doc.pop("adapters", None)
    if adapters is not None:
        names = adapters if isinstance(adapters, list) else [adapters]
        if not names or not all(isinstance(n, str) and n for n in names) or len(set(names)) != 1:
            raise LMIError("adapters: give one LoRA adapter's name (a string, or a list of the same name)",
                           "adapters")
        if names[0] not in known and not getattr(models, "lora_resolvers", None):
            served = ", ".join(sorted(known)) or "none (the model has no adapters/ folder)"
            raise LMIError(f"adapters: no LoRA adapter named {names[0]!r}; served: {served}", "adapters")
        asked.append(("adapters", names[0]))
    model = doc.get("model")
    if isinstance(model, str) and model in known:
        asked.append(("model", model))
    if header:
        asked.append(("X-Amzn-SageMaker-Adapter-Identifier header", header))
    if len({name for _, name in asked}) > 1:
        field = asked[0][0]
        given = ", ".join(f"{where} {name!r}" for where, name in asked)
        raise LMIError(f"{field}: the request names different LoRA adapters ({given}); name one", field)
    return None if header or not asked else asked[0][1]


def _with_header(scope, name: bytes, value: bytes):
    """The scope with the request header `name` (lower case) set to `value`, replacing any."""
    return {**scope, "headers": [(k, v) for k, v in scope["headers"] if k != name] + [(name, value)]}


def _check_session(raw_request) -> None:
    """An LMI body with SageMaker's session header: the same check vLLM's SageMaker hooks make for
    OpenAI bodies (sessions on, and the session known and not expired)."""
    if SESSION_HEADER not in raw_request.headers:
        return
    from fastapi.exceptions import HTTPException
    from model_hosting_container_standards.sagemaker.sessions.manager import get_session_manager
    from model_hosting_container_standards.sagemaker.sessions.utils import get_session

    try:
        get_session(get_session_manager(), raw_request)
    except HTTPException as e:
        raise LMIError(f"{SESSION_HEADER}: {e.detail}", SESSION_HEADER) from None
    except ValueError as e:
        raise LMIError(f"{SESSION_HEADER}: {e}", SESSION_HEADER) from None


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


def _replay(body: bytes, receive):
    """A receive() that hands the already-read body to vLLM, then the real connection events."""
    sent = False

    async def replay():
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()
    return replay


async def _unless_disconnected(coro, receive):
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
    raise _ClientGone()
