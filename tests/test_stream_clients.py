"""The streams as real clients read them: SageMaker's LineIterator (sagemaker-core) fed the real
server's bytes split into PayloadParts at every byte boundary, Hugging Face's InferenceClient on
TGI-compatible streams, and LMI-jsonlines streams for OpenAI bodies (output_formatter=jsonlines).
"""
from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from conftest import await_server, early, spawn_server, starts_early, stop

pytestmark = pytest.mark.engine

PROMPT = "Deep learning is"
N = 12
LMI_STREAM = {"inputs": PROMPT, "stream": True, "parameters": {"max_new_tokens": N, "ignore_eos_token": True}}
OPENAI_STREAM = {"prompt": PROMPT, "max_tokens": N, "temperature": 0, "ignore_eos": True, "stream": True}


def raw_stream(url: str, body: dict) -> tuple[str, bytes]:
    with httpx.stream("POST", url + "/invocations", json=body, timeout=120) as r:
        assert r.status_code == 200, r.read()
        return r.headers["content-type"], b"".join(r.iter_raw(3))


def line_iterator_reads(raw: bytes, parts: list[bytes]) -> list[bytes]:
    """What SageMaker's own client hands the application for these PayloadParts."""
    from sagemaker.core.iterators import LineIterator

    lines = list(LineIterator([{"PayloadPart": {"Bytes": p}} for p in parts]))
    assert b"".join(parts) == raw
    return lines


def every_split(raw: bytes):
    """One byte per PayloadPart, then every cut of the stream into two PayloadParts."""
    yield [raw[i:i + 1] for i in range(len(raw))]
    for k in range(1, len(raw)):
        yield [raw[:k], raw[k:]]


@pytest.fixture(scope="module")
def greedy(server) -> str:
    r = httpx.post(server.url + "/invocations", json={"inputs": PROMPT, "parameters": {
        "max_new_tokens": N, "ignore_eos_token": True}}, timeout=120)
    return r.json()["generated_text"]


def test_line_iterator_reads_lmi_jsonlines_split_anywhere(server, greedy):
    ctype, raw = raw_stream(server.url, LMI_STREAM)
    assert ctype.startswith("application/jsonlines")
    want = raw.split(b"\n")[:-1]
    for parts in every_split(raw):
        lines = line_iterator_reads(raw, parts)
        assert lines == want
    records = [json.loads(line) for line in want]
    assert "".join(r["token"]["text"] for r in records) == greedy == records[-1]["generated_text"]


def test_line_iterator_reads_openai_sse_split_anywhere(server, greedy):
    ctype, raw = raw_stream(server.url, OPENAI_STREAM)
    assert ctype.startswith("text/event-stream")
    want = raw.split(b"\n")[:-1]
    for parts in every_split(raw):
        assert line_iterator_reads(raw, parts) == want
    data = [line[len(b"data: "):] for line in want if line.startswith(b"data: ")]
    assert data[-1] == b"[DONE]"
    chunks = [json.loads(d) for d in data[:-1]]
    assert "".join(c["choices"][0]["text"] for c in chunks if c["choices"]) == greedy


# -- a server with LMI's tgi_compat and output_formatter=jsonlines, and vLLM's compile cache off ---------------
# (compiled as the session's server is, so its greedy answers are that server's)

@starts_early("compat")
def _compat_server(tmp: Path, nice: int):
    return spawn_server(tmp, {"OPTION_TGI_COMPAT": "true", "OPTION_OUTPUT_FORMATTER": "jsonlines",
                              "OPTION_DISABLE_COMPILE_CACHE": "true", "VLLM_CACHE_ROOT": str(tmp / "vllm-cache")},
                        nice=nice)


@pytest.fixture(scope="module")
def compat(request):
    srv = await_server(early(request, "compat"), "compat")
    yield srv
    stop(srv.proc)


def test_startup_log_names_the_compat_settings(compat):
    log = compat.log()
    assert "setting tgi_compat=True  [env OPTION_TGI_COMPAT; launcher]" in log
    assert "setting output_formatter=jsonlines  [env OPTION_OUTPUT_FORMATTER; launcher]" in log


def test_without_the_compile_cache_the_model_is_aot_compiled_and_nothing_is_written(compat):
    """option.disable_compile_cache: vLLM's compile cache is off, and the model is still AOT-compiled (vLLM alone
    turns the AOT compile off with the cache): its AOT folder under the server's own VLLM_CACHE_ROOT exists, with no
    compiled model saved in it. The answers below are the session server's, whose cache is on."""
    log = compat.log()
    assert "setting disable_compile_cache=True  [env OPTION_DISABLE_COMPILE_CACHE; launcher]" in log
    assert "saved AOT compiled function" not in log
    aot = list((compat.log_path.parent / "vllm-cache" / "torch_compile_cache" / "torch_aot_compile").glob("*"))
    assert len(aot) == 1 and (aot[0] / "inductor_cache").is_dir(), aot
    assert not list(aot[0].rglob("model")), "a compiled model was saved"


def test_tgi_compat_answers_a_list_with_details(compat, greedy):
    r = httpx.post(compat.url + "/invocations", json={"inputs": PROMPT, "parameters": {
        "max_new_tokens": N, "ignore_eos_token": True}}, timeout=120)
    assert r.status_code == 200, r.text
    (out,) = r.json()
    assert out["generated_text"] == greedy
    assert out["details"]["finish_reason"] == "length" and len(out["details"]["tokens"]) == N


def test_tgi_compat_stream_is_server_sent_events(compat, greedy):
    ctype, raw = raw_stream(compat.url, LMI_STREAM)
    assert ctype.startswith("text/event-stream")
    events = [e for e in raw.decode().split("\n\n") if e]
    assert all(e.startswith("data:") for e in events) and len(events) == N
    records = [json.loads(e[len("data:"):]) for e in events]
    assert all(set(r["token"]) == {"id", "text", "logprob", "special"} for r in records)
    assert records[-1]["generated_text"] == greedy


def test_huggingface_inference_client_streams(compat, greedy):
    from huggingface_hub import InferenceClient

    client = InferenceClient(model=compat.url + "/invocations", timeout=120)
    outs = list(client.text_generation(PROMPT, max_new_tokens=N, stream=True, details=True, do_sample=False))
    assert len(outs) == N
    assert "".join(o.token.text for o in outs) == greedy
    assert outs[-1].generated_text == greedy and outs[-1].details.finish_reason == "length"
    assert client.text_generation(PROMPT, max_new_tokens=N, do_sample=False) == greedy[:N]


@pytest.mark.parametrize("kind", ["completion", "chat"])
def test_output_formatter_jsonlines_streams_openai_bodies_as_jsonlines(compat, greedy, kind):
    body = OPENAI_STREAM if kind == "completion" else {
        "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, "temperature": 0, "stream": True}
    ctype, raw = raw_stream(compat.url, body)
    assert ctype.startswith("application/jsonlines")
    assert raw.endswith(b"\n") and b"data:" not in raw and b"[DONE]" not in raw
    for parts in every_split(raw) if kind == "completion" else [[raw]]:
        lines = line_iterator_reads(raw, parts)
    chunks = [json.loads(line) for line in lines]
    if kind == "completion":
        assert "".join(c["choices"][0]["text"] for c in chunks if c["choices"]) == greedy
    else:
        assert chunks and all(c["object"] == "chat.completion.chunk" for c in chunks)


def test_lmi_tgi_client_script_passes(compat, monkeypatch):
    """LMI's own TGI-compat check (djl-serving tests/integration/llm/tgi_client.py, vendored unmodified
    in tests/third_party/djl_serving/): Hugging Face's InferenceClient, unary with details, then
    streamed with details. The script names http://127.0.0.1:8080/invocations; the client class it
    imports is pointed at this server instead."""
    import runpy
    from pathlib import Path

    import huggingface_hub

    real = huggingface_hub.InferenceClient
    made = []

    class Redirected(real):
        def __init__(self, model=None, **kw):
            assert model == "http://127.0.0.1:8080/invocations"
            made.append(self)
            super().__init__(model=compat.url + "/invocations", timeout=120, **kw)

    monkeypatch.setattr(huggingface_hub, "InferenceClient", Redirected)
    script = Path(__file__).parent / "third_party" / "djl_serving" / "tgi_client.py"
    ns = runpy.run_path(str(script), run_name="tgi_client")
    assert len(made) == 1
    # the script's own asserts passed; it streamed every token of max_new_tokens=100, the last with details
    assert len(ns["result_list"]) == 100
    assert ns["last_result"].details.finish_reason == "length"
    assert ns["last_result"].generated_text == "".join(r.token.text for r in ns["result_list"])
