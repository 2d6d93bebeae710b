"""The model.py conventions of AWS's vLLM SageMaker image, through model-hosting-container-standards (mhcs),
on the real CPU engine.

The model folder holds AWS's own examples, unmodified (tests/third_party/mhcs_examples): handlers_discovery.py
as model.py (custom_sagemaker_ping_handler, custom_sagemaker_invocation_handler) and
preprocessing_postprocessing.py, whose custom_pre_process is named by CUSTOM_PRE_PROCESS; CUSTOM_POST_PROCESS
names the tests' own post-processor (AWS's example only logs). Checked:
- /ping is the custom handler's; /invocations is the custom handler's for every body, LMI bodies included;
- the pre-processor rewrote the prompt the handler saw, and the post-processor's header is on the answer;
- from SIGTERM on (the drain) /ping answers 503 whatever the custom handler says, and the process exits 0.
"""
from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import httpx
import pytest

from conftest import (EAGER, PLANTED_SECRETS, Server, await_server, early, made_by_child, spawn_server, starts_early,
                      stop)
from user_code import THIRD_PARTY, model_folder

pytestmark = pytest.mark.engine

EXAMPLES = THIRD_PARTY / "mhcs_examples"
NYA = "Say 'nya nya nya' first, then answer: "  # what AWS's custom_pre_process puts before the prompt
POST_PY = '''"""The tests' post-processor: marks each response it sees."""


async def mark(response):
    response.headers["X-Post-Processed"] = "tests"
    return response
'''
DRAIN_S = 20
V1_AUTH = {"Authorization": f"Bearer {PLANTED_SECRETS['OPTION_API_KEY']}"}  # the api_key every test server gets (conftest.PLANTED_SECRETS)


def handlers_model_folder(dest: Path) -> Path:
    """The tiny model with AWS's two examples and the tests' post-processor."""
    return model_folder(dest, {"model.py": EXAMPLES / "handlers_discovery.py",
                               "preprocessing_postprocessing.py": EXAMPLES / "preprocessing_postprocessing.py",
                               "post.py": POST_PY})


@starts_early("handlers_server")
def _handlers_server(tmp: Path, nice: int) -> Server:
    mdir = made_by_child("test_sagemaker_handlers:handlers_model_folder", tmp / "model")
    return spawn_server(tmp, {"SERVING_MODEL_DIR": str(mdir), "OPTION_SHUTDOWN_TIMEOUT": str(DRAIN_S),
                              "CUSTOM_PRE_PROCESS": "preprocessing_postprocessing.py:custom_pre_process",
                              "CUSTOM_POST_PROCESS": "post.py:mark", **EAGER}, nice=nice)


@pytest.fixture(scope="module")
def handlers_server(request) -> Server:
    srv = await_server(early(request, "handlers_server"), "handlers_server")
    yield srv
    stop(srv.proc)


@pytest.fixture(scope="module")
def http(handlers_server):
    with httpx.Client(base_url=handlers_server.url, timeout=120) as c:
        yield c


def _prompt_tokens(http, text: str) -> int:
    r = http.post("/tokenize", json={"prompt": text})
    assert r.status_code == 200, r.text
    return r.json()["count"]


def test_custom_ping_handler_answers_ping(http):
    r = http.get("/ping")
    assert r.status_code == 200, r.text
    assert r.json() == {"status": "healthy", "method": "function_discovery", "handler": "custom_sagemaker_ping_handler",
                        "vllm_engine": "healthy"}


def test_custom_invocation_handler_gets_openai_bodies_after_the_pre_processor(http):
    prompt = "Deep learning is"
    r = http.post("/invocations", json={"prompt": prompt, "max_tokens": 3})
    assert r.status_code == 200, r.text
    doc = r.json()
    assert doc["method"] == "function_discovery" and isinstance(doc["predictions"][0], str)
    assert doc["usage"]["prompt_tokens"] == _prompt_tokens(http, NYA + prompt)  # the pre-processor ran
    assert doc["usage"]["completion_tokens"] <= 3
    assert r.headers["x-post-processed"] == "tests"  # the post-processor ran


def test_custom_invocation_handler_gets_lmi_bodies_too(http):
    # the middleware would answer an LMI body with generated_text; the user's handler answers it instead
    r = http.post("/invocations", json={"inputs": "Deep learning is", "parameters": {"max_new_tokens": 3}})
    assert r.status_code == 200, r.text
    doc = r.json()
    assert "generated_text" not in doc and doc["method"] == "function_discovery"
    # AWS's pre-processor added its own prompt (the LMI body had none) and max_tokens=150
    assert doc["usage"]["prompt_tokens"] == _prompt_tokens(http, NYA)
    assert doc["usage"]["completion_tokens"] <= 150


def test_drain_answers_ping_503_whatever_the_custom_handler_says(handlers_server, http):
    url = handlers_server.url
    first = threading.Event()
    result = {}

    def long_stream():
        try:
            with httpx.Client(timeout=httpx.Timeout(10, read=DRAIN_S + 60)) as c:
                with c.stream("POST", url + "/v1/completions", headers=V1_AUTH, json={
                        "prompt": "Hello", "max_tokens": 1900, "ignore_eos": True, "stream": True}) as r:
                    result["status"] = r.status_code
                    for _ in r.iter_raw():
                        first.set()
        except Exception as e:  # noqa: BLE001 -- the stream is cut by the drain's end
            result["error"] = e
        finally:
            first.set()

    t = threading.Thread(target=long_stream, daemon=True)
    t.start()
    assert first.wait(60) and result.get("status") == 200, result
    assert http.get("/ping").status_code == 200
    os.kill(handlers_server.proc.pid, signal.SIGTERM)  # as `docker stop` does: the main process only
    deadline = time.monotonic() + 10
    ping = None
    while time.monotonic() < deadline:
        try:
            ping = httpx.get(url + "/ping", timeout=5)
        except httpx.HTTPError:
            break
        if ping.status_code == 503:
            break
        time.sleep(0.2)
    assert ping is not None and ping.status_code == 503, ping and ping.text
    assert "shutting down" in ping.json()["error"]
    handlers_server.proc.wait(DRAIN_S + 60)
    assert handlers_server.proc.returncode == 0
    t.join(30)
