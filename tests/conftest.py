"""Shared fixtures: one real CPU vLLM engine, started by the launcher, for every HTTP test.

Starting the engine takes about a minute on this machine (the engine's own
warm-up), so the session shares one server; tests that must break a server
start their own.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from tools import launcher_process
from tools.launcher_process import Server, free_port, stop, wait_ready  # noqa: F401  (re-exported for tests)

# Planted secrets: no log, argv, error message or error body may show them (tests/test_launcher_e2e.py).
PLANTED_SECRET = "hf_PLANTEDsecretVALUE123"
PLANTED_SECRETS = {
    "HF_TOKEN": PLANTED_SECRET,
    "AWS_ACCESS_KEY_ID": "AKIAPLANTEDKEYID4242",
    "AWS_SECRET_ACCESS_KEY": "PLANTEDawsSECRETaccessKEY/4242+abc",
    "AWS_SESSION_TOKEN": "PLANTEDawsSESSIONtoken4242",
    "OPTION_API_KEY": "sk-PLANTEDapiKEY4242",  # a setting marked secret: vLLM then guards /v1 with it
}


def start_launcher(tmp: Path, env_extra: dict[str, str] | None = None, args: list[str] | None = None) -> Server:
    """The launcher on a free loopback port, with planted secrets and the hub offline (loopback only)."""
    env = {**PLANTED_SECRETS, "HF_HUB_OFFLINE": "1", **(env_extra or {})}
    # nice: the server under test must not starve the test client (launcher_process.yield_cpu)
    return launcher_process.start_launcher(tmp, env, args, nice=10)


@pytest.fixture(scope="session")
def server(tmp_path_factory) -> Server:
    """The launcher serving the embedded tiny model on the real CPU engine (shared by the session)."""
    srv = start_launcher(tmp_path_factory.mktemp("server"))
    yield srv
    stop(srv.proc)


@pytest.fixture(scope="module")
def moto_env():
    """A real AWS-compatible server on loopback (moto's server mode) and the environment that points boto3 at it."""
    from moto.server import ThreadedMotoServer

    port = free_port()
    srv = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    srv.start()
    env = {"AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}", "AWS_ACCESS_KEY_ID": "testing-key-id",
           "AWS_SECRET_ACCESS_KEY": "testing-SECRET-value", "AWS_DEFAULT_REGION": "us-east-1"}
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield env
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        srv.stop()


STALL_BOUND_S = 3  # client_body_timeout of user_code_server: short, so the stalled-client tests run in seconds


@pytest.fixture(scope="session")
def user_code_server(tmp_path_factory) -> Server:
    """The tiny model in a model folder with LMI users' code (tests/user_code.py: model.py with LMI's
    documented formatter examples, requirements.txt installed from the wheel folder beside it, no index),
    a /ping handler from that package named by AWS's vLLM image's CUSTOM_FASTAPI_PING_HANDLER, and a
    short client_body_timeout."""
    from user_code import lmi_model_folder

    tmp = tmp_path_factory.mktemp("user-code")
    mdir = lmi_model_folder(tmp / "model")
    srv = start_launcher(tmp, {"SERVING_MODEL_DIR": str(mdir), "LMI_CACHE_DIR": str(tmp / "cache"),
                               "PIP_NO_INDEX": "1", "OPTION_CLIENT_BODY_TIMEOUT": str(STALL_BOUND_S),
                               "CUSTOM_FASTAPI_PING_HANDLER": "lmi_fixture_greeting:ping"})
    yield srv
    stop(srv.proc)
