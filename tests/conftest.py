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


# (test that started it, seconds from start to /ping 200) of every server the session started
READY_TIMES: list[tuple[str, float]] = []


_RUNNING: list[pytest.Item] = []  # the test being set up or run


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    _RUNNING[:] = [item]


def start_launcher(tmp: Path, env_extra: dict[str, str] | None = None, args: list[str] | None = None) -> Server:
    """The launcher on a free loopback port, with planted secrets and the hub offline (loopback only)."""
    # `make test-quick` leaves out the tests marked engine: every test that starts the engine carries the mark
    item = _RUNNING[0] if _RUNNING else None
    assert item is None or item.get_closest_marker("engine"), f"{item.nodeid} starts the engine: mark it engine"
    env = {**PLANTED_SECRETS, "HF_HUB_OFFLINE": "1", **(env_extra or {})}
    # nice: the server under test must not starve the test client (launcher_process.yield_cpu)
    srv = launcher_process.start_launcher(tmp, env, args, nice=10)
    READY_TIMES.append((os.environ.get("PYTEST_CURRENT_TEST", "?").split(" ")[0], srv.ready_s))
    return srv


def pytest_terminal_summary(terminalreporter):
    """Each engine server's time to ready: what the suite's engine tests wait for."""
    if READY_TIMES:
        terminalreporter.section("engine servers: start to ready")
        for test, seconds in READY_TIMES:
            terminalreporter.write_line(f"{seconds:6.1f} s  {test}")


@pytest.fixture(scope="session")
def server(tmp_path_factory) -> Server:
    """The launcher serving the embedded tiny model on the real CPU engine (shared by the session)."""
    srv = start_launcher(tmp_path_factory.mktemp("server"))
    yield srv
    stop(srv.proc)


@pytest.fixture(scope="session")
def adapter_server(tmp_path_factory) -> Server:
    """The launcher serving tests/adapter_model.py's tiny dense Qwen3 and its LoRA adapters, sticky sessions
    on (OPTION_ENABLE_STATEFUL_SESSIONS, LMI's name) and a tool-call parser, as LMI's tool-calling test model
    is configured (option.enable_auto_tool_choice, option.tool_call_parser); shared by the session."""
    from adapter_model import adapter_model_dir

    mdir = adapter_model_dir(tmp_path_factory.mktemp("adapter-model"))
    srv = start_launcher(tmp_path_factory.mktemp("adapter-server"), {
        "SERVING_MODEL_DIR": str(mdir), "OPTION_ENABLE_STATEFUL_SESSIONS": "true",
        "OPTION_ENABLE_AUTO_TOOL_CHOICE": "true", "OPTION_TOOL_CALL_PARSER": "hermes"})
    yield srv
    stop(srv.proc)


@pytest.fixture
def launcher_main(monkeypatch, capsys, caplog):
    """`python -m serving --dry-run` (or --prepare-only) run as the launcher's main() in this process, where the
    command line is not the subject: run(env, argv, drop) clears the caller's variables starting with `drop`,
    sets `env`, and gives (exit status, stdout, stderr followed by the log)."""
    from serving.launcher import main

    def run(env: dict[str, str], argv: list[str], drop: tuple[str, ...] = ("OPTION_", "SM_VLLM_", "HF_")):
        assert {"--dry-run", "--prepare-only"} & set(argv), "main() would start the engine in the test's process"
        for k in list(os.environ):
            if k.startswith(drop):
                monkeypatch.delenv(k)
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        capsys.readouterr()
        caplog.clear()
        with caplog.at_level("INFO"):
            rc = main(argv)
        out = capsys.readouterr()
        return rc, out.out, out.err + caplog.text
    return run


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
