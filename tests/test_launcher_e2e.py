"""End to end: the launcher starts the real CPU vLLM engine on the embedded tiny model; /ping and /invocations answer."""
from __future__ import annotations

import json
import urllib.request

import pytest

pytestmark = pytest.mark.engine


def post(url, body):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return r.status, json.loads(r.read())


def test_ping(server):
    with urllib.request.urlopen(server.url + "/ping", timeout=10) as r:
        assert r.status == 200


def test_invocations_openai_completion_body(server):
    status, body = post(server.url + "/invocations", {"prompt": "Hello", "max_tokens": 6, "temperature": 0})
    assert status == 200
    assert body["object"] == "text_completion"
    assert body["usage"]["completion_tokens"] == 6
    assert len(body["choices"][0]["text"]) == 6  # byte-level model, printable ASCII only: one char a token


def test_invocations_lmi_body(server):
    status, body = post(server.url + "/invocations", {"inputs": "Hello", "parameters": {"max_new_tokens": 5,
                                                                                         "do_sample": False}})
    assert status == 200
    assert isinstance(body["generated_text"], str) and len(body["generated_text"]) == 5


def test_startup_log_reports_settings_patches_and_command(server):
    log = server.log()
    assert "no model configured: serving the embedded tiny Qwen3-MoE" in log
    assert "setting port=" in log and "[env OPTION_PORT; vLLM --port]" in log
    assert "vLLM patches applied to 0.32.0:" in log
    assert "starting engine: " in log and "--middleware serving.lmi.middleware.LMIMiddleware" in log


def test_startup_log_masks_the_hub_token(server):
    from conftest import PLANTED_SECRET

    log = server.log()
    assert "setting hf_token=****  [env HF_TOKEN; launcher]" in log
    assert PLANTED_SECRET not in log
