"""A corpus of bad request bodies, hand-written and generated, against the shared real server.

Every body gets a 4xx (never a 5xx, a reset or a hang) and the server keeps serving. The
generated part uses hypothesis with a fixed seed, so CI sees the same bodies each run;
BAD_INPUT_EXAMPLES raises the number per strategy for a longer run by hand.
"""
from __future__ import annotations

import json
import os
import socket
import time
import urllib.error
import urllib.request
from urllib.parse import urlparse

import httpx
import pytest
import requests
from hypothesis import HealthCheck, given, settings, strategies as st

pytestmark = pytest.mark.engine

EXAMPLES = int(os.environ.get("BAD_INPUT_EXAMPLES", "40"))
LIMIT = 6 * 1024 * 1024  # the default of max_request_bytes
GENERATED = settings(max_examples=EXAMPLES, derandomize=True, database=None, deadline=None,
                     suppress_health_check=list(HealthCheck))


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.url, timeout=60) as c:
        yield c


def deep(n: int) -> bytes:
    return b"[" * n + b"]" * n


# (id, raw body): each must get a 4xx
HAND_WRITTEN = [
    # malformed JSON
    ("truncated", b'{"inputs": "x",'), ("trailing", b'{"inputs": "x"}}'), ("bare-word", b"nul"),
    ("single-quotes", b"{'inputs': 'x'}"), ("empty", b""), ("whitespace", b" \n\t "),
    ("comment", b'{"inputs": "x" /* c */}'), ("nan-inputs", b'{"inputs": NaN}'),
    # wrong types and shapes
    ("list", b"[]"), ("string", b'"x"'), ("number", b"42"), ("null", b"null"), ("empty-object", b"{}"),
    ("inputs-null", b'{"inputs": null}'), ("inputs-object", b'{"inputs": {"a": 1}}'),
    ("inputs-ints", b'{"inputs": [1, 2]}'), ("parameters-list", b'{"inputs": "x", "parameters": []}'),
    ("stream-string", b'{"inputs": "x", "stream": "yes"}'), ("prompt-int", b'{"prompt": 5}'),
    ("messages-string", b'{"messages": "hi"}'), ("openai-temperature-string", b'{"prompt": "x", "temperature": "hot"}'),
    # negative and huge token counts
    ("lmi-negative", b'{"inputs": "x", "parameters": {"max_new_tokens": -1}}'),
    ("lmi-huge", b'{"inputs": "x", "parameters": {"max_new_tokens": 100000000000000000000000000000}}'),
    ("lmi-float", b'{"inputs": "x", "parameters": {"max_new_tokens": 1e308}}'),
    ("lmi-truncate-negative", b'{"inputs": "x", "parameters": {"truncate": -5}}'),
    ("lmi-seed-2^64", b'{"inputs": "x", "parameters": {"seed": 18446744073709551616}}'),
    ("lmi-top-k-huge", b'{"inputs": "x", "parameters": {"top_k": 100000000000000000000000000000, "max_new_tokens": 2}}'),
    ("openai-negative", b'{"prompt": "x", "max_tokens": -1}'),
    ("openai-huge", b'{"prompt": "x", "max_tokens": 100000000000000000000000000000}'),
    ("openai-float", b'{"prompt": "x", "max_tokens": 1e308}'),
    ("chat-negative", b'{"messages": [{"role": "user", "content": "x"}], "max_tokens": -3}'),
    # deeply nested
    ("nested-100k", deep(100_000)), ("nested-inputs-50k", b'{"inputs": ' + deep(50_000) + b"}"),
    ("nested-params-500", b'{"inputs": "x", "parameters": {"stop": ' + deep(500) + b"}}"),
    ("nested-objects-20k", b'{"a":' * 20_000 + b"1" + b"}" * 20_000),
    # invalid UTF-8 and text that is not Unicode
    ("bad-utf8", b'{"inputs": "\xff\xfe"}'), ("bad-utf8-bare", b"\xff\xfe"),
    ("overlong-utf8", b'{"inputs": "\xc0\xaf"}'), ("utf8-cut", b'{"prompt": "\xe2\x82"}'),
    ("lone-surrogate-lmi", b'{"inputs": "\\ud800"}'), ("lone-surrogate-openai", b'{"prompt": "\\udfff", "max_tokens": 2}'),
    ("lone-surrogate-key", b'{"inputs": "x", "parameters": {"\\ud800": 1}}'),
    # over the size limit, below the factor that would close the connection
    ("over-limit", b'{"inputs": "' + b"a" * (LIMIT + 1) + b'"}'),
]


def _check(r: httpx.Response, what) -> None:
    assert 400 <= r.status_code < 500, f"{what}: {r.status_code} {r.text[:300]}"


@pytest.mark.parametrize("raw", [b for _, b in HAND_WRITTEN], ids=[i for i, _ in HAND_WRITTEN])
def test_hand_written_bad_body_gets_4xx(http, raw):
    _check(http.post("/invocations", content=raw, headers={"content-type": "application/json"}), raw[:80])


def test_lone_surrogate_is_named(http):
    r = http.post("/invocations", content=b'{"inputs": "\\ud800"}')
    assert r.status_code == 400 and r.json()["field"] == "body" and "surrogate" in r.json()["error"]
    ok = http.post("/invocations", json={"inputs": "\U0001F600", "parameters": {"max_new_tokens": 2}})
    assert ok.status_code == 200, ok.text  # a paired surrogate escape is a character like any other


def test_deep_nesting_is_named(http):
    r = http.post("/invocations", content=deep(100_000))
    assert r.status_code == 400 and "nested too deeply" in r.json()["error"]


@pytest.mark.parametrize("field", ["top_k", "seed"])
@pytest.mark.parametrize("chat", [False, True], ids=["completion", "chat"])
def test_openai_integer_beyond_64_bits_gets_400_naming_the_field(http, field, chat):
    doc = {"messages": [{"role": "user", "content": "x"}]} if chat else {"prompt": "x"}
    r = http.post("/invocations", json={**doc, "max_tokens": 2, "temperature": 1.0, field: 10**20})
    assert r.status_code == 400, r.text
    err = r.json()["error"]  # vLLM's own error shape, as for every OpenAI body
    assert err["param"] == field and err["message"].startswith(f"{field}: 100000000000000000000 does not fit")


def test_lmi_stop_strings_beyond_vllms_limit_get_424_naming_field_and_limit(http):
    r = http.post("/invocations", json={"inputs": "x", "parameters": {"stop": [f"s{i}" for i in range(1000)]}})
    assert r.status_code == 424, r.text
    doc = r.json()
    assert doc["field"] == "parameters.stop" and "1000 stop strings" in doc["error"] and "limit is 4" in doc["error"]
    r = http.post("/invocations", json={"inputs": "x", "parameters": {"stop_sequences": ["a", "b", "c", "d", "e"],
                                                                      "max_new_tokens": 2}})
    assert r.status_code == 424 and r.json()["field"] == "parameters.stop_sequences", r.text
    ok = http.post("/invocations", json={"inputs": "x", "parameters": {"stop": ["a", "b"], "stop_sequences": ["c", "d"],
                                                                       "max_new_tokens": 2}})
    assert ok.status_code == 200, ok.text


# -- generated ---------------------------------------------------------------------------

FIELDS = {  # LMI parameter -> values it refuses, whatever their type
    "max_new_tokens": st.one_of(st.integers(max_value=0), st.integers(min_value=2049), st.text(), st.floats()),
    "temperature": st.one_of(st.floats(max_value=-0.001), st.floats(min_value=2.001), st.text(), st.booleans()),
    "top_p": st.one_of(st.floats(max_value=0), st.floats(min_value=1.001), st.text()),
    "top_k": st.one_of(st.integers(max_value=-2), st.integers(min_value=2**63), st.text(),
                       st.floats()),  # strict: 3.0 is no integer
    "do_sample": st.one_of(st.integers(), st.text(), st.lists(st.booleans())),
    "seed": st.one_of(st.integers(max_value=-1), st.integers(min_value=2**63), st.text()),
    "stop": st.one_of(st.integers(), st.lists(st.integers(), min_size=1), st.dictionaries(st.text(), st.text(),
                                                                                           min_size=1)),
    "repetition_penalty": st.one_of(st.floats(max_value=0), st.floats(min_value=10.001), st.text()),
    "truncate": st.one_of(st.integers(max_value=0), st.text()),
    "return_full_text": st.one_of(st.integers(), st.text()),
}
JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
                    max_leaves=12)
TEXT = st.text(min_size=1, max_size=20).filter(lambda s: s.strip())


def _post(http, raw: bytes) -> None:
    _check(http.post("/invocations", content=raw, headers={"content-type": "application/json"}), raw[:120])


@GENERATED
@given(field=st.sampled_from(sorted(FIELDS)), data=st.data(), prompt=TEXT)
def test_generated_bad_lmi_parameter_gets_4xx(http, field, data, prompt):
    value = data.draw(FIELDS[field])
    params = {"max_new_tokens": 2, field: value}
    _post(http, json.dumps({"inputs": prompt, "parameters": params}).encode())


@GENERATED
@given(inputs=st.one_of(st.integers(), st.floats(), st.none(), st.booleans(), st.just(""), st.just([]),
                        st.lists(st.integers() | st.none() | st.just(""), min_size=1),
                        st.dictionaries(st.text(), JSON, max_size=3)))
def test_generated_bad_inputs_gets_4xx(http, inputs):
    _post(http, json.dumps({"inputs": inputs, "parameters": {"max_new_tokens": 2}}).encode())


@GENERATED
@given(name=st.text(alphabet="abcdefghijklmnopqrstuvwxyz_", min_size=1, max_size=24), value=JSON)
def test_generated_unknown_field_gets_4xx(http, name, value):
    from serving.lmi.schema import LMIParameters

    if name in LMIParameters.model_fields:
        name += "_x"
    _post(http, json.dumps({"inputs": "x", "parameters": {"max_new_tokens": 2, name: value}}).encode())


@GENERATED
@given(raw=st.binary(max_size=200))
def test_generated_bytes_that_are_not_json_get_4xx(http, raw):
    try:
        json.loads(raw)
        return  # valid JSON by chance: another test's business
    except (ValueError, RecursionError):
        pass
    _post(http, raw)


@GENERATED
@given(max_tokens=st.one_of(st.integers(max_value=0), st.integers(min_value=2049)), chat=st.booleans(),
       stream=st.booleans())
def test_generated_bad_openai_token_count_gets_4xx(http, max_tokens, chat, stream):
    body = {"max_tokens": max_tokens, "stream": stream}
    body |= {"messages": [{"role": "user", "content": "x"}]} if chat else {"prompt": "x"}
    _post(http, json.dumps(body).encode())


# -- size and pace -------------------------------------------------------------------------

HUGE = b'{"inputs": "' + b"a" * (32 * 1024 * 1024) + b'", "parameters": {"max_new_tokens": 2}}'


def test_huge_body_413_reaches_requests(server):
    r = requests.post(server.url + "/invocations", data=HUGE, headers={"content-type": "application/json"},
                      timeout=60)
    assert r.status_code == 413 and r.json()["field"] == "body"


def test_huge_body_413_reaches_urllib(server):
    req = urllib.request.Request(server.url + "/invocations", data=HUGE, headers={"content-type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=60)
    assert e.value.code == 413 and json.loads(e.value.read())["field"] == "body"


def test_huge_body_with_expect_continue_is_refused_before_it_is_sent(server):
    """A client that waits for 100-continue gets the 413 at once and never has to send the body."""
    u = urlparse(server.url)
    with socket.create_connection((u.hostname, u.port), timeout=30) as s:
        s.sendall(b"POST /invocations HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Expect: 100-continue\r\nContent-Length: %d\r\n\r\n" % len(HUGE))
        head = s.recv(4096)
    assert head.startswith(b"HTTP/1.1 413"), head[:200]


def _slow_post(server, body: bytes, pause: float) -> tuple[int, bytes]:
    """Send the request one byte at a time; return (status, response body)."""
    u = urlparse(server.url)
    raw = (b"POST /invocations HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nConnection: close\r\n"
           b"Content-Length: %d\r\n\r\n" % len(body)) + body
    with socket.create_connection((u.hostname, u.port), timeout=30) as s:
        for i in range(len(raw)):
            s.sendall(raw[i:i + 1])
            time.sleep(pause)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), rest


@pytest.mark.parametrize("body", [b'{"inputs": "x", "parameters": {"max_new_tokens": -1}}', b'{"inputs": "x",'],
                         ids=["bad-field", "malformed"])
def test_slow_client_sending_byte_by_byte_gets_4xx(server, body):
    status, _ = _slow_post(server, body, 0.01)
    assert 400 <= status < 500


def test_server_keeps_serving_after_the_corpus(http):
    assert http.get("/ping").status_code == 200
    r = http.post("/invocations", json={"inputs": "Deep learning is", "parameters": {"max_new_tokens": 4}})
    assert r.status_code == 200 and len(r.json()["generated_text"]) == 4
