"""Graceful drain: SIGTERM to the container's main process while streams are in flight.

Its own server (it is stopped), started by the launcher with a short drain timeout and a
tiny model with a long context, so one stream cannot finish within the drain while the short
ones do:
- the short streams (LMI and OpenAI, streamed and not) complete whole, equal to their greedy
  answers taken before the signal;
- from the signal on, /ping and new requests get 503;
- the long streams (LMI and OpenAI) get a final error record in their own format when the
  drain timeout ends, and are closed;
- the process exits 0, within the drain timeout plus a bound.
"""
from __future__ import annotations

import json
import os
import re
import signal
import threading
import time
from pathlib import Path

import httpx
import pytest

from conftest import EAGER, Server, await_server, early, made_by_child, spawn_server, starts_early, stop
from serving.tiny_model import TinySpec, ensure

pytestmark = pytest.mark.engine

DRAIN_S = 15
EXIT_BOUND_S = DRAIN_S + 20  # drain, then the idle engine's stop and the HTTP server's
SHORT = 120  # tokens: a second or two here, even beside the long stream
LONG = 15000  # tokens: minutes here, far beyond the drain


def _lmi_body(prompt, n, stream):
    return {"inputs": prompt, "parameters": {"max_new_tokens": n, "ignore_eos_token": True, "do_sample": False},
            "stream": stream}


def _openai_body(prompt, n, stream):
    return {"prompt": prompt, "max_tokens": n, "temperature": 0, "ignore_eos": True, "stream": stream}


def _lmi_text(raw: bytes) -> tuple[str | None, list[dict]]:
    """(generated_text of the final record, all records) of an LMI jsonlines stream."""
    records = [json.loads(line) for line in raw.decode().split("\n") if line]
    return records[-1].get("generated_text") if records else None, records


def _sse_text(raw: bytes) -> tuple[str, list[str]]:
    events = [e for e in raw.decode().split("\n\n") if e]
    text = "".join(json.loads(e[6:])["choices"][0]["text"] for e in events
                   if e.startswith("data: {") and "choices" in json.loads(e[6:]))
    return text, events


class Stream(threading.Thread):
    """One streamed request read to its end in a thread; `first` is set at its first bytes."""

    def __init__(self, url, body):
        super().__init__(daemon=True)
        self.url, self.body = url, body
        self.first = threading.Event()
        self.raw, self.status, self.error, self.ended_at = b"", None, None, None

    def run(self):
        try:
            with httpx.Client(timeout=httpx.Timeout(10, read=EXIT_BOUND_S + 60)) as c:
                with c.stream("POST", self.url + "/invocations", json=self.body) as r:
                    self.status = r.status_code
                    for chunk in r.iter_raw():
                        self.raw += chunk
                        self.first.set()
        except Exception as e:  # noqa: BLE001 -- recorded, asserted on below
            self.error = e
        finally:
            self.ended_at = time.monotonic()
            self.first.set()


def long_context_model(out: Path) -> Path:
    """The tiny model with room for the long stream's positions (the embedded one has 2,048)."""
    return ensure(out, TinySpec(max_position=LONG + 1024))


_LONG_CONTEXT: list[Path] = []  # the model folder both drain servers serve, made by the first one's start


def _spawn_drain_server(tmp: Path, nice: int, extra: dict[str, str]) -> Server:
    # early starts are made one at a time (conftest.EarlyStarts.get holds its lock), so the second finds the first's
    if not _LONG_CONTEXT:
        _LONG_CONTEXT.append(made_by_child("test_drain:long_context_model", tmp / "long-context"))
    model = _LONG_CONTEXT[0]
    return spawn_server(tmp, {"OPTION_SHUTDOWN_TIMEOUT": str(DRAIN_S), "OPTION_MODEL_ID": str(model),
                              "OPTION_MAX_MODEL_LEN": str(LONG + 1024), **EAGER, **extra}, nice=nice)


@starts_early("drain_server")
def _drain_server(tmp: Path, nice: int) -> Server:
    return _spawn_drain_server(tmp, nice, {})


@starts_early("drain_api_servers_server")
def _drain_api_servers_server(tmp: Path, nice: int) -> Server:
    return _spawn_drain_server(tmp, nice, {"OPTION_API_SERVER_COUNT": "2"})  # the GPU build runs four


@pytest.fixture
def drain_server(request) -> Server:
    return await_server(early(request, "drain_server"), "drain_server")


@pytest.fixture
def drain_api_servers_server(request) -> Server:
    return await_server(early(request, "drain_api_servers_server"), "drain_api_servers_server")


def test_sigterm_drains_in_flight_streams_then_exits_0(drain_server):
    _check_drain(drain_server)


def test_sigterm_drains_every_api_server_process_then_exits_0(drain_api_servers_server):
    """Two API server processes: each drains the requests it holds."""
    assert "'api_server_count': 2" in drain_api_servers_server.log()
    _check_drain(drain_api_servers_server)


def _check_drain(srv: Server) -> None:
    try:
        with httpx.Client(base_url=srv.url, timeout=120) as c:
            want = {p: c.post("/invocations", json=_lmi_body(p, SHORT, False)).json()["generated_text"]
                    for p in ("Deep learning is", "The drain")}
            short = [Stream(srv.url, _lmi_body("Deep learning is", SHORT, True)),
                     Stream(srv.url, _openai_body("The drain", SHORT, True))]
            long = Stream(srv.url, _lmi_body("Hello", LONG, True))
            long_sse = Stream(srv.url, _openai_body("Hello", LONG, True))
            for s in (long, long_sse, *short):
                s.start()
            for s in (long, long_sse, *short):
                assert s.first.wait(60) and s.error is None, f"no first bytes: {s.error}"
            # a non-streamed request in flight too, answered whole after the signal
            plain: dict = {}
            t_plain = threading.Thread(target=lambda: plain.update(
                r=c.post("/invocations", json=_openai_body("The drain", SHORT, False))), daemon=True)
            t_plain.start()
            time.sleep(0.3)

            t0 = time.monotonic()
            os.kill(srv.proc.pid, signal.SIGTERM)  # as `docker stop` does: the main process only
            ping = None
            while time.monotonic() - t0 < 5:
                ping = c.get("/ping").status_code
                if ping == 503:
                    break
                time.sleep(0.1)
            assert ping == 503, f"/ping answered {ping} after SIGTERM"
            refused = c.post("/invocations", json=_lmi_body("new", 4, False))
            assert refused.status_code == 503 and "shutting down" in refused.json()["error"]

            for s in short:
                s.join(DRAIN_S)
            t_plain.join(DRAIN_S)
            long.join(EXIT_BOUND_S)
            long_sse.join(EXIT_BOUND_S)
            rc = srv.proc.wait(EXIT_BOUND_S)
            exited = time.monotonic() - t0
    finally:
        stop(srv.proc)
    log = srv.log()

    lmi_short, sse_short = short
    assert lmi_short.status == 200 and lmi_short.error is None, lmi_short.error
    text, records = _lmi_text(lmi_short.raw)
    assert text == want["Deep learning is"] and len(records) == SHORT, records[-1]
    assert "".join(r["token"]["text"] for r in records) == text
    assert sse_short.status == 200 and sse_short.error is None, sse_short.error
    text, events = _sse_text(sse_short.raw)
    assert events[-1] == "data: [DONE]" and text == want["The drain"]
    assert plain["r"].status_code == 200 and plain["r"].json()["choices"][0]["text"] == want["The drain"]
    for s in short:
        assert s.ended_at - t0 < DRAIN_S, "a short stream finished only after the drain timeout"

    assert long.status == 200 and long.error is None, f"the long stream was not closed cleanly: {long.error}"
    _, records = _lmi_text(long.raw)
    assert 0 < len(records) - 1 < LONG
    assert records[-1]["code"] == 503 and "drain timeout" in records[-1]["error"], records[-1]
    assert DRAIN_S - 1 < long.ended_at - t0 < DRAIN_S + 5, f"long stream closed after {long.ended_at - t0:.1f}s"

    assert long_sse.status == 200 and long_sse.error is None, long_sse.error
    text, events = _sse_text(long_sse.raw)
    assert 0 < len(text) < LONG and events[-1] == "data: [DONE]", events[-2:]
    err = json.loads(events[-2][len("data: "):])["error"]
    assert err["code"] == 503 and "drain timeout" in err["message"], err

    assert rc == 0, f"exit status {rc}\n{log[-3000:]}"
    assert exited < EXIT_BOUND_S
    ended = re.findall(r"drain: timeout of 15s reached; ending (\d+) request\(s\) still running", log)
    assert sum(map(int, ended)) == 2, ended  # the two long streams, wherever they landed
