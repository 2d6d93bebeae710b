"""The stream reader and `python -m endpoint.invoke` against answers of the project's own server.

The recorded answers are real bytes: the `recorded` fixture asks the session's server (the real
CPU engine serving the tiny model) for a streamed LMI answer and a streamed OpenAI (SSE) answer
and keeps the bytes as they came off the socket. The reassembly tests cut each at every byte
boundary into PayloadPart events, encoded as the AWS event stream and decoded by botocore's own
event-stream parser, as boto3 hands them to user code.

End to end, `invoke` talks through the real boto3 sagemaker-runtime client to a loopback
stand-in for SageMaker's runtime API (tests/sagemaker_runtime_proxy.py) that forwards to the same
server and cuts the streamed bytes into parts of 7 and 300 bytes. That proves the client side:
boto3's requests and event-stream decoding, the reader, the printed text, the exit codes.
It does not prove SageMaker's own transport; the proxy stands in for it.
"""
from __future__ import annotations

import io
import json
import os

import boto3
import httpx
import pytest
from botocore.eventstream import EventStream
from botocore.parsers import EventStreamJSONParser

from sagemaker_runtime_proxy import RuntimeProxy, payload_part
from endpoint import invoke
from endpoint.stream_reader import StreamError, StreamReader, payload_parts

pytestmark = pytest.mark.engine

PROMPT = "Deep learning is"
N = 12
LMI = {"inputs": PROMPT, "parameters": {"max_new_tokens": N, "do_sample": False, "ignore_eos_token": True,
                                       "details": True}, "stream": True}
SSE = {"prompt": PROMPT, "max_tokens": N, "temperature": 0, "ignore_eos": True, "stream": True,
       "stream_options": {"include_usage": True}}
CREDS = dict(aws_access_key_id="testing", aws_secret_access_key="testing", region_name="us-east-1")


@pytest.fixture(scope="module")
def server_url(request) -> str:
    # LMI_TEST_URL: a server already running (quick iteration); else the session's server
    return os.environ.get("LMI_TEST_URL") or request.getfixturevalue("server").url


@pytest.fixture(scope="module")
def recorded(server_url) -> dict[str, bytes]:
    with httpx.Client(base_url=server_url, timeout=120) as c:
        out = {}
        for kind, body in (("lmi", LMI), ("sse", SSE)):
            r = c.post("/invocations", json=body)
            assert r.status_code == 200, r.text
            out[kind] = r.content
    return out


def whole_records(data: bytes) -> list[dict]:
    """The records of a whole answer, read without the reader: JSON lines, or SSE `data:` lines."""
    recs = []
    for line in data.decode().splitlines():
        line = line.removeprefix("data:").strip()
        if line and line != "[DONE]":
            recs.append(json.loads(line))
    return recs


class _Raw:
    """The HTTP body botocore's EventStream reads from."""

    def __init__(self, data: bytes, chunk: int):
        self.data, self.chunk = data, chunk

    def stream(self):
        for i in range(0, len(self.data), self.chunk):
            yield self.data[i:i + self.chunk]

    def close(self):
        pass


_runtime = boto3.Session(**CREDS).client("sagemaker-runtime")
_BODY_SHAPE = _runtime.meta.service_model.operation_model("InvokeEndpointWithResponseStream").output_shape.members["Body"]


def decoded(parts: list[bytes], chunk: int = 4096):
    """PayloadPart events carrying parts, through botocore's event-stream decoder."""
    frames = b"".join(payload_part(p) for p in parts)
    return EventStream(_Raw(frames, chunk), _BODY_SHAPE, EventStreamJSONParser(), "InvokeEndpointWithResponseStream")


def read(parts: list[bytes], chunk: int = 4096) -> list[dict]:
    return list(StreamReader().records(payload_parts(decoded(parts, chunk))))


@pytest.mark.parametrize("kind", ["lmi", "sse"])
def test_records_survive_a_cut_at_every_byte(recorded, kind):
    data = recorded[kind]
    want = whole_records(data)
    # vLLM hands a reader that lags behind the engine the tokens made meanwhile in one chunk, so N tokens come in N
    # records or fewer: every token came, in records enough to cut between
    assert len(want) >= 3 and data.endswith(b"\n")
    if kind == "lmi":  # the server's own promise, so the records are worth comparing
        assert "".join(r["token"]["text"] for r in want) == want[-1]["generated_text"]
        assert want[-1]["details"]["generated_tokens"] == N
    else:
        assert want[-1]["usage"]["completion_tokens"] == N
    for k in range(1, len(data)):
        assert read([data[:k], data[k:]]) == want, f"cut at byte {k}"
    assert read([data[i:i + 1] for i in range(len(data))], chunk=13) == want  # one byte per part


@pytest.mark.parametrize("kind", ["lmi", "sse"])
def test_last_line_without_newline_is_read(recorded, kind):
    data = recorded[kind].rstrip(b"\n")
    want = whole_records(data)
    for k in range(1, len(data), 5):
        assert read([data[:k], data[k:]]) == want, f"cut at byte {k}"


@pytest.mark.parametrize("kind, error, message", [
    ("lmi", {"error": "generation failed (RuntimeError)", "code": 500}, "generation failed (RuntimeError) (code 500)"),
    ("sse", {"error": {"message": "engine died", "type": "InternalServerError", "param": None, "code": 500}},
     "engine died (code 500)"),
])
def test_error_record_mid_stream_raises_after_the_tokens_before_it(recorded, kind, error, message):
    """Error records in the shapes the server writes after HTTP 200 (serving/lmi/stream.py; vLLM's
    create_streaming_error_response for SSE), spliced after the first three real records."""
    lines = recorded[kind].split(b"\n\n" if kind == "sse" else b"\n")
    line = json.dumps(error).encode()
    sep = b"\n\n" if kind == "sse" else b"\n"
    data = sep.join([*lines[:3], (b"data: " if kind == "sse" else b"") + line])
    got = []
    with pytest.raises(StreamError, match=message.replace("(", r"\(").replace(")", r"\)")):
        for rec in StreamReader().records(payload_parts(decoded([data[i:i + 10] for i in range(0, len(data), 10)]))):
            got.append(rec)
    assert got == whole_records(sep.join(lines[:3]))


# -- end to end -------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def runtime(server_url):
    with RuntimeProxy(server_url) as proxy:
        yield proxy


class Printed(io.StringIO):
    """stdout that counts writes, to see tokens printed one at a time."""

    writes = 0

    def write(self, s):
        self.writes += 1
        return super().write(s)


def run(runtime, *argv) -> tuple[int, Printed]:
    out = Printed()
    rc = invoke.main(["my-llm", *argv, "--endpoint-url", runtime.url], session=boto3.Session(**CREDS), out=out)
    return rc, out


@pytest.mark.parametrize("api", ["lmi", "completion", "chat"])
def test_invoke_prints_the_same_text_streamed_and_not(runtime, server_url, api, capsys):
    args = [PROMPT, "--api", api, "--max-tokens", str(N), "--temperature", "0"]
    rc, plain = run(runtime, *args)
    assert rc == 0, capsys.readouterr().err
    rc, streamed = run(runtime, *args, "--stream")
    assert rc == 0, capsys.readouterr().err
    assert streamed.getvalue() == plain.getvalue()
    text = plain.getvalue().rstrip("\n")
    assert text, "the model generated nothing"
    direct = httpx.post(server_url + "/invocations", timeout=120, json={
        "lmi": {"inputs": PROMPT, "parameters": {"max_new_tokens": N, "do_sample": False}},
        "completion": {"prompt": PROMPT, "max_tokens": N, "temperature": 0},
        "chat": {"messages": [{"role": "user", "content": PROMPT}], "max_tokens": N, "temperature": 0}}[api]).json()
    assert text == invoke.answer_text(direct)
    parts = runtime.parts
    assert any(p.count(b"\n") >= 2 for p in parts), "no part held several lines"
    assert any(not p.endswith(b"\n") for p in parts[:-1]), "no line was split across parts"
    assert streamed.writes > 3  # token by token, not all at the end


def test_container_error_exits_non_zero_with_its_message(runtime, capsys):
    rc, _ = run(runtime, "--body", '{"inputs": "Hi", "parameters": {"top_p": 1.5}}', "--stream")
    err = capsys.readouterr().err
    assert rc == 1
    assert "ModelError" in err and "container status 424" in err and "parameters.top_p" in err


def test_stream_error_event_exits_non_zero_with_its_message(runtime, capsys):
    runtime.fail_after = 100
    try:
        rc, out = run(runtime, PROMPT, "--max-tokens", str(N), "--stream")
    finally:
        runtime.fail_after = None
    assert rc == 1
    assert "ModelStreamError: Model container failed while streaming" in capsys.readouterr().err
    assert out.getvalue().strip()  # the tokens before the failure were printed
