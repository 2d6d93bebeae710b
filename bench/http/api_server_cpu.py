"""The CPU time vLLM's API server spends on each request of a burst of streamed completions: the container's
launcher serving the embedded tiny model on the CPU engine, with one or more API server processes.

    .venv/bin/python -m bench.http.api_server_cpu [--api-servers 1] [--requests 128] [--tokens 1 32] [--bursts 4]
                                             [--url URL] [--json FILE]

Each burst sends --requests streamed /v1/completions at once (fresh 128-character text prompts, which the API server
tokenizes; greedy, ignore_eos, max_tokens each of --tokens) after one unmeasured burst. The figure is the CPU time
(user + system) of the processes that listen on the server's port, read from /proc before and after: the API server
processes, and with more than one the idle process that made their socket. Prints the CPU milliseconds one request
costs them at each --tokens and one more streamed token's cost. One API server process does this work for every
request in turn, so in a burst of R requests the last reaches the engine about R times the first figure after the
first. The engine shares this machine's cores, so the figures are its Python and CPU, not a GPU host's.

--url measures a server already running on this machine (the launcher's, on loopback) instead of starting one; it
must run --api-servers API server processes. Where the server guards /v1 with an API key, OPENAI_API_KEY holds it
(as for vLLM's `vllm bench serve`).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import string
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import urlsplit

import aiohttp
import psutil

from bench.e2e.workload import request_json
from tools.launcher_process import start_launcher, stop

PROMPT_CHARS = 128


def listening(port: int) -> list[psutil.Process]:
    """The processes of this machine that listen on TCP `port` (each process that holds the listening socket: API
    server processes share one, which psutil.net_connections reports under one of them only)."""
    out = []
    for p in psutil.process_iter():
        try:
            if any(c.status == psutil.CONN_LISTEN and c.laddr.port == port for c in p.net_connections("tcp")):
                out.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return out


def processes_of(api_servers: int) -> int:
    """How many processes listen on the port of a launcher running `api_servers` API server processes: the one, or
    each of several and the process that made their socket."""
    return 1 if api_servers == 1 else api_servers + 1


def cpu_seconds(procs: list[psutil.Process]) -> float:
    return sum(t.user + t.system for t in (p.cpu_times() for p in procs))


def auth_headers() -> dict[str, str]:
    """The bearer token of OPENAI_API_KEY, where it is set."""
    key = os.environ.get("OPENAI_API_KEY")
    return {"Authorization": f"Bearer {key}"} if key else {}


async def burst(url: str, model: str, n: int, tokens: int, rnd: random.Random) -> int:
    """n streamed completions at once; the tokens their streams' usage records count in all (an event may carry
    more than one token when the API server falls behind)."""
    async def one(session, prompt):
        body = {"model": model, "prompt": prompt, "max_tokens": tokens, "stream": True, "ignore_eos": True,
                "temperature": 0, "stream_options": {"include_usage": True}}
        got = 0
        async with session.post(url + "/v1/completions", json=body) as r:
            if r.status != 200:
                raise RuntimeError(f"/v1/completions -> {r.status}: {(await r.text())[:300]}")
            async for line in r.content:
                if line.startswith(b"data: {") and b'"usage"' in line:
                    got = (json.loads(line[6:]).get("usage") or {}).get("completion_tokens") or got
        return got

    prompts = ["".join(rnd.choices(string.ascii_letters + string.digits, k=PROMPT_CHARS)) for _ in range(n)]
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), timeout=timeout,
                                     headers=auth_headers()) as session:
        return sum(await asyncio.gather(*(one(session, p) for p in prompts)))


def measure(api_servers: int, requests: int, tokens: list[int], bursts: int, url: str | None = None) -> dict:
    """The figures of the server at `url`, or of a launcher started for them with `api_servers` API servers."""
    if url is not None:
        return measure_server(url, api_servers, requests, tokens, bursts)
    with tempfile.TemporaryDirectory() as tmp:
        srv = start_launcher(Path(tmp), {"OPTION_API_SERVER_COUNT": str(api_servers)})
        try:
            return measure_server(srv.url, api_servers, requests, tokens, bursts)
        finally:
            stop(srv.proc)


def measure_server(url: str, api_servers: int, requests: int, tokens: list[int], bursts: int) -> dict:
    parts = urlsplit(url)
    procs = listening(parts.port or 80)
    if len(procs) != processes_of(api_servers):
        raise RuntimeError(f"{len(procs)} process(es) listen on {url}, not the {processes_of(api_servers)} of "
                           f"{api_servers} API server process(es): give --api-servers as the server runs")
    model = request_json(parts.netloc, "GET", "/v1/models", timeout=60, headers=auth_headers())["data"][0]["id"]
    rnd = random.Random(0)
    asyncio.run(burst(url, model, requests, max(tokens), rnd))  # unmeasured: first-use costs
    per_request = {}
    for t in tokens:
        before, start = cpu_seconds(procs), time.monotonic()
        got = sum(asyncio.run(burst(url, model, requests, t, rnd)) for _ in range(bursts))
        cpu, wall = cpu_seconds(procs) - before, time.monotonic() - start
        if got != bursts * requests * t:
            raise RuntimeError(f"the streams counted {got} tokens, not {bursts * requests * t}")
        per_request[t] = {"cpu_ms": cpu * 1e3 / (bursts * requests), "wall_s": wall}
    low, high = min(tokens), max(tokens)
    extra = ((per_request[high]["cpu_ms"] - per_request[low]["cpu_ms"]) / (high - low)) if high > low else None
    return {"api_servers": api_servers, "processes": len(procs), "requests": requests, "bursts": bursts,
            "per_request": per_request, "cpu_ms_per_extra_token": extra}


def report(res: dict) -> str:
    lines = [f"{res['api_servers']} API server process(es) ({res['processes']} listening), {res['bursts']} bursts "
             f"of {res['requests']} streamed requests:"]
    for t, r in res["per_request"].items():
        lines.append(f"  max_tokens {t}: {r['cpu_ms']:.3f} CPU ms a request ({r['wall_s']:.1f} s wall)")
    if res["cpu_ms_per_extra_token"] is not None:
        lines.append(f"  one more streamed token: {res['cpu_ms_per_extra_token']:.4f} CPU ms a request")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.http.api_server_cpu", description=__doc__.split("\n\n")[0])
    p.add_argument("--api-servers", type=int, default=1)
    p.add_argument("--requests", type=int, default=128)
    p.add_argument("--tokens", type=int, nargs="+", default=[1, 32])
    p.add_argument("--bursts", type=int, default=4)
    p.add_argument("--url", help="a running server on this machine (default: start the launcher)")
    p.add_argument("--json", type=Path)
    a = p.parse_args(argv)
    for name in ("api_servers", "requests", "bursts"):
        if getattr(a, name) < 1:
            p.error(f"--{name.replace('_', '-')}: 1 or more, not {getattr(a, name)}")
    if min(a.tokens) < 1:
        p.error(f"--tokens: each 1 or more, not {min(a.tokens)}")
    if a.url is not None and urlsplit(a.url).hostname not in ("127.0.0.1", "localhost", "::1"):
        p.error(f"--url: a loopback address (the server's processes are read on this machine), not {a.url}")
    try:
        res = measure(a.api_servers, a.requests, sorted(set(a.tokens)), a.bursts, a.url)
    except (RuntimeError, OSError) as e:  # RuntimeError: an answer not 200 or a bad count; OSError: no connection
        print(f"python -m bench.http.api_server_cpu: {e}", file=sys.stderr)
        return 1
    print(report(res))
    if a.json:
        a.json.write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
