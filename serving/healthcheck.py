"""The image's HEALTHCHECK (`python -m serving --healthcheck`): GET /ping where the settings say the server listens.

Exit 0 when it answers 200, else 1 (ExitCode.UNHEALTHY), with one line naming the URL and the error. It reads the
settings as the launcher does (environment and serving.properties) without importing vLLM.
"""
from __future__ import annotations

import os
import sys
from typing import Mapping

from . import resolve
from .exit_codes import ExitCode


def healthcheck(env: Mapping[str, str] | None = None, timeout: float = 8) -> ExitCode:
    """GET /ping on the host and port the settings resolve to (a wildcard host: loopback), straight to it: no proxy
    variable of the environment (HTTP_PROXY, http_proxy) reroutes it."""
    import http.client

    env = dict(os.environ if env is None else env)
    try:
        sources = resolve.Sources(env)
        port, host = (sources.resolve_one(k).value for k in ("port", "host"))
    except resolve.ConfigError as e:
        print(f"unhealthy: configuration error: {e}", file=sys.stderr)
        return ExitCode.UNHEALTHY
    host = "127.0.0.1" if host in ("", "0.0.0.0") else "::1" if host == "::" else host
    url = f"http://{'[' + host + ']' if ':' in host else host}:{port}/ping"
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
    try:
        conn.request("GET", "/ping")
        status = conn.getresponse().status
    except (OSError, http.client.HTTPException) as e:
        print(f"unhealthy: {url}: {e}", file=sys.stderr)
        return ExitCode.UNHEALTHY
    finally:
        conn.close()
    if status != 200:
        print(f"unhealthy: {url}: HTTP {status}", file=sys.stderr)
        return ExitCode.UNHEALTHY
    return ExitCode.OK
