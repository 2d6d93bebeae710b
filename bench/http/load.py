"""Loopback load test: many concurrent clients, a fixed number of requests, every answer checked.

    .venv/bin/python -m bench.http.load --url http://127.0.0.1:8080                 # CI's size
    .venv/bin/python -m bench.http.load --clients 256 --requests 4096 --tokens 64   # starts its own server

Bodies rotate through six kinds: LMI, OpenAI completion and OpenAI chat, each streamed and not;
decoding is greedy with a fixed number of output tokens (EOS ignored). Before the load, each
prompt's non-streamed greedy answer of each API is taken alone; under load every answer,
streamed or not, must equal it: a lost, duplicated or reordered token is a failure, as is any
status other than 200, a stream without its final record, or a transport error.

Reported: requests, failures, p50/p99/max latency, the largest time to first streamed byte, and
the largest queue wait the engine saw (vLLM's request_queue_time histogram: the bound of the
highest bucket that gained a request under this load).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from tools import launcher_process  # starts/stops the launcher; shared with the tests

KINDS = ("lmi", "lmi-stream", "completion", "completion-stream", "chat", "chat-stream")
PROMPTS = ("Deep learning is", "The capital of France", "Once upon a time", "SageMaker scales in",
           "A mixture of experts", "Hopper tensor cores", "def fibonacci(n):", "{\"key\": [1, 2,")


def body(kind: str, prompt: str, tokens: int) -> dict:
    stream = kind.endswith("-stream")
    if kind.startswith("lmi"):
        return {"inputs": prompt, "stream": stream,
                "parameters": {"max_new_tokens": tokens, "do_sample": False, "ignore_eos_token": True}}
    common = {"max_tokens": tokens, "temperature": 0, "ignore_eos": True, "stream": stream}
    if kind.startswith("chat"):
        return {"messages": [{"role": "user", "content": prompt}], **common}
    return {"prompt": prompt, **common}


def answer(kind: str, raw: bytes) -> str:
    """The generated text of a response body; raises ValueError if it is incomplete."""
    if kind in ("lmi", "completion", "chat"):
        doc = json.loads(raw)
        if kind == "lmi":
            return doc["generated_text"]
        choice = doc["choices"][0]
        return choice["text"] if kind == "completion" else choice["message"]["content"]
    if kind == "lmi-stream":
        records = [json.loads(line) for line in raw.split(b"\n") if line]
        last = records[-1] if records else {}
        if last.get("details") is None or last.get("generated_text") is None:
            raise ValueError(f"LMI stream without its final record: {raw[-200:]!r}")
        text = "".join(r["token"]["text"] for r in records)
        if text != last["generated_text"]:
            raise ValueError("LMI stream: the tokens do not add up to generated_text")
        return text
    events = [e for e in raw.split(b"\n\n") if e]
    if not events or events[-1] != b"data: [DONE]":
        raise ValueError(f"SSE stream without [DONE]: {raw[-200:]!r}")
    out = []
    for e in events[:-1]:
        doc = json.loads(e[len(b"data: "):])
        if "error" in doc:
            raise ValueError(f"SSE error event: {doc['error']}")
        for c in doc["choices"]:
            out.append((c.get("text") or "") if kind == "completion-stream" else (c["delta"].get("content") or ""))
    return "".join(out)


def queue_histogram(metrics: str) -> dict[float, float]:
    """vLLM's cumulative request_queue_time buckets: upper bound -> count."""
    out: dict[float, float] = {}
    for line in metrics.splitlines():
        if line.startswith("vllm:request_queue_time_seconds_bucket{"):
            le = line.split('le="', 1)[1].split('"', 1)[0]
            out[float(le)] = out.get(float(le), 0) + float(line.rsplit(" ", 1)[1])
    return out


def largest_bucket_gained(before: dict[float, float], after: dict[float, float]) -> float:
    """The smallest bound that holds every request of the load: the largest queue wait is at most this."""
    total = after.get(float("inf"), 0) - before.get(float("inf"), 0)
    for le in sorted(after):
        if after[le] - before.get(le, 0) >= total:
            return le
    return float("inf")


@dataclass
class Report:
    requests: int = 0
    failures: list[str] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)
    first_bytes: list[float] = field(default_factory=list)
    queue_wait_at_most_s: float = 0.0
    seconds: float = 0.0

    def pct(self, q: float) -> float:
        xs = sorted(self.latencies)
        return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")

    def summary(self) -> dict:
        return {"requests": self.requests, "failures": len(self.failures),
                "p50_s": round(self.pct(0.50), 3), "p99_s": round(self.pct(0.99), 3),
                "max_s": round(max(self.latencies, default=float("nan")), 3),
                "max_first_byte_s": round(max(self.first_bytes, default=float("nan")), 3),
                "queue_wait_at_most_s": self.queue_wait_at_most_s, "wall_s": round(self.seconds, 1),
                "requests_per_s": round(self.requests / self.seconds, 1) if self.seconds else None}


async def _one(client: httpx.AsyncClient, kind: str, prompt: str, tokens: int) -> tuple[bytes, float, float | None]:
    t0 = time.monotonic()
    first = None
    chunks = []
    async with client.stream("POST", "/invocations", json=body(kind, prompt, tokens)) as r:
        async for chunk in r.aiter_raw():
            if first is None:
                first = time.monotonic() - t0
            chunks.append(chunk)
        if r.status_code != 200:
            raise ValueError(f"status {r.status_code}: {b''.join(chunks)[:300]!r}")
    return b"".join(chunks), time.monotonic() - t0, first if kind.endswith("-stream") else None


async def run(url: str, clients: int = 64, requests: int = 384, tokens: int = 16, timeout: float = 300) -> Report:
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(base_url=url, timeout=timeout, limits=limits) as client:
        # the references: each prompt and API alone, not streamed
        want = {}
        for prompt in PROMPTS:
            for kind in ("lmi", "completion", "chat"):
                raw, _, _ = await _one(client, kind, prompt, tokens)
                want[kind, prompt] = answer(kind, raw)
        before = queue_histogram((await client.get("/metrics")).text)
        rep = Report(requests=requests)
        jobs = [(KINDS[i % len(KINDS)], PROMPTS[(i // len(KINDS)) % len(PROMPTS)]) for i in range(requests)]
        next_job = iter(jobs)

        async def worker():
            for kind, prompt in next_job:
                try:
                    raw, latency, first = await _one(client, kind, prompt, tokens)
                    got = answer(kind, raw)
                    ref = want[kind.removesuffix("-stream"), prompt]
                    if got != ref:
                        rep.failures.append(f"{kind} {prompt!r}: {got!r} != alone {ref!r}")
                    rep.latencies.append(latency)
                    if first is not None:
                        rep.first_bytes.append(first)
                except Exception as e:  # noqa: BLE001 -- every failure is counted and reported
                    rep.failures.append(f"{kind} {prompt!r}: {type(e).__name__}: {e}")

        t0 = time.monotonic()
        await asyncio.gather(*(worker() for _ in range(clients)))
        rep.seconds = time.monotonic() - t0
        rep.queue_wait_at_most_s = largest_bucket_gained(before, queue_histogram((await client.get("/metrics")).text))
    return rep


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", help="a running server; default: start the launcher's engine on a free port")
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--requests", type=int, default=384)
    ap.add_argument("--tokens", type=int, default=16)
    args = ap.parse_args()
    srv = None
    if args.url is None:
        srv = launcher_process.start_launcher(Path(tempfile.mkdtemp(prefix="load-")), nice=10)
        args.url = srv.url
    try:
        rep = asyncio.run(run(args.url, args.clients, args.requests, args.tokens))
    finally:
        if srv is not None:
            launcher_process.stop(srv.proc)
    print(json.dumps({"clients": args.clients, "tokens": args.tokens, **rep.summary()}))
    for f in rep.failures[:20]:
        print("FAILED", f, file=sys.stderr)
    return 1 if rep.failures else 0


if __name__ == "__main__":
    sys.exit(main())
