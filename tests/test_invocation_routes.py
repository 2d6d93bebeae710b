"""`X-Amzn-SageMaker-Custom-Attributes: route=<path>` on POST /invocations, end to end on the real CPU engine:
the body goes to that vLLM route and is answered as that route answers it; LMI bodies keep LMI's path."""
from __future__ import annotations

import httpx
import pytest

from conftest import PLANTED_SECRETS

pytestmark = pytest.mark.engine

ATTRS = "X-Amzn-SageMaker-Custom-Attributes"
PROMPT = "Deep learning is"
COMPLETION = {"prompt": PROMPT, "max_tokens": 8, "temperature": 0, "ignore_eos": True}
# The test servers run with an API key (conftest.PLANTED_SECRETS): vLLM then guards its /v1 routes with it
KEY = {"Authorization": "Bearer " + PLANTED_SECRETS["OPTION_API_KEY"]}


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.url, timeout=120, headers=KEY) as c:
        yield c


def routed(http, attributes: str, body) -> httpx.Response:
    return http.post("/invocations", json=body, headers={ATTRS: attributes})


def test_completion_body_goes_to_the_completions_route(http):
    r = routed(http, "route=/v1/completions", COMPLETION)
    assert r.status_code == 200, r.text
    direct = http.post("/v1/completions", json=COMPLETION)
    assert r.json()["object"] == "text_completion"
    assert r.json()["choices"][0]["text"] == direct.json()["choices"][0]["text"] != ""


def test_chat_body_goes_to_the_chat_route(http):
    body = {"messages": [{"role": "user", "content": PROMPT}], "max_tokens": 4, "temperature": 0}
    r = routed(http, "route=/v1/chat/completions", body)
    assert r.status_code == 200, r.text
    assert r.json()["object"] == "chat.completion"


def test_a_routed_request_meets_the_routes_own_api_key_guard(server):
    """route= reaches a route as a direct call does: a /v1 route wants the API key; /invocations does not."""
    with httpx.Client(base_url=server.url, timeout=120) as anonymous:
        r = routed(anonymous, "route=/v1/completions", COMPLETION)
        assert r.status_code == 401, r.text
        assert routed(anonymous, "route=/tokenize", {"prompt": PROMPT}).status_code == 200


def test_tokenize_and_detokenize_routes(http):
    r = routed(http, "route=/tokenize", {"prompt": PROMPT})
    assert r.status_code == 200, r.text
    tokens = r.json()["tokens"]
    assert tokens == http.post("/tokenize", json={"prompt": PROMPT}).json()["tokens"] and tokens
    back = routed(http, "route=/detokenize", {"tokens": tokens})
    assert back.status_code == 200, back.text
    assert back.json()["prompt"].endswith(PROMPT)


def test_route_among_other_attributes(http):
    """Attributes are comma- (or semicolon-) separated key=value pairs; the others are the caller's own."""
    for attrs in ("trace-id=abc123, route=/tokenize", "x=1;route=/tokenize ; y=2"):
        r = routed(http, attrs, {"prompt": PROMPT})
        assert r.status_code == 200 and "tokens" in r.json(), (attrs, r.text)
    # attributes without a route: /invocations as usual (an OpenAI completion body)
    r = routed(http, "trace-id=abc123, router=/tokenize", COMPLETION)
    assert r.status_code == 200 and r.json()["object"] == "text_completion", r.text


def test_streamed_completion_through_a_route(http):
    with http.stream("POST", "/invocations", json={**COMPLETION, "stream": True},
                     headers={ATTRS: "route=/v1/completions"}) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        events = [line for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "data: [DONE]" and len(events) > 2  # vLLM's SSE (output_formatter json, the default)


def test_lmi_body_keeps_its_own_path(http):
    body = {"inputs": PROMPT, "parameters": {"max_new_tokens": 4, "ignore_eos_token": True}}
    r = routed(http, "route=/v1/completions", body)
    assert r.status_code == 200, r.text
    assert set(r.json()) == {"generated_text"}


@pytest.mark.parametrize("route", ["/v1/nosuch", "/v1/embeddings"])  # the tiny model generates: no embeddings route
def test_a_route_the_server_does_not_serve_gets_404_naming_it(http, route):
    r = routed(http, f"route={route}", {"input": PROMPT})
    assert r.status_code == 404, r.text
    assert f"route={route}" in r.json()["error"] and "/v1/completions" in r.json()["error"]
    assert r.json()["field"] == ATTRS


@pytest.mark.parametrize("route", ["/start_profile", "/sleep", "/reset_prefix_cache", "/v1/load_lora_adapter",
                                   "/nosuch"])
def test_a_control_route_of_the_server_gets_403_and_is_not_called(http, route):
    r = routed(http, f"route={route}", {"lora_name": "x", "lora_path": "/tmp"})
    assert r.status_code == 403, r.text
    assert f"route={route} is not an inference route" in r.json()["error"]
    assert routed(http, "route=/tokenize", {"prompt": PROMPT}).status_code == 200  # still serving


def test_a_route_served_without_post_gets_405(http):
    r = routed(http, "route=/v1/models", {})
    assert r.status_code == 405, r.text
    assert "route=/v1/models" in r.json()["error"] and "GET" in r.json()["error"]


@pytest.mark.parametrize("attrs,says", [
    ("route=v1/completions", "'v1/completions' is not a path"),
    ("route=", "'' is not a path"),
    ("route", "'' is not a path"),
    ("route=/v1/completions?x=1", "is not a path"),
    ("route=/v1/completions, route=/tokenize", "different routes"),
])
def test_a_malformed_route_gets_400_naming_it(http, attrs, says):
    r = routed(http, attrs, COMPLETION)
    assert r.status_code == 400, r.text
    assert r.json()["error"].startswith(f"{ATTRS}: ") and says in r.json()["error"], r.text
