"""What the container's ASGI middleware (serving.lmi.middleware.LMIMiddleware) adds to vLLM's OpenAI routes under a
burst of streamed requests, in-process, against the same ASGI app without it.

    .venv/bin/python -m bench.http.middleware_overhead [--requests 128] [--chunks 128] [--reps 20] [--json FILE]

The app behind the middleware reads each request's body and streams `--chunks` server-sent-event chunks, as vLLM's
completion route streams tokens, with no engine: the time left is the middleware's own (its drain tracking, the
bounded body read, the guarded sends) beside the event loop's. Each repetition serves `--requests` requests at once,
the bare app and the wrapped one alternately. Prints the median time of a burst for each, the difference per request
and per chunk; with --json writes them with every repetition. It runs no network and no GPU, so its figures are this
machine's Python, not a deployment's.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from pathlib import Path

from serving.lmi.middleware import LMIMiddleware

CHUNK = b'data: {"choices":[{"text":" token"}]}\n\n'


def streaming_app(chunks: int):
    """An ASGI app that reads the body and streams `chunks` chunks, then ends the response."""
    async def app(scope, receive, send):
        if scope["type"] != "http":
            return
        while (await receive()).get("more_body"):
            pass
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream")]})
        for _ in range(chunks):
            await send({"type": "http.response.body", "body": CHUNK, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})
    return app


async def serve(app, body: bytes) -> int:
    """One POST /v1/completions through `app`; returns the number of body chunks the client got."""
    scope = {"type": "http", "path": "/v1/completions", "method": "POST", "http_version": "1.1",
             "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]}
    messages = iter([{"type": "http.request", "body": body, "more_body": False}])
    got = {"chunks": 0, "ended": False}

    async def receive():
        return next(messages, {"type": "http.disconnect"})

    async def send(message):
        if message["type"] == "http.response.body":
            got["chunks"] += bool(message.get("body"))
            got["ended"] = not message.get("more_body", False)

    await app(scope, receive, send)
    assert got["ended"], "a response did not end"
    return got["chunks"]


async def burst(app, requests: int, chunks: int) -> float:
    body = json.dumps({"model": "m", "prompt": "hello", "stream": True, "max_tokens": chunks}).encode()
    t0 = time.perf_counter()
    served = await asyncio.gather(*(serve(app, body) for _ in range(requests)))
    elapsed = time.perf_counter() - t0
    assert served == [chunks] * requests, f"chunks served: {sorted(set(served))}, expected {chunks} each"
    return elapsed


async def measure(requests: int, chunks: int, reps: int) -> dict:
    bare = streaming_app(chunks)
    arms = {"bare": bare, "middleware": LMIMiddleware(bare)}
    times: dict[str, list[float]] = {arm: [] for arm in arms}
    for rep in range(reps):  # alternate the order, so drift and warm-up fall on both
        for arm in (("bare", "middleware") if rep % 2 == 0 else ("middleware", "bare")):
            times[arm].append(await burst(arms[arm], requests, chunks))
    median = {arm: statistics.median(t) for arm, t in times.items()}
    extra = median["middleware"] - median["bare"]
    return {"requests": requests, "chunks": chunks, "reps": reps, "seconds": times,
            "median_ms": {arm: m * 1e3 for arm, m in median.items()},
            "extra_ms_per_burst": extra * 1e3, "extra_us_per_request": extra / requests * 1e6,
            "extra_us_per_chunk": extra / (requests * chunks) * 1e6}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--requests", type=int, default=128, help="requests served at once in a burst (default 128)")
    p.add_argument("--chunks", type=int, default=128, help="streamed chunks a response (default 128)")
    p.add_argument("--reps", type=int, default=20, help="bursts per arm, alternating (default 20)")
    p.add_argument("--json", type=Path, help="write the figures and every repetition here")
    a = p.parse_args()
    for name in ("requests", "chunks", "reps"):
        if getattr(a, name) < 1:
            p.error(f"--{name}: 1 or more, not {getattr(a, name)}")
    r = asyncio.run(measure(a.requests, a.chunks, a.reps))
    print(f"{a.requests} requests x {a.chunks} chunks, median of {a.reps} bursts: bare {r['median_ms']['bare']:.2f} ms,"
          f" middleware {r['median_ms']['middleware']:.2f} ms; {r['extra_ms_per_burst']:.2f} ms more a burst, "
          f"{r['extra_us_per_request']:.1f} us a request, {r['extra_us_per_chunk']:.3f} us a chunk")
    if a.json:
        a.json.write_text(json.dumps(r, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
