"""Multi-LoRA and sticky sessions as SageMaker and LMI send them, on the real CPU engine.

The session's adapter server (tests/conftest.py) serves a model directory laid out as LMI expects: a
tiny dense Qwen3 with the embedded model's tokenizer, plus LoRA adapters in adapters/
(tests/adapter_model.py); sessions are on (LMI's OPTION_ENABLE_STATEFUL_SESSIONS). The session server,
which sets nothing, shows they are on by default.
"""
from __future__ import annotations

import json

import httpx
import pytest

from adapter_model import ADAPTERS

pytestmark = pytest.mark.engine

PROMPT = "Deep learning is"
N = 12
ADAPTER = ADAPTERS[0]
ADAPTER_HEADER = "X-Amzn-SageMaker-Adapter-Identifier"
SESSION_HEADER = "X-Amzn-SageMaker-Session-Id"


@pytest.fixture(scope="module")
def client(adapter_server):
    with httpx.Client(base_url=adapter_server.url, timeout=120) as c:
        yield c


def generate(client, headers=None, **body) -> httpx.Response:
    doc = {"inputs": PROMPT, "parameters": {"max_new_tokens": N, "ignore_eos_token": True}, **body}
    return client.post("/invocations", json=doc, headers=headers or {})


def test_adapters_in_the_model_folder_are_served(adapter_server, client):
    log = adapter_server.log()
    assert f"LoRA adapters: {', '.join(ADAPTERS)} (chosen per request" in log
    assert "setting enable_lora=true  [default (LoRA adapters in the model's adapters/)" in log
    base = generate(client).json()["generated_text"]
    by_body = generate(client, adapters=ADAPTER)
    assert by_body.status_code == 200, by_body.text
    by_header = generate(client, headers={ADAPTER_HEADER: ADAPTER})
    assert by_body.json()["generated_text"] == by_header.json()["generated_text"] != base
    # An OpenAI body with SageMaker's header is served by vLLM's own hooks: the same adapter, the same text.
    r = client.post("/invocations", json={"prompt": PROMPT, "max_tokens": N, "temperature": 0, "ignore_eos": True},
                    headers={ADAPTER_HEADER: ADAPTER})
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["text"] == by_body.json()["generated_text"]
    stream = generate(client, adapters=[ADAPTER], stream=True)
    assert json.loads(stream.text.splitlines()[-1])["generated_text"] == by_body.json()["generated_text"]


def test_adapters_own_model_py_formats_that_adapters_requests(adapter_server, client):
    expected = generate(client, adapters=ADAPTER).json()["generated_text"]
    body = {"adapterPrompt": PROMPT, "parameters": {"max_new_tokens": N, "ignore_eos_token": True}}
    for how in ({"json": {**body, "adapters": ADAPTER}}, {"json": body, "headers": {ADAPTER_HEADER: ADAPTER}}):
        r = client.post("/invocations", **how)
        assert r.status_code == 200, r.text
        assert r.json()["generated_text"] == expected
    r = client.post("/invocations", json=body)  # the base model has no formatter: adapterPrompt is no body kind
    assert r.status_code == 424 and "inputs" in r.json()["error"], r.text
    assert f"adapters/{ADAPTER}/model.py: LMI input formatter adapter_input" in adapter_server.log()


def openai_token_ids(client, kind, headers=None, **fields) -> list[int]:
    doc = ({"prompt": PROMPT} if kind == "completion" else {"messages": [{"role": "user", "content": PROMPT}]})
    doc.update(max_tokens=N, temperature=0, ignore_eos=True, return_token_ids=True, **fields)
    r = client.post("/invocations", json=doc, headers=headers or {})
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["token_ids"]


@pytest.mark.parametrize("kind", ["completion", "chat"])
def test_openai_bodies_name_the_adapter_in_the_body(client, kind):
    """vLLM's SageMaker hooks take an OpenAI body's adapter from the header only; LMI's client names it
    with the body field `adapters` (as LMI's vLLM handler reads it), OpenAI clients with `model`."""
    base = openai_token_ids(client, kind)
    by_header = openai_token_ids(client, kind, {ADAPTER_HEADER: ADAPTER})
    assert len(base) == N and by_header != base
    assert openai_token_ids(client, kind, adapters=ADAPTER) == by_header
    assert openai_token_ids(client, kind, adapters=[ADAPTER], model=ADAPTER) == by_header
    assert openai_token_ids(client, kind, model=ADAPTER) == by_header
    assert openai_token_ids(client, kind, {ADAPTER_HEADER: ADAPTER}, adapters=ADAPTER) == by_header
    assert openai_token_ids(client, kind, adapters=None) == base


def test_a_routed_body_is_served_by_the_adapter_it_names(client):
    """route= (SageMaker's custom attributes) sends the body to vLLM's own route, which reads the adapter from
    `model` only: the adapter the request names in the header or in `adapters` is put there."""
    from conftest import PLANTED_SECRETS

    by_header = openai_token_ids(client, "completion", {ADAPTER_HEADER: ADAPTER})
    route = {"X-Amzn-SageMaker-Custom-Attributes": "route=/v1/completions",
             "Authorization": "Bearer " + PLANTED_SECRETS["OPTION_API_KEY"]}  # vLLM guards /v1 with the key
    assert openai_token_ids(client, "completion", {**route, ADAPTER_HEADER: ADAPTER}) == by_header
    assert openai_token_ids(client, "completion", route, adapters=ADAPTER) == by_header
    assert openai_token_ids(client, "completion", route) != by_header


@pytest.mark.parametrize("fields,headers,error", [
    ({"adapters": "no-such-adapter"}, None, "adapters: no LoRA adapter named 'no-such-adapter'; served: " + ", ".join(ADAPTERS)),
    ({"adapters": ADAPTER}, {ADAPTER_HEADER: "other"}, "adapters: the request names different LoRA adapters"),
    ({"adapters": 3}, None, "adapters: give one LoRA adapter's name"),
    ({"adapters": [ADAPTER, "other"]}, None, "adapters: give one LoRA adapter's name"),
], ids=["unknown", "differs-from-header", "not-a-name", "two-names"])
def test_openai_body_with_a_bad_adapters_field_gets_424(client, fields, headers, error):
    r = client.post("/invocations", json={"prompt": PROMPT, "max_tokens": 2, **fields}, headers=headers or {})
    assert r.status_code == 424, r.text
    assert r.json()["field"] == "adapters" and r.json()["error"].startswith(error)


def test_an_unknown_adapter_in_the_header_gets_424_naming_the_header(client):
    """The header is held to the rule every place a request names its adapter in is held to."""
    for body in ({"prompt": PROMPT, "max_tokens": 2}, {"inputs": PROMPT}):
        r = client.post("/invocations", json=body, headers={ADAPTER_HEADER: "no-such-adapter"})
        assert r.status_code == 424 and r.json()["field"] == ADAPTER_HEADER, r.text
        assert r.json()["error"].startswith(f"{ADAPTER_HEADER}: no LoRA adapter named 'no-such-adapter'; served: ")


@pytest.mark.parametrize("body,headers,field", [
    ({"adapters": "no-such-adapter"}, None, "adapters"),
    ({"adapters": ADAPTER}, {ADAPTER_HEADER: "other"}, "adapters"),
    ({"inputs": ["a", "b"], "adapters": [ADAPTER, "other"]}, None, "adapters"),
    ({}, {SESSION_HEADER: "no-such-session"}, SESSION_HEADER),
])
def test_bad_adapter_or_session_gets_424_naming_it(client, body, headers, field):
    r = generate(client, headers, **body)
    assert r.status_code == 424, r.text
    assert r.json()["field"] == field and r.json()["error"].startswith(field)


def test_sticky_session_lifecycle(client):
    created = client.post("/invocations", json={"requestType": "NEW_SESSION"})
    assert created.status_code == 200, created.text
    # SageMaker's contract: the header; LMI's client: a JSON body it can parse.
    sid, expires = created.headers["X-Amzn-SageMaker-New-Session-Id"].split(";")
    # LMI answers a create with this name (its own client reads it): the same value
    assert created.headers[SESSION_HEADER] == created.headers["X-Amzn-SageMaker-New-Session-Id"]
    assert expires.strip().startswith("Expires=")
    assert created.headers["content-type"] == "application/json"
    doc = created.json()
    assert (doc["session_id"], doc["expires"]) == (sid.strip(), expires.strip().removeprefix("Expires="))
    sid = sid.strip()
    assert generate(client, {SESSION_HEADER: sid}).status_code == 200
    r = client.post("/invocations", json={"prompt": PROMPT, "max_tokens": 2}, headers={SESSION_HEADER: sid})
    assert r.status_code == 200, r.text
    closed = client.post("/invocations", json={"requestType": "CLOSE"}, headers={SESSION_HEADER: sid})
    assert closed.status_code == 200, closed.text
    assert closed.headers["X-Amzn-SageMaker-Closed-Session-Id"] == sid
    assert closed.json()["closed_session_id"] == sid
    r = generate(client, {SESSION_HEADER: sid})
    assert r.status_code == 424 and r.json()["field"] == SESSION_HEADER


def test_a_session_is_known_to_every_api_server_process(adapter_server):
    """The adapter server runs two API server processes; the kernel hands each new connection to either. A session
    made on one connection serves on every other, and once closed it is gone from all of them (each connection
    below is a new one; without the shared registry all 12 would have to land where the session was made: a chance
    of 1 in 4,096)."""
    assert "'api_server_count': 2" in adapter_server.log()

    def once(body, sid=None):
        return httpx.post(adapter_server.url + "/invocations", json=body, timeout=120,
                          headers={SESSION_HEADER: sid} if sid else {})

    sid = once({"requestType": "NEW_SESSION"}).json()["session_id"]
    body = {"inputs": PROMPT, "parameters": {"max_new_tokens": 2}}
    served = [once(body, sid) for _ in range(12)]
    assert [r.status_code for r in served] == [200] * 12, [r.text for r in served if r.status_code != 200]
    closed = once({"requestType": "CLOSE"}, sid)
    assert closed.status_code == 200, closed.text
    after = [once(body, sid) for _ in range(12)]
    assert [(r.status_code, r.json()["field"]) for r in after] == [(424, SESSION_HEADER)] * 12


def test_sessions_are_on_by_default(server):
    created = httpx.post(server.url + "/invocations", json={"requestType": "NEW_SESSION"}, timeout=60)
    assert created.status_code == 200, created.text
    sid = created.json()["session_id"]
    assert created.headers["X-Amzn-SageMaker-New-Session-Id"].split(";")[0] == sid
