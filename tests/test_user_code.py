"""LMI users' own code in the model folder, served by the real CPU engine (tests/user_code.py makes it).

The shared user_code_server serves the tiny model with:
- model.py importing LMI's two documented formatter examples, unmodified (tests/third_party/djl_serving_docs):
  the input example is the model's input formatter; the output example, written for LMI's rolling-batch
  handlers, carries no @output_formatter mark and is not called (as in LMI's vLLM handler); the tests' own
  output formatter gets vLLM's answer objects;
- requirements.txt, installed at start from the wheel folder beside it with no package index, into the
  cache folder, and on the engine's path (the output formatter and the /ping handler come from it).

Without an engine: a model.py that does not import, and a requirements.txt that does not install, each stop
the start with exit code 2 and one line.
"""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from tools.launcher_process import ROOT
from user_code import WHEEL_NAME, WHEEL_TAG, WHEEL_VERSION, make_wheel, model_folder

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def http(user_code_server):
    with httpx.Client(base_url=user_code_server.url, timeout=120) as c:
        yield c


def test_lmi_documented_input_formatter_serves_its_own_field(http):
    # LMI's example renames inputPrompt to inputs and sets max_new_tokens to 256 when absent
    r = http.post("/invocations", json={"inputPrompt": "Deep learning is",
                                        "parameters": {"ignore_eos_token": True, "do_sample": False}})
    assert r.status_code == 200, r.text
    doc = r.json()
    assert doc["type"] == "CompletionResponse" and doc["tokens"] == 256 and doc["text"]
    assert doc["wheel"] == WHEEL_TAG  # the output formatter imports the package requirements.txt installed
    r = http.post("/invocations", json={"inputPrompt": "Deep learning is", "parameters": {"max_new_tokens": 5,
                                        "ignore_eos_token": True}})
    assert r.status_code == 200 and r.json()["tokens"] == 5, r.text


def test_output_formatter_gets_vllms_answer_objects(http):
    r = http.post("/invocations", json={"prompt": "Hello", "max_tokens": 4, "ignore_eos": True})
    assert r.status_code == 200 and r.json()["type"] == "CompletionResponse" and r.json()["tokens"] == 4, r.text
    r = http.post("/invocations", json={"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 4,
                                        "ignore_eos": True})
    assert r.status_code == 200 and r.json()["type"] == "ChatCompletionResponse", r.text
    assert r.json()["tokens"] == 4


def test_output_formatter_gets_each_streamed_chunk(http):
    with http.stream("POST", "/invocations", json={"inputPrompt": "Hello", "stream": True, "parameters": {
            "max_new_tokens": 6, "ignore_eos_token": True, "do_sample": False}}) as r:
        assert r.status_code == 200
        lines = [json.loads(line) for line in r.iter_lines() if line]
    chunks = [line["chunk"] for line in lines]
    assert all(line["wheel"] == WHEEL_TAG for line in lines)
    assert chunks[-1] == "data: [DONE]"
    events = [json.loads(c.removeprefix("data: ")) for c in chunks[:-1]]
    assert sum(len(e["choices"][0].get("token_ids") or [0]) for e in events if e["choices"]) >= 1
    assert "".join(e["choices"][0]["text"] for e in events if e["choices"])


def test_formatter_that_raises_gets_424_naming_it(http):
    # LMI's input example calls .setdefault on "parameters": a string there makes it raise
    r = http.post("/invocations", json={"inputs": "x", "parameters": "oops"})
    assert r.status_code == 424, r.text
    assert "custom_input_formatter" in r.json()["error"] and "AttributeError" in r.json()["error"]
    # the tests' output formatter raises for an answer of exactly 3 tokens
    r = http.post("/invocations", json={"inputs": "x", "parameters": {"max_new_tokens": 3, "ignore_eos_token": True}})
    assert r.status_code == 424, r.text
    assert "tagged_output" in r.json()["error"] and "three tokens" in r.json()["error"]
    assert http.post("/invocations", json={"inputs": "x", "parameters": {"max_new_tokens": 2}}).status_code == 200


def test_lmi_body_and_header_naming_different_adapters_get_424_with_formatters_too(http):
    """The formatters' path reads an LMI body's adapter as the plain path does: a body and SageMaker's adapter
    header that disagree are refused, naming both, not served with the body's."""
    r = http.post("/invocations", json={"inputs": "x", "adapters": "one", "parameters": {"max_new_tokens": 2}},
                  headers={"X-Amzn-SageMaker-Adapter-Identifier": "other"})
    assert r.status_code == 424, r.text
    assert r.json()["field"] == "adapters" and "different LoRA adapters" in r.json()["error"]
    assert "adapters 'one'" in r.json()["error"] and "X-Amzn-SageMaker-Adapter-Identifier 'other'" in r.json()["error"]


def test_requirements_went_to_the_cache_and_the_engine_path(http, user_code_server):
    log = user_code_server.log()
    line = next(l for l in log.splitlines() if "requirements.txt: installed" in l)
    assert f"{WHEEL_NAME} {WHEEL_VERSION}" in line and "on the engine's path" in line
    assert importlib.util.find_spec(WHEEL_NAME) is None  # not in the image's (here: the venv's) packages
    # the ping handler named by CUSTOM_FASTAPI_PING_HANDLER lives in that package
    r = http.get("/ping")
    assert r.status_code == 200 and r.json()["handler"] == "lmi_fixture_greeting.ping"
    # what the launcher found in model.py: the documented input example; the output example is not marked
    found = next(l for l in log.splitlines() if "custom code: " in l and "model.py:" in l)
    assert "LMI input formatter custom_input_formatter" in found and "LMI output formatter tagged_output" in found
    assert "custom_output_formatter" not in found


# -- without an engine: the start stops with one line ------------------------------------------

def _serve(tmp: Path, mdir: Path, extra: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "SERVING_MODEL_DIR": str(mdir), "LMI_CACHE_DIR": str(tmp / "cache"), "HF_HUB_OFFLINE": "1",
           "OPTION_HOST": "127.0.0.1", "PIP_NO_INDEX": "1", **(extra or {})}
    return subprocess.run([str(ROOT / "entrypoint.sh"), "serve"], env=env, capture_output=True, text=True,
                          timeout=300)


def test_model_py_that_does_not_import_stops_the_start(tmp_path):
    # the case: LMI's formatter, plus a module the image lacks
    mdir = model_folder(tmp_path / "model", {"model.py": (
        "from djl_python.input_parser import input_formatter\n"
        "import json\n"
        "import lmi_not_installed_anywhere\n"
        "@input_formatter\n"
        "def custom_input(decoded_payload, tokenizer=None, **kwargs):\n"
        "    return decoded_payload\n")})
    t0 = time.monotonic()
    r = _serve(tmp_path, mdir)
    assert r.returncode == 2, r.stderr[-3000:]
    errors = [l for l in r.stderr.splitlines() if l.startswith("configuration error")]
    assert len(errors) == 1 and "Traceback" not in r.stderr, r.stderr[-3000:]
    assert f"{mdir / 'model.py'} line 3" in errors[0] and "'lmi_not_installed_anywhere'" in errors[0]
    assert time.monotonic() - t0 < 120  # before the engine loads anything


# The start's steps before the engine, run as the launcher's main() (--prepare-only stops after them): a
# requirements.txt has no script to import into the test's process.

def test_requirements_that_do_not_install_stop_the_start(tmp_path, launcher_main):
    wheels = tmp_path / "wheels"
    make_wheel(wheels)
    mdir = model_folder(tmp_path / "model", {"requirements.txt": f"{WHEEL_NAME}==9.9.9\n"})
    rc, _, err = launcher_main({"SERVING_MODEL_DIR": str(mdir), "LMI_CACHE_DIR": str(tmp_path / "cache"),
                                "HF_HUB_OFFLINE": "1", "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(wheels)},
                               ["--prepare-only"])
    assert rc == 2, err[-3000:]
    errors = [l for l in err.splitlines() if l.startswith("configuration error")]
    assert len(errors) == 1, err[-3000:]
    assert "requirements.txt" in errors[0] and f"{WHEEL_NAME}==9.9.9" in errors[0]


def test_pip_find_links_and_the_switch_are_honoured(tmp_path, launcher_main):
    wheels = tmp_path / "wheels"
    make_wheel(wheels)
    mdir = model_folder(tmp_path / "model", {"requirements.txt": f"{WHEEL_NAME}=={WHEEL_VERSION}\n"})
    env = {"SERVING_MODEL_DIR": str(mdir), "LMI_CACHE_DIR": str(tmp_path / "cache"),
           "HF_HUB_OFFLINE": "1", "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(wheels)}
    rc, _, err = launcher_main(env, ["--prepare-only"])
    assert rc == 0, err[-3000:]
    assert f"requirements.txt: installed {WHEEL_NAME} {WHEEL_VERSION}" in err
    assert list((tmp_path / "cache" / "requirements").glob(f"*/{WHEEL_NAME}/__init__.py"))
    rc, _, err = launcher_main({**env, "STANDARD_AUTO_INSTALL_REQ": "false", "LMI_CACHE_DIR": str(tmp_path / "c2")},
                               ["--prepare-only"])
    assert rc == 0 and "not installed (install_requirements=false)" in err, err[-3000:]
    assert not (tmp_path / "c2" / "requirements").exists()
