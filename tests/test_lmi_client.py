"""LMI's own integration-test client run against the real server on the CPU engine.

The client is djl-serving's tests/integration/llm/client.py, vendored unmodified in
tests/third_party/djl_serving/ (README there: upstream commit). Its checks run through its own
entry point, `client.run([handler, model])`, as LMI's CI calls it. What this file supplies, without
editing the client:

- an entry for our model in the client's spec tables (LMI's entries name CI models, hub tokenizers
  and GPU counts);
- the address: the client posts to http://127.0.0.1:8080; its module-level `requests` is replaced
  by one that sends the same calls to this test's server;
- its load phase, `awscurl_run`, downloads and runs DJL's awscurl binary (no network here): the
  same requests are sent with Python instead, `concurrency` clients times `num_run` each, with the
  same headers and bodies, and every answer must be 200 (awscurl's check only fails a run whose
  every request failed).

The session's adapter server (tests/conftest.py) serves a tiny dense Qwen3 with two LoRA adapters in
its adapters/ folder (tests/adapter_model.py), sticky sessions on (OPTION_ENABLE_STATEFUL_SESSIONS,
LMI's name) and a tool-call parser, as LMI's own tool-calling test configures it. TGI-compat streaming, the client's
tgi_client.py, runs in tests/test_stream_clients.py against the tgi_compat server there.
"""
from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
import requests

from adapter_model import ADAPTERS

pytestmark = pytest.mark.engine

VENDORED = Path(__file__).parent / "third_party" / "djl_serving"
CLIENT_PY = VENDORED / "client.py"
# The upstream files' SHA-256 (tests/third_party/djl_serving/README.md names the commit).
UPSTREAM_SHA256 = {
    "client.py": "0d50bf5aad16143d555cffa148889502baba76113f62211693c592d18394f73b",
    "tgi_client.py": "5c5c495670240709edd9caa7c24d95a1e11942cbbb62d1c58b28bf45a9c5d630",
}
LMI_ADDRESS = "http://127.0.0.1:8080"
MODEL = "tiny-dense"

# Our model's entries in the client's spec tables, in LMI's own format (batch_size: concurrency of
# the load phase, seq_length: max_new_tokens, stream: the stream values tried, default both).
SPECS = {
    "vllm_model_spec": {
        MODEL: {"batch_size": [1, 4], "seq_length": [16]},
        # as LMI's mistral-7b / qwen2-7b-fp8 entries: prompt details, unary only (LMI refuses them streamed)
        f"{MODEL}-decoder-input-details": {"batch_size": [1], "seq_length": [16], "stream": [False],
                                           "parameters": {"decoder_input_details": True}},
        # as LMI's correctness entries (return_full_text), streamed and not
        f"{MODEL}-full-text": {"batch_size": [1], "seq_length": [16], "parameters": {"return_full_text": True}},
        f"{MODEL}-lora": {"batch_size": [2], "seq_length": [16], "adapters": ADAPTERS},
    },
    "vllm_chat_model_spec": {MODEL: {"batch_size": [1, 4], "seq_length": [16]}},
    "vllm_tool_model_spec": {MODEL: {"batch_size": [1, 4], "seq_length": [16]}},
    "stateful_model_spec": {MODEL: {"batch_size": [1, 4], "seq_length": [16]}},
    # LMI's "huggingface" handler check sends a list of inputs; its streamed form counts one line
    # per generation step for the whole list (the accelerate handler's format): see
    # test_streamed_list_of_inputs for the list streamed as LMI's vLLM handler streams it.
    "hf_model_spec": {
        f"{MODEL}-list": {"batch_size": [1, 4], "seq_length": [16], "stream": [False]},
        f"{MODEL}-one": {"batch_size": [1], "seq_length": [16], "stream": [True]},
    },
}


class _Redirect:
    """The `requests` module, with the client's fixed address replaced by the test server's."""

    def __init__(self, base: str) -> None:
        self.base = base

    def __getattr__(self, name):
        return getattr(requests, name)

    def _url(self, url: str) -> str:
        assert url.startswith(LMI_ADDRESS), url
        return self.base + url[len(LMI_ADDRESS):]

    def get(self, url, *a, **kw):
        return requests.get(self._url(url), *a, **kw)

    def post(self, url, *a, **kw):
        return requests.post(self._url(url), *a, timeout=kw.pop("timeout", 300), **kw)

    def delete(self, url, *a, **kw):
        return requests.delete(self._url(url), *a, **kw)


class _Recorder:
    """What the shims saw: load-phase runs, response checks, LoRA comparisons."""

    def __init__(self) -> None:
        self.clear()

    def clear(self) -> None:
        self.load_runs: list[tuple[int, int]] = []  # (concurrency, requests answered 200)
        self.content_types: list[str] = []
        self.lora_checks: list[tuple[str | None, dict]] = []


def _load_client(base: str, seen: _Recorder):
    spec = importlib.util.spec_from_file_location("djl_serving_llm_client", CLIENT_PY)
    client = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(client)
    client.requests = _Redirect(base)

    def awscurl_run(data, tokenizer, concurrency, num_run=5, headers=[], dataset=False, **_):
        bodies = list(data) if dataset else [data]
        sent = {}
        for h in headers:  # awscurl -H 'Name: value', quoted for its shell
            name, _, value = h.strip("'").partition(":")
            sent[name.strip()] = value.strip()

        def one_client(c: int) -> list[int]:
            codes = []
            for n in range(num_run):
                body = bodies[(c * num_run + n) % len(bodies)]
                r = requests.post(base + "/invocations", json=body, headers=sent, timeout=300)
                codes.append(r.status_code if r.content else -1)  # an empty answer fails too
            return codes

        with ThreadPoolExecutor(concurrency) as pool:
            codes = [code for codes in pool.map(one_client, range(concurrency)) for code in codes]
        bad = [code for code in codes if code != 200]
        assert not bad, f"load phase: {len(bad)} of {len(codes)} requests failed: {sorted(set(bad))}"
        seen.load_runs.append((concurrency, len(codes)))

    checker = client.response_checker

    def response_checker(res, message):
        seen.content_types.append(res.headers.get("content-type"))
        return checker(res, message)

    differentiation = client.validate_lora_differentiation

    def validate_lora_differentiation(base_output, adapter_outputs):
        seen.lora_checks.append((base_output, dict(adapter_outputs)))
        return differentiation(base_output, adapter_outputs)

    client.awscurl_run = awscurl_run
    client.response_checker = response_checker
    client.validate_lora_differentiation = validate_lora_differentiation
    for table, entries in SPECS.items():
        getattr(client, table).update(entries)
    return client


@pytest.fixture(scope="module")
def lmi(adapter_server):
    """The client module, pointed at the server; the root logger as it was afterwards (the client
    sets it to INFO and adds a stdout handler when imported)."""
    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    seen = _Recorder()
    client = _load_client(adapter_server.url, seen)
    client.seen = seen
    yield client
    for h in root.handlers[:]:
        if h not in handlers:
            root.removeHandler(h)
    root.setLevel(level)


@pytest.fixture
def seen(lmi) -> _Recorder:
    lmi.seen.clear()
    return lmi.seen


# (handler, model entry, load-phase concurrencies the client asks for)
CHECKS = [
    ("vllm", MODEL, [1, 1, 4, 4]),  # single input, details, stream off and on
    ("vllm", f"{MODEL}-decoder-input-details", [1]),
    ("vllm", f"{MODEL}-full-text", [1, 1]),
    ("huggingface", f"{MODEL}-list", []),  # a list of 1 and of 4 inputs
    ("huggingface", f"{MODEL}-one", []),
    ("vllm_chat", MODEL, [1, 4, 1, 4]),  # chat with logprobs and top_logprobs
    ("vllm_tool", MODEL, [1, 4, 1, 4]),  # tool_choice "auto" (parser) and a named function
    ("stateful", MODEL, [1, 1, 4, 4]),  # NEW_SESSION, requests in it, CLOSE
    ("vllm_adapters", f"{MODEL}-lora", [2, 2]),  # LMI's "adapters" body field, determinism, differentiation
    ("vllm_async_adapters_chat", f"{MODEL}-lora", [2, 2]),  # the same on chat bodies
]


@pytest.mark.parametrize("handler,model,load", CHECKS, ids=[f"{h}-{m}" for h, m, _ in CHECKS])
def test_lmi_client_check_passes(lmi, seen, handler, model, load):
    lmi.run([handler, model])
    assert [c for c, _ in seen.load_runs] == load  # the client's load phase ran, every request answered
    # the client's response checks ran on LMI's content types (it skips any other silently)
    assert set(seen.content_types) <= {"application/json", "application/jsonlines"}
    if handler in ("vllm", "stateful"):
        streams = SPECS["vllm_model_spec" if handler == "vllm" else "stateful_model_spec"][model].get(
            "stream", [False, True])
        assert len(seen.content_types) == len(streams)
    if handler.startswith("vllm") and "adapters" in handler:
        # warm-up, then two collections per stream value; the first of the two is compared. For
        # chat, the client reads only unary answers (its extract_chat_content skips streams).
        assert len(seen.lora_checks) == 2
        unary_base, unary_adapters = seen.lora_checks[0]
        assert unary_base and set(unary_adapters) == set(ADAPTERS) and all(unary_adapters.values())
        if handler == "vllm_adapters":
            streamed_base, streamed_adapters = seen.lora_checks[1]
            assert streamed_base == unary_base and streamed_adapters == unary_adapters


def test_streamed_list_of_inputs(lmi, adapter_server):
    """A streamed list, read with the client's own response check and text extraction: one line per
    token per input, `index` naming the input, as LMI's vLLM handler streams a list prompt."""
    inputs = lmi.batch_generation(4)
    params = {"max_new_tokens": 8, "ignore_eos_token": True, "do_sample": False}
    res = lmi.send_json({"inputs": inputs, "parameters": params, "stream": True})
    message = res.content.decode()
    lmi.response_checker(res, message)
    assert res.headers["content-type"] == "application/jsonlines"
    records = [json.loads(line) for line in message.splitlines()]
    assert len(records) == 4 * 8 and {r["index"] for r in records} == {0, 1, 2, 3}
    unary = lmi.send_json({"inputs": inputs, "parameters": params}).json()
    finals = {r["index"]: r["generated_text"] for r in records if r["generated_text"] is not None}
    assert [finals[i] for i in range(4)] == [u["generated_text"] for u in unary]
    last = [r for r in records if r["index"] == 3][-1]
    assert lmi.extract_generated_text(json.dumps(last)) == unary[3]["generated_text"]


def test_prompt_over_the_context_gets_424_then_the_server_serves(lmi, adapter_server):
    too_long = "word " * 1000  # the tiny tokenizer makes about one token per character: over 2048
    r = httpx.post(adapter_server.url + "/invocations", json={"inputs": too_long,
                                                          "parameters": {"max_new_tokens": 16}}, timeout=120)
    assert r.status_code == lmi.FAILED_DEPENDENCY_CODE, r.text
    assert r.json()["field"] == "inputs"
    with pytest.raises(ValueError, match="Status code: 424"):
        lmi.send_json({"inputs": too_long, "parameters": {"max_new_tokens": 16}})
    lmi.run(["vllm", MODEL])


def test_vendored_client_is_unmodified():
    got = {name: hashlib.sha256((VENDORED / name).read_bytes()).hexdigest() for name in UPSTREAM_SHA256}
    assert got == UPSTREAM_SHA256
