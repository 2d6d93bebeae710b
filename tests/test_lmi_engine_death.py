"""When the engine process dies, /ping stops saying healthy and the container exits non-zero.

Needs its own server (it gets killed), started by the launcher like the container does.
"""
from __future__ import annotations

import os
import signal
import time
import urllib.request

import psutil

from conftest import start_launcher, stop

ENGINE_DEAD_EXIT = 4  # serving/lmi/engine_watch.py


def _ping(url: str) -> int | None:
    try:
        with urllib.request.urlopen(url + "/ping", timeout=2) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return None  # not listening any more


def test_engine_death_exits_nonzero_promptly(tmp_path):
    srv = start_launcher(tmp_path)
    try:
        assert _ping(srv.url) == 200
        engines = [p for p in psutil.Process(srv.proc.pid).children(recursive=True)
                   if "EngineCore" in " ".join(p.cmdline()) or p.name().startswith("VLLM::EngineCore")]
        assert engines, "no EngineCore process found under the server"
        t0 = time.monotonic()
        os.kill(engines[0].pid, signal.SIGKILL)
        rc = srv.proc.wait(timeout=30)
        elapsed = time.monotonic() - t0
    finally:
        stop(srv.proc)
    log = srv.log()
    assert rc == ENGINE_DEAD_EXIT, f"exit status {rc}\n{log[-3000:]}"
    assert elapsed < 10, f"took {elapsed:.1f}s to exit"
    assert "the engine process died" in log
    assert _ping(srv.url) is None
