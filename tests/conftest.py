"""Shared fixtures: one real CPU vLLM engine, started by the launcher, for every HTTP test.

Starting the engine takes about a minute on this machine (the engine's own
warm-up), so the session shares one server; tests that must break a server
start their own.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


PLANTED_SECRET = "hf_PLANTEDsecretVALUE123"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Server:
    url: str
    proc: subprocess.Popen
    log_path: Path
    model: str

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


def wait_ready(url: str, proc: subprocess.Popen, log_path: Path, timeout: float = 420) -> None:
    """Poll /ping (bounded) until 200; fail with the server's log tail if it dies or times out."""
    import urllib.request

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}:\n{log_path.read_text()[-4000:]}")
        try:
            with urllib.request.urlopen(url + "/ping", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(1)
    raise RuntimeError(f"server not ready after {timeout}s:\n{log_path.read_text()[-4000:]}")


def start_launcher(tmp: Path, env_extra: dict[str, str] | None = None, args: list[str] | None = None) -> Server:
    """Run ./entrypoint.sh serve (the launcher execs the real engine) on a free loopback port."""
    port = free_port()
    env = dict(os.environ)
    env.update({
        "SERVING_MODEL_DIR": str(tmp / "no-model-dir"),  # no /opt/ml/model here: the embedded model is served
        "OPTION_HOST": "127.0.0.1",
        "OPTION_PORT": str(port),
        "VLLM_CPU_OMP_THREADS_BIND": "auto",
        # A planted secret: the startup log must never show it (tests/test_launcher_e2e.py).
        "HF_TOKEN": PLANTED_SECRET,
        "HF_HUB_OFFLINE": "1",  # tests talk to loopback only; the model is local
    })
    env.update(env_extra or {})
    log_path = tmp / f"server-{port}.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([str(ROOT / "entrypoint.sh"), "serve", *(args or [])], stdout=log,
                                stderr=subprocess.STDOUT, env=env, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, proc, log_path)
    except BaseException:
        stop(proc)
        raise
    return Server(url, proc, log_path, model=env.get("OPTION_MODEL_ID", ""))


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


@pytest.fixture(scope="session")
def server(tmp_path_factory) -> Server:
    """The launcher serving the embedded tiny model on the real CPU engine (shared by the session)."""
    srv = start_launcher(tmp_path_factory.mktemp("server"))
    yield srv
    stop(srv.proc)
