"""Shared fixtures: one real CPU vLLM engine, started by the launcher, for every HTTP test.

Starting the engine takes about a minute on this machine (the engine's own
warm-up), so the session shares one server; tests that must break a server
start their own.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from tools import launcher_process
from tools.launcher_process import Server, free_port, stop, wait_ready  # noqa: F401  (re-exported for tests)

# A planted secret: the startup log must never show it (tests/test_launcher_e2e.py).
PLANTED_SECRET = "hf_PLANTEDsecretVALUE123"


def start_launcher(tmp: Path, env_extra: dict[str, str] | None = None, args: list[str] | None = None) -> Server:
    """The launcher on a free loopback port, with a planted HF_TOKEN and the hub offline (loopback only)."""
    env = {"HF_TOKEN": PLANTED_SECRET, "HF_HUB_OFFLINE": "1", **(env_extra or {})}
    # nice: the server under test must not starve the test client (launcher_process.yield_cpu)
    return launcher_process.start_launcher(tmp, env, args, nice=10)


@pytest.fixture(scope="session")
def server(tmp_path_factory) -> Server:
    """The launcher serving the embedded tiny model on the real CPU engine (shared by the session)."""
    srv = start_launcher(tmp_path_factory.mktemp("server"))
    yield srv
    stop(srv.proc)
