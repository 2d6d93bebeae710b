"""The load every arm gets: an HTTP client (standard library: runs under any Python on the GPU host), numbered
prompts, the measured runs and the unmeasured warm-up pass.

No prompt reaches a server twice. Every request carries a prompt number no earlier request to that server carried,
so a measured request's prefill is never a prefix-cache hit (vLLM's prefix cache and SGLang's radix cache are both
on by default, and SGLang extends a fully cached prompt by one token without a CUDA graph). The numbers depend only
on the phase (warm-up, repetition r, profile) and the position in it, so every arm of a repetition gets the same
prompts.

A workload shape (Shape, SHAPES) sets the prompt and output lengths: "default" (--in-tokens and --out-tokens for
every request) and the shapes deployments run: long prompts, mixed lengths, a decode-heavy shape, and a burst of
BURST_PROMPTS requests at once. A shape's lengths are drawn per prompt number from a seed of its own, so every arm
gets the same lengths and prompts, and no shape's prompt is another's (each draws its tokens from its own seed)."""
from __future__ import annotations

import http.client
import json
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

THROUGHPUT_CONCURRENCY = (1, 8, 32, 128)
LATENCY_CONCURRENCY = (1, 8, 32)
# Each phase numbers its prompts from its own multiple of PHASE_PROMPTS, far more than a phase sends: the warm-up
# from 0, repetition r from (r + 1) * PHASE_PROMPTS, the profiles after the last repetition's.
PHASE_PROMPTS = 1_000_000
# A burst: this many streamed requests released at the same instant, one each, measured as one run.
BURST_PROMPTS = 128


@dataclass(frozen=True)
class Shape:
    """A workload's lengths: each request's prompt and output tokens drawn uniformly from [lo, hi] (seeded by the
    shape's name and the prompt number), or, with burst, BURST_PROMPTS requests sent at once instead of the sweep."""
    name: str
    prompt: tuple[int, int]
    out: tuple[int, int]
    burst: bool = False
    what: str = ""

    def lengths(self, k: int) -> tuple[int, int]:
        """Prompt k's (prompt tokens, output tokens); the same for every arm and every run."""
        if self.prompt[0] == self.prompt[1] and self.out[0] == self.out[1]:
            return self.prompt[0], self.out[0]
        rng = random.Random(f"{self.name}/lengths/{k}")
        return rng.randint(*self.prompt), rng.randint(*self.out)

    @property
    def longest(self) -> int:
        """The longest sequence a request of this shape has: its longest prompt and its longest output."""
        return self.prompt[1] + self.out[1]

    def record(self) -> dict:
        """The shape as e2e.json keeps it beside its results."""
        return {"name": self.name, "prompt_tokens": list(self.prompt), "output_tokens": list(self.out),
                "burst": self.burst, "what": self.what}


def shapes(in_tokens: int, out_tokens: int) -> dict[str, Shape]:
    """Every workload shape by its --workload name; "default" and "burst" take --in-tokens and --out-tokens."""
    return {s.name: s for s in (
        Shape("default", (in_tokens, in_tokens), (out_tokens, out_tokens), what="every request the same lengths"),
        # up to 3,904: with 128 output tokens and 64 to spare, the shards' 4,096 positions
        Shape("long", (2048, 3904), (128, 128), what="long prompts, 2-4k tokens"),
        Shape("mixed", (256, 1792), (64, 448), what="prompts of 1,024 tokens and outputs of 256 on average, each "
                                                    "drawn from ±75% around its mean"),
        Shape("decode-heavy", (128, 128), (1024, 1024), what="short prompts, long outputs"),
        Shape("burst", (in_tokens, in_tokens), (out_tokens, out_tokens), burst=True,
              what=f"{BURST_PROMPTS} streamed requests released at once"),
    )}


WORKLOADS = tuple(shapes(1, 1))  # the names, in the order the report shows them


def repetition_start(rep: int) -> int:
    """The first prompt number of measured repetition `rep` (0-based)."""
    return (rep + 1) * PHASE_PROMPTS


def repetition_order(arms: list[str], rep: int) -> list[str]:
    """The order repetition `rep` (0-based) measures the arms in: as given in even repetitions, the other way round
    in odd ones, so that no arm always runs first, or always right after the same other arm's load."""
    return list(arms) if rep % 2 == 0 else list(arms)[::-1]


def _request(host: str, method: str, path: str, body: dict | None = None, timeout: float = 600,
             headers: dict[str, str] | None = None):
    conn = http.client.HTTPConnection(host, timeout=timeout)
    conn.request(method, path, body=json.dumps(body) if body is not None else None,
                 headers={"Content-Type": "application/json", **(headers or {})})
    return conn, conn.getresponse()


def request_ok(host: str, method: str, path: str, body: dict | None = None, timeout: float = 600,
               headers: dict[str, str] | None = None) -> bytes:
    """One request (with `headers` besides its content type); its answer's bytes, RuntimeError unless 200."""
    conn, r = _request(host, method, path, body, timeout, headers)
    try:
        data = r.read()
        if r.status != 200:
            raise RuntimeError(f"{method} {path} -> {r.status}: {data[:300]!r}")
        return data
    finally:
        conn.close()


def request_json(host: str, method: str, path: str, body: dict | None = None, timeout: float = 600,
                 headers: dict[str, str] | None = None) -> dict:
    """One request; its JSON answer ({} when empty), RuntimeError unless 200."""
    data = request_ok(host, method, path, body, timeout, headers)
    return json.loads(data) if data else {}


def _metrics(host: str) -> str | None:
    """The server's /metrics text; None where it does not answer it (SGLang without --enable-metrics)."""
    try:
        return request_ok(host, "GET", "/metrics", timeout=60).decode()
    except (OSError, http.client.HTTPException, RuntimeError):  # RuntimeError: not 200
        return None


def _summed(text: str, names: dict[str, str], cast=float) -> dict:
    """{key: the sum over label sets of each metric named in `names` (key -> metric name)}, keys found only."""
    out: dict = {}
    for ln in text.splitlines():
        for key, name in names.items():
            if ln.startswith(name) and ln[len(name):len(name) + 1] in ("{", " "):
                out[key] = out.get(key, 0) + cast(float(ln.rsplit(" ", 1)[1]))
    return out


def prefix_cache_tokens(host: str) -> dict | None:
    """vLLM's prefix-cache counters from /metrics: {"queries": tokens looked up, "hits": tokens found}; None where
    the server exports neither (SGLang without --enable-metrics) or does not answer."""
    text = _metrics(host)
    counts = _summed(text, {k: f"vllm:prefix_cache_{k}_total" for k in ("queries", "hits")}, int) if text else {}
    return counts or None


# vLLM's request histograms that split a time to first token on the server: from the request's arrival (the HTTP
# body parsed, the serving layer starting to render and tokenize its prompt: vLLM 0.32's renderers set arrival_time
# there) to its first token reaching the output processor, its wait in the scheduler's queue, and its prefill (first
# scheduled to first token). The client's TTFT less the first is the HTTP path both ways, the request's wait for the
# API server's event loop included.
SERVER_PHASES = {"ttft": "vllm:time_to_first_token_seconds", "queue": "vllm:request_queue_time_seconds",
                 "prefill": "vllm:request_prefill_time_seconds"}


def server_phases(host: str) -> dict | None:
    """The running sums and counts of SERVER_PHASES' histograms; None for a server without them (SGLang)."""
    text = _metrics(host)
    if text is None:
        return None
    sums = _summed(text, {f"{k}_sum": f"{v}_sum" for k, v in SERVER_PHASES.items()}
                   | {f"{k}_count": f"{v}_count" for k, v in SERVER_PHASES.items()})
    return sums if len(sums) == 2 * len(SERVER_PHASES) else None


def phases_between(before: dict | None, after: dict | None) -> dict | None:
    """The mean of each server phase, in ms, over the requests that finished it between two server_phases()
    readings, and how many did; None unless both readings exist."""
    if before is None or after is None:
        return None
    out: dict = {"requests": int(after["ttft_count"] - before["ttft_count"])}
    for k in SERVER_PHASES:
        n = after[f"{k}_count"] - before[f"{k}_count"]
        out[f"{k}_ms"] = 1e3 * (after[f"{k}_sum"] - before[f"{k}_sum"]) / n if n else None
    return out


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
    """One streamed completion: time to first token, the gaps between streamed chunks, tokens.

    A chunk counts when it carries a choice, with text or without, as vLLM's own client (`vllm bench serve`) counts
    them: a token whose text is held back (an incomplete UTF-8 sequence, frequent with a random-weight model's
    tokens) still arrives in a chunk of its own from vLLM. `ttft_text` is the time to the first chunk with text, the
    bench's time to first token up to run 19."""
    t0 = time.perf_counter()
    conn, r = _request(host, "POST", "/v1/completions", body)
    times, first_text, tokens = [], None, 0
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
            if ev.get("choices"):
                times.append(time.perf_counter())
                if first_text is None and ev["choices"][0].get("text"):
                    first_text = times[-1]
            if ev.get("usage"):
                tokens = ev["usage"]["completion_tokens"]
    finally:
        conn.close()
    if first_text is None:
        raise RuntimeError("stream carried no text")
    return {"ttft": times[0] - t0, "ttft_text": first_text - t0, "gaps": [b - a for a, b in zip(times, times[1:])],
            "tokens": tokens}


def requests_for(concurrency: int, waves: int) -> int:
    """How many requests a measured run sends: `waves` per client, at least 4."""
    return max(4, concurrency * waves)


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q / 100 * (len(xs) - 1))))]


class Workload:
    """Numbered prompts (random token ids of a fixed length; prompt k is the same for every arm and every run) and
    the measured runs, each given the first prompt number it may use."""

    def __init__(self, model_id: str, in_tokens: int, out_tokens: int, vocab: int, seed: int | str = 0,
                 shape: Shape | None = None):
        self.model_id, self.in_tokens, self.out, self.vocab, self.seed = model_id, in_tokens, out_tokens, vocab, seed
        self.shape = shape or Shape("default", (in_tokens, in_tokens), (out_tokens, out_tokens))

    @classmethod
    def of(cls, model_id: str, shape: Shape, vocab: int) -> "Workload":
        """The workload of `shape`: the default shape's prompts are seed 0's, each other shape's its name's."""
        seed = 0 if shape.name == "default" else shape.name
        return cls(model_id, shape.prompt[0], shape.out[0], vocab, seed, shape)

    def lengths(self, k: int) -> tuple[int, int]:
        """Prompt k's prompt and output tokens: the shape's, or in_tokens and out_tokens where the shape is fixed
        (a profile window's shorter outputs)."""
        fixed = self.shape.prompt[0] == self.shape.prompt[1] and self.shape.out[0] == self.shape.out[1]
        return (self.in_tokens, self.out) if fixed else self.shape.lengths(k)

    def prompt(self, k: int) -> list[int]:
        rng = random.Random(f"{self.seed}/{k}")
        # ids above the 256 byte tokens and the special tokens, below the vocabulary size
        return [rng.randrange(300, self.vocab) for _ in range(self.lengths(k)[0])]

    def bodies(self, first: int, n: int, stream: bool) -> list[dict]:
        return [completion_body(self.model_id, self.prompt(k), self.lengths(k)[1], stream)
                for k in range(first, first + n)]

    def closed_loop(self, send, concurrency: int, waves: int, first: int, stream: bool) -> tuple[list, float]:
        """`concurrency` clients, each sending its next request once its last is answered, over the run's prompts:
        each request's `send(body)` and the run's wall time in seconds."""
        bodies = self.bodies(first, requests_for(concurrency, waves), stream)
        t0 = time.perf_counter()
        with ThreadPoolExecutor(concurrency) as pool:
            answers = list(pool.map(send, bodies))
        return answers, time.perf_counter() - t0

    def throughput(self, host: str, concurrency: int, waves: int, first: int) -> dict:
        counts, wall = self.closed_loop(lambda b: completion(host, b), concurrency, waves, first, False)
        tokens = sum(counts)
        return {"requests": len(counts), "tokens": tokens, "wall_s": wall, "tok_s": tokens / wall}

    def latency(self, host: str, concurrency: int, waves: int, first: int) -> dict:
        runs, wall = self.closed_loop(lambda b: streamed(host, b), concurrency, waves, first, True)
        return latency_figures(runs, wall)

    def burst(self, host: str, first: int, n: int = BURST_PROMPTS) -> dict:
        """n streamed requests, one per client, released together (a barrier): the streamed figures of
        latency_figures, and the time until the last request's last token."""
        gate = threading.Barrier(n)

        def send(body: dict) -> tuple[dict, float]:
            gate.wait()
            r = streamed(host, body)
            return r, time.perf_counter()

        bodies = self.bodies(first, n, True)
        t0 = time.perf_counter()
        with ThreadPoolExecutor(n) as pool:
            answers = list(pool.map(send, bodies))
        last = max(done for _, done in answers)
        runs = [r for r, _ in answers]
        return {**latency_figures(runs, last - t0), "last_done_s": last - t0}


def latency_figures(runs: list[dict], wall: float) -> dict:
    """The figures of streamed requests (streamed()'s answers) that took `wall` seconds together."""
    n = len(runs)
    ttft = [r["ttft"] for r in runs]
    ttft_text = [r["ttft_text"] for r in runs]
    itl = [g for r in runs for g in r["gaps"]]
    # the inter-token tail in more detail than the report's p99 (e2e.json only): where it starts, how long the
    # longest gaps are, and how many gaps are more than twice the median
    p50 = _pct(itl, 50)
    # output tokens/s of these streamed requests: the throughput runs' figure, streamed, as vLLM's client and
    # most chat clients request
    return {"requests": n, "stream_tok_s": sum(r["tokens"] for r in runs) / wall,
            "ttft_p50_ms": 1e3 * _pct(ttft, 50), "ttft_p99_ms": 1e3 * _pct(ttft, 99),
            "ttft_text_p50_ms": 1e3 * _pct(ttft_text, 50),
            "itl_p50_ms": 1e3 * p50, "itl_p99_ms": 1e3 * _pct(itl, 99), "itl_p90_ms": 1e3 * _pct(itl, 90),
            "itl_p999_ms": 1e3 * _pct(itl, 99.9), "itl_max_ms": 1e3 * max(itl), "itl_gaps": len(itl),
            "itl_over_2x_median": sum(g > 2 * p50 for g in itl)}


def sweep(wl: Workload, host: str, waves: int, clients=None, first: int = 0) -> dict:
    """One measured run: throughput and streamed latency at each concurrency (those in `clients` only), on the
    prompts numbered from `first` on, all within first's phase."""
    keep = set(clients or THROUGHPUT_CONCURRENCY + LATENCY_CONCURRENCY)
    phase, k = first // PHASE_PROMPTS, first
    phases = server_phases(host)  # read between the timed runs: a run's split is the change across it
    if wl.shape.burst:  # the burst is its one run, whatever the concurrencies
        out = {"burst": {str(BURST_PROMPTS): wl.burst(host, k)}, "workload": wl.shape.name}
        out["burst"][str(BURST_PROMPTS)]["server"] = phases_between(phases, server_phases(host))
        return out
    out = {"throughput": {}, "latency": {}, "workload": wl.shape.name}
    for kind, concurrencies, measure in (("throughput", THROUGHPUT_CONCURRENCY, wl.throughput),
                                         ("latency", LATENCY_CONCURRENCY, wl.latency)):
        for c in concurrencies:
            if c in keep:
                out[kind][str(c)] = measure(host, c, waves, k)
                if phases is not None:
                    after = server_phases(host)
                    out[kind][str(c)]["server"] = phases_between(phases, after)
                    phases = after
                k += requests_for(c, waves)
    assert k < (phase + 1) * PHASE_PROMPTS
    return out


def first_pass(wl: Workload, host: str, first: int = 0) -> dict:
    """Unmeasured warm-up on the prompts numbered from `first` on, recording the first request's time to first
    token at each new concurrency."""
    firsts = {}
    k = first
    for c in sorted(set(THROUGHPUT_CONCURRENCY) | set(LATENCY_CONCURRENCY)):
        t0 = time.perf_counter()
        with ThreadPoolExecutor(c) as pool:
            results = [r["ttft"] for r in pool.map(lambda b: streamed(host, b), wl.bodies(k, c, True))]
        firsts[str(c)] = {"first_ttft_ms": 1e3 * min(results), "max_ttft_ms": 1e3 * max(results),
                          "wall_s": time.perf_counter() - t0}
        k += c
    if wl.shape.burst:
        wl.burst(host, k)  # one unmeasured burst: what it compiles or captures first is not in the measured one
    else:
        sweep(wl, host, 1, first=k)
    return firsts
