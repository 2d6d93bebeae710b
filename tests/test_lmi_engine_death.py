"""When the engine process dies, /ping stops saying healthy and the container exits non-zero.

Needs its own server (it gets killed), started by the launcher like the container does.
"""
from __future__ import annotations

import json
import os
import signal
import threading
import time
import urllib.request

import httpx
import psutil

from conftest import start_launcher, stop

ENGINE_DEAD_EXIT = 4  # serving/exit_codes.py


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
        # An LMI stream in flight when the engine dies: it must end with a complete record naming the error.
        lines: list[bytes] = []
        first = threading.Event()

        def read_stream():
            body = {"inputs": "Deep learning is", "stream": True,
                    "parameters": {"max_new_tokens": 2000, "ignore_eos_token": True}}
            try:
                with httpx.stream("POST", srv.url + "/invocations", json=body, timeout=60) as r:
                    for line in r.iter_lines():
                        lines.append(line.encode())
                        first.set()
            except httpx.HTTPError:
                pass
            first.set()

        reader = threading.Thread(target=read_stream, daemon=True)
        reader.start()
        assert first.wait(60) and lines, "the stream sent nothing before the engine was killed"
        t0 = time.monotonic()
        os.kill(engines[0].pid, signal.SIGKILL)
        rc = srv.proc.wait(timeout=30)
        elapsed = time.monotonic() - t0
        reader.join(30)
    finally:
        stop(srv.proc)
    last = json.loads(lines[-1])
    assert "error" in last and last["code"] == 500 and "generation failed" in last["error"], lines[-3:]
    assert all(json.loads(line) for line in lines), "every line of the stream is complete JSON"
    log = srv.log()
    assert rc == ENGINE_DEAD_EXIT, f"exit status {rc}\n{log[-3000:]}"
    assert elapsed < 10, f"took {elapsed:.1f}s to exit"
    assert "the engine process died" in log
    assert _ping(srv.url) is None
