"""bench/http/api_server_cpu.py: the CPU time of the API server processes per streamed request, on the real CPU engine
served by the launcher (the session's server of two API server processes, measured by --url with its API key): every
stream's tokens are counted, the per-token figure is the two counts' difference, and a bad count is named."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import PLANTED_SECRETS

ROOT = Path(__file__).resolve().parents[1]


def run(*args: str, timeout: float = 600, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bench.http.api_server_cpu", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, **(env or {})})


@pytest.mark.engine
def test_two_api_servers_serve_every_token_and_the_figures_add_up(api_servers_server, tmp_path):
    out = tmp_path / "cpu.json"
    key = {"OPENAI_API_KEY": PLANTED_SECRETS["OPTION_API_KEY"]}
    base = ("--url", api_servers_server.url, "--requests", "8", "--tokens", "4", "1", "--bursts", "2")
    r = run(*base, "--api-servers", "1", env=key, timeout=120)  # the count checked against the listening processes
    assert r.returncode == 1 and "3 process(es) listen on" in r.stderr and "--api-servers" in r.stderr, r.stderr
    r = run(*base, "--api-servers", "2", "--json", str(out), env=key)
    assert r.returncode == 0, r.stdout + r.stderr
    res = json.loads(out.read_text())
    assert (res["api_servers"], res["requests"], res["bursts"]) == (2, 8, 2)
    assert res["processes"] == 3  # two API servers and the process that made their socket
    per = {int(t): v for t, v in res["per_request"].items()}
    assert sorted(per) == [1, 4] and all(v["cpu_ms"] > 0 and v["wall_s"] > 0 for v in per.values())
    assert res["cpu_ms_per_extra_token"] == pytest.approx((per[4]["cpu_ms"] - per[1]["cpu_ms"]) / 3)
    assert "2 API server process(es) (3 listening), 2 bursts of 8 streamed requests:" in r.stdout
    assert f"max_tokens 4: {per[4]['cpu_ms']:.3f} CPU ms a request" in r.stdout


@pytest.mark.parametrize("args, error", [(["--requests", "0"], "--requests: 1 or more, not 0"),
                                         (["--tokens", "2", "0"], "--tokens: each 1 or more, not 0"),
                                         (["--url", "http://192.0.2.1:8080"], "--url: a loopback address")])
def test_a_bad_argument_is_named(args, error):
    r = run(*args, timeout=60)
    assert r.returncode == 2 and error in r.stderr
