"""Read a streamed answer (LMI jsonlines or OpenAI server-sent events) from bytes cut anywhere.

SageMaker's InvokeEndpointWithResponseStream hands the client the container's bytes in
PayloadPart events cut wherever the transport cut them: one line may span several parts,
one part may hold several lines (or half a UTF-8 character), and the last line may lack its
newline. StreamReader buffers the bytes and hands out each record once its line is whole,
and the last line when the stream ends. Errors arrive after HTTP 200, as a record: an LMI
`{"error": "...", "code": 500}` line or an SSE `data: {"error": {...}}` event; the reader
raises StreamError with the message, as it does for an exception event of the stream
(ModelStreamError, InternalStreamFailure).

    import boto3
    from endpoint.stream_reader import StreamReader, payload_parts

    resp = boto3.client("sagemaker-runtime").invoke_endpoint_with_response_stream(
        EndpointName="my-llm", ContentType="application/json",
        Body=b'{"inputs": "Hello", "parameters": {"max_new_tokens": 32}, "stream": true}')
    for text in StreamReader().texts(payload_parts(resp["Body"])):
        print(text, end="", flush=True)
"""
from __future__ import annotations

import json
from collections.abc import Iterable, Iterator


class StreamError(RuntimeError):
    """The stream carried an error (a record or an exception event); str() is its message."""


class StreamReader:
    """feed() bytes as they arrive and get the records whose lines are complete; close() at the end."""

    def __init__(self) -> None:
        self._buf = bytearray()
        self._scanned = 0  # bytes of _buf already searched for a newline
        self.done = False  # an SSE `data: [DONE]` was read

    def feed(self, data: bytes) -> list[dict]:
        self._buf += data
        records = []
        start = 0
        while True:
            nl = self._buf.find(b"\n", max(self._scanned, start))
            if nl < 0:
                break
            rec = self._record(bytes(self._buf[start:nl]))
            if rec is not None:
                records.append(rec)
            start = nl + 1
        del self._buf[:start]
        self._scanned = len(self._buf)
        return records

    def close(self) -> list[dict]:
        """The last line, when the stream ended without a newline."""
        rest, self._buf, self._scanned = bytes(self._buf), bytearray(), 0
        rec = self._record(rest)
        return [] if rec is None else [rec]

    def records(self, parts: Iterable[bytes]) -> Iterator[dict]:
        for part in parts:
            yield from self.feed(part)
        yield from self.close()

    def texts(self, parts: Iterable[bytes]) -> Iterator[str]:
        """The text of each token as it arrives (empty texts skipped)."""
        for rec in self.records(parts):
            text = token_text(rec)
            if text:
                yield text

    def _record(self, raw: bytes) -> dict | None:
        try:
            line = raw.decode("utf-8").strip()
        except UnicodeDecodeError as e:
            raise StreamError(f"stream line is not UTF-8 ({e}): {raw[:200]!r}") from None
        if not line or line.startswith(":"):
            return None  # SSE event separator or comment
        if line.startswith("data:"):
            line = line[len("data:"):].strip()
            if line == "[DONE]":
                self.done = True
                return None
        elif line.split(":", 1)[0] in ("event", "id", "retry"):
            return None  # SSE fields this container does not send; nothing to read in them
        try:
            doc = json.loads(line)
        except json.JSONDecodeError:
            raise StreamError(f"stream line is not JSON: {line[:200]!r}") from None
        if not isinstance(doc, dict):
            raise StreamError(f"stream record is not a JSON object: {line[:200]!r}")
        message = error_message(doc)
        if message is not None:
            raise StreamError(message)
        return doc


def error_message(doc: dict) -> str | None:
    """The message of an error record: LMI `{"error": "...", "code": N}`, vLLM `{"error": {"message": ...}}`."""
    err = doc.get("error")
    if err is None:
        return None
    if isinstance(err, dict):
        msg = err.get("message") or json.dumps(err)
        code = err.get("code") or err.get("type")
    else:
        msg, code = str(err), doc.get("code")
    return f"{msg} (code {code})" if code is not None else msg


def token_text(doc: dict) -> str:
    """The new text in one record: LMI `token.text`, OpenAI completion `text`, chat `delta.content`."""
    token = doc.get("token")
    if isinstance(token, dict):
        return token.get("text") or ""
    text = ""
    for choice in doc.get("choices") or ():  # the usage chunk at the end has none
        delta = choice.get("delta")
        text += (delta.get("content") if isinstance(delta, dict) else choice.get("text")) or ""
    return text


def payload_parts(event_stream) -> Iterator[bytes]:
    """The bytes of each PayloadPart of boto3's InvokeEndpointWithResponseStream body.

    botocore raises an exception event (ModelStreamError, InternalStreamFailure) while
    iterating; it becomes a StreamError with the service's code and message."""
    from botocore.exceptions import EventStreamError

    try:
        for event in event_stream:
            part = event.get("PayloadPart")
            if part is not None:
                yield part["Bytes"]
    except EventStreamError as e:
        err = e.response.get("Error", {})
        code = err.get("Code", "stream error")
        extra = e.response.get("ErrorCode")
        raise StreamError(f"{code}: {err.get('Message', '')}" + (f" ({extra})" if extra else "")) from None
