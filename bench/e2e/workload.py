"""The load every arm gets: an HTTP client (standard library: runs under any Python on the GPU host), fixed
prompts, the measured runs and the unmeasured warm-up pass."""
from __future__ import annotations

import http.client
import json
import random
import time
from concurrent.futures import ThreadPoolExecutor

THROUGHPUT_CONCURRENCY = (1, 8, 32, 128)
LATENCY_CONCURRENCY = (1, 32)


def _request(host: str, method: str, path: str, body: dict | None = None, timeout: float = 600):
    conn = http.client.HTTPConnection(host, timeout=timeout)
    conn.request(method, path, body=json.dumps(body) if body is not None else None,
                 headers={"Content-Type": "application/json"})
    return conn, conn.getresponse()


def request_json(host: str, method: str, path: str, body: dict | None = None, timeout: float = 600) -> dict:
    """One request; its JSON answer ({} when empty), RuntimeError unless 200."""
    conn, r = _request(host, method, path, body, timeout)
    try:
        data = r.read()
        if r.status != 200:
            raise RuntimeError(f"{method} {path} -> {r.status}: {data[:300]!r}")
        return json.loads(data) if data else {}
    finally:
        conn.close()


def completion_body(model_id: str, prompt: list[int], out_tokens: int, stream: bool) -> dict:
    b = {"model": model_id, "prompt": prompt, "max_tokens": out_tokens, "min_tokens": out_tokens,
         "ignore_eos": True, "temperature": 0.0}
    if stream:
        b.update(stream=True, stream_options={"include_usage": True})
    return b


def completion(host: str, body: dict) -> int:
    """One non-streamed completion; returns the output token count."""
    return request_json(host, "POST", "/v1/completions", body)["usage"]["completion_tokens"]


def streamed(host: str, body: dict) -> dict:
    """One streamed completion: time to first token, the gaps between streamed chunks, tokens."""
    t0 = time.perf_counter()
    conn, r = _request(host, "POST", "/v1/completions", body)
    times, tokens = [], 0
    try:
        if r.status != 200:
            raise RuntimeError(f"stream -> {r.status}: {r.read()[:300]!r}")
        while True:
            line = r.readline()
            if not line:
                break
            if not line.startswith(b"data: ") or line.strip() == b"data: [DONE]":
                continue
            ev = json.loads(line[6:])
            if ev.get("choices") and ev["choices"][0].get("text"):
                times.append(time.perf_counter())
            if ev.get("usage"):
                tokens = ev["usage"]["completion_tokens"]
    finally:
        conn.close()
    if not times:
        raise RuntimeError("stream carried no token")
    return {"ttft": times[0] - t0, "gaps": [b - a for a, b in zip(times, times[1:])], "tokens": tokens}


def requests_for(concurrency: int, waves: int) -> int:
    """How many requests a measured run sends: `waves` per client, at least 4."""
    return max(4, concurrency * waves)


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q / 100 * (len(xs) - 1))))]


class Workload:
    """Fixed prompts (random token ids of a fixed length, seeded) shared by every arm."""

    def __init__(self, model_id: str, in_tokens: int, out_tokens: int, vocab: int, seed: int = 0):
        rng = random.Random(seed)
        self.model_id, self.out = model_id, out_tokens
        # ids above the 256 byte tokens and the special tokens, below the vocabulary size
        self.prompts = [[rng.randrange(300, vocab) for _ in range(in_tokens)] for _ in range(512)]

    def throughput(self, host: str, concurrency: int, waves: int) -> dict:
        n = requests_for(concurrency, waves)
        bodies = [completion_body(self.model_id, self.prompts[i % len(self.prompts)], self.out, False)
                  for i in range(n)]
        t0 = time.perf_counter()
        with ThreadPoolExecutor(concurrency) as pool:
            tokens = sum(pool.map(lambda b: completion(host, b), bodies))
        wall = time.perf_counter() - t0
        return {"requests": n, "tokens": tokens, "wall_s": wall, "tok_s": tokens / wall}

    def latency(self, host: str, concurrency: int, waves: int) -> dict:
        n = requests_for(concurrency, waves)
        bodies = [completion_body(self.model_id, self.prompts[i % len(self.prompts)], self.out, True)
                  for i in range(n)]
        with ThreadPoolExecutor(concurrency) as pool:
            runs = list(pool.map(lambda b: streamed(host, b), bodies))
        ttft = [r["ttft"] for r in runs]
        itl = [g for r in runs for g in r["gaps"]]
        return {"requests": n, "ttft_p50_ms": 1e3 * _pct(ttft, 50), "ttft_p99_ms": 1e3 * _pct(ttft, 99),
                "itl_p50_ms": 1e3 * _pct(itl, 50), "itl_p99_ms": 1e3 * _pct(itl, 99)}


def sweep(wl: Workload, host: str, waves: int, clients=None) -> dict:
    """One measured run: throughput and streamed latency at each concurrency (those in `clients` only)."""
    keep = set(clients or THROUGHPUT_CONCURRENCY + LATENCY_CONCURRENCY)
    return {"throughput": {str(c): wl.throughput(host, c, waves) for c in THROUGHPUT_CONCURRENCY if c in keep},
            "latency": {str(c): wl.latency(host, c, waves) for c in LATENCY_CONCURRENCY if c in keep}}


def first_pass(wl: Workload, host: str) -> dict:
    """Unmeasured warm-up, recording the first request's time to first token at each new concurrency."""
    firsts = {}
    for c in sorted(set(THROUGHPUT_CONCURRENCY) | set(LATENCY_CONCURRENCY)):
        t0 = time.perf_counter()
        with ThreadPoolExecutor(c) as pool:
            results = list(pool.map(
                lambda i: streamed(host, completion_body(wl.model_id, wl.prompts[i], wl.out, True))["ttft"],
                range(c)))
        firsts[str(c)] = {"first_ttft_ms": 1e3 * min(results), "max_ttft_ms": 1e3 * max(results),
                          "wall_s": time.perf_counter() - t0}
    sweep(wl, host, 1)
    return firsts
