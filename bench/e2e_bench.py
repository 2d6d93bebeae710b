"""The image against stock vLLM 0.32.0 in the real engine, side by side on one GPU.

    python -m bench.e2e_bench --stock-site DIR --image-python PY --models-dir DIR --out DIR [--reps 3] [--profile]
        [--layers N [MODEL=N ...]]   # e.g. --layers 94 qwen3-coder-480b-tp8-tensor=40 (run 9: deployment depth)

Every arm is an HTTP server on loopback: "image" is this project's launcher (./entrypoint.sh serve:
the patched vLLM, configs/, the image's settings); "stock" is vLLM's own OpenAI server from the
pristine wheel (DIR first on PYTHONPATH: its own configs, no series, vLLM's defaults). One model
at a time: its arms start at once from empty caches (each its own HOME, vLLM, Triton and
FlashInfer cache), so their start times are side by side under the same load; once all are up,
the arms are measured in turn (stock, image, stock, image, ...) after one unmeasured warm-up pass
each; then the model's servers are stopped and the next model starts.

Per arm and repetition:
- output tokens/s with 1, 8, 32 and 128 concurrent clients (non-streamed OpenAI completions,
  fixed prompt and output lengths, ignore_eos), the server's max-num-seqs 128;
- time to first token and inter-token latency, p50 and p99, streamed, 1 and 32 clients;
and per server: time from start to the first /ping 200, the first request's time to first token,
the time to first token of the first request at each new concurrency (the warm-up pass), and
the count of vLLM's "JIT compilation during inference" warnings. With --profile, a torch-profiler
trace of a short run at 1 and 32 clients gives each arm's GPU time by kernel class.

Both arms take OpenAI bodies on /v1/completions (stock vLLM has no LMI bodies); what LMI bodies
cost on top is measured by bench/lmi_vs_openai.py. Results: OUT/e2e.json and OUT/e2e.md.
"""
from __future__ import annotations

import argparse
import gzip
import http.client
import json
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path

from serving.paths import ROOT
from tools.launcher_process import free_port, stop

JIT_WARNING = "JIT compilation during inference"
THROUGHPUT_CONCURRENCY = (1, 8, 32, 128)
LATENCY_CONCURRENCY = (1, 32)
MAX_NUM_SEQS = 128
# Decoder layers of every model unless --layers says otherwise. At 16 a one-client decode step is host-bound on
# the H200 hosts (inter-token 1.7-2.3 ms against 1.1-1.6 ms of GPU work per step, runs 5-8), so deeper models
# (run 9) measure what the kernels give a full-depth deployment.
DEFAULT_LAYERS = 16


@dataclass(frozen=True)
class Model:
    """One benchmark model: a serving.tiny_model preset in one FP8 scheme, the arms that serve it, and
    engine arguments every arm of it gets (flag without its leading dashes -> value)."""
    name: str
    preset: str
    fp8: str
    arms: tuple[str, ...] = ("stock", "image")
    engine_args: tuple[tuple[str, str], ...] = ()
    layers: int = DEFAULT_LAYERS


def with_layers(m: Model, layers: int) -> Model:
    """The model at `layers` decoder layers. Away from the default depth the name says it (qwen3-235b-tp8-tensor@94L),
    so that its figures, servers and folder never mix with another depth's (runs 3-8 keep their plain names)."""
    if layers == DEFAULT_LAYERS:
        return m
    return replace(m, name=f"{m.name}@{layers}L", layers=layers)


def parse_layers(tokens: list[str], models: list[str]) -> dict[str, int]:
    """--layers N [MODEL=N ...]: one depth for every model, then per-model depths. Raises ValueError naming the
    token that is neither."""
    depth = dict.fromkeys(models, DEFAULT_LAYERS)
    for tok in tokens:
        name, _, n = tok.rpartition("=")
        if name and name not in depth:
            raise ValueError(f"--layers {tok}: {name!r} is not among --models ({', '.join(models)})")
        if not n.isdigit() or int(n) < 1:
            raise ValueError(f"--layers {tok}: the depth must be a whole number of layers, 1 or more")
        for m in ([name] if name else models):
            depth[m] = int(n)
    return depth


# Arms: "stock" and "image" (above), and image arms that differ from "image" by one setting each
# (IMAGE_ARM_OPTIONS), so image against them is one patch alone: "image-stock-order" (vLLM's own FP8 MoE
# backend order: patch 0001), "image-vllm-quant" (vLLM's two-kernel FP8 quantization of the MoE inputs:
# patch 0006), "image-vllm-topk" (vLLM's topk_softmax op for the router: patch 0007). Not measured, started for what their logs say: "stock-debug" (stock at
# VLLM_LOGGING_LEVEL=DEBUG: why each MoE backend ahead of the chosen one was rejected) and
# "stock-no-nvcc" (stock with nvcc off PATH and CUDA_HOME, as in the image's runtime base: what
# FlashInfer's JIT does there). A static-scale stock start compiles FlashInfer's fused_moe_90 for
# over 12 minutes (H200 run 2): give that model --ready-timeout 1800.
IMAGE_ARM_OPTIONS = {
    "image": {},
    "image-stock-order": {"OPTION_FP8_MOE_STOCK_ORDER": "true"},
    "image-vllm-quant": {"OPTION_FP8_MOE_ONE_LAUNCH_QUANT": "false"},
    "image-vllm-topk": {"OPTION_MOE_ONE_PASS_TOPK": "false"},
}
MEASURED_ARMS = ("stock", "image", "image-stock-order", "image-vllm-quant", "image-vllm-topk")
# Block FP8: the linear layers on vLLM's prebuilt CUTLASS block-scaled kernel in both arms, so that only the MoE
# path differs. vLLM's default there is FlashInfer's DeepGEMM kernel, which the image builds with nvcc at start and
# stock follows with DeepGEMM's JIT warm-up of 512 shapes (H200 run 2: 42-48 minutes by its own estimate), beyond
# one session's device time.
BLOCK_FP8_ENGINE_ARGS = (("linear-backend", "cutlass"),)
MODELS = (
    Model("qwen3-235b-tp8-tensor", "qwen3-235b-a22b-tp8", "tensor",
          ("stock", "image", "image-vllm-quant", "image-vllm-topk", "stock-debug")),
    # Static activation scales: the only per-tensor checkpoints FlashInfer CUTLASS MoE accepts, so
    # the one case where the routing patch changes stock's backend.
    Model("qwen3-235b-tp8-static", "qwen3-235b-a22b-tp8", "static",
          ("stock", "image", "image-stock-order", "stock-no-nvcc")),
    Model("deepseek-v3-tp8-block", "deepseek-v3-tp8", "block", engine_args=BLOCK_FP8_ENGINE_ARGS),
    Model("qwen3-coder-480b-tp8-tensor", "qwen3-coder-480b-a35b-tp8", "tensor",
          ("stock", "image", "image-vllm-quant", "image-vllm-topk")),
    # The official block-FP8 checkpoints as vLLM's recipes deploy them: one expert-parallel rank, or one TP4 rank.
    Model("qwen3-235b-ep8-block", "qwen3-235b-a22b-ep8", "block", engine_args=BLOCK_FP8_ENGINE_ARGS),
    Model("qwen3-coder-480b-ep8-block", "qwen3-coder-480b-a35b-ep8", "block", engine_args=BLOCK_FP8_ENGINE_ARGS),
    Model("deepseek-v3-ep8-block", "deepseek-v3-ep8", "block", engine_args=BLOCK_FP8_ENGINE_ARGS),
    Model("qwen3-235b-tp4-block", "qwen3-235b-a22b-tp4", "block", engine_args=BLOCK_FP8_ENGINE_ARGS),
    Model("qwen3-coder-480b-tp4-block", "qwen3-coder-480b-a35b-tp4", "block", engine_args=BLOCK_FP8_ENGINE_ARGS),
)
# The embedded bf16 tiny model: a check of this script itself on the CPU engine (--models tiny-cpu).
CPU_CHECK = Model("tiny-cpu", "", "")


@dataclass
class Server:
    name: str
    model: Model
    arm: str
    port: int
    proc: subprocess.Popen
    log_path: Path
    started: float
    ready_s: float | None = None
    failed: str | None = None
    facts: dict = field(default_factory=dict)

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


# --- HTTP client (stdlib: runs under any Python on the GPU host) ---------------------------------

def _request(host: str, method: str, path: str, body: dict | None = None, timeout: float = 600):
    conn = http.client.HTTPConnection(host, timeout=timeout)
    conn.request(method, path, body=json.dumps(body) if body is not None else None,
                 headers={"Content-Type": "application/json"})
    return conn, conn.getresponse()


def _json(host: str, method: str, path: str, body: dict | None = None, timeout: float = 600) -> dict:
    conn, r = _request(host, method, path, body, timeout)
    try:
        data = r.read()
        if r.status != 200:
            raise RuntimeError(f"{method} {path} -> {r.status}: {data[:300]!r}")
        return json.loads(data) if data else {}
    finally:
        conn.close()


def _body(model_id: str, prompt: list[int], out_tokens: int, stream: bool) -> dict:
    b = {"model": model_id, "prompt": prompt, "max_tokens": out_tokens, "min_tokens": out_tokens,
         "ignore_eos": True, "temperature": 0.0}
    if stream:
        b.update(stream=True, stream_options={"include_usage": True})
    return b


def completion(host: str, body: dict) -> int:
    """One non-streamed completion; returns the output token count."""
    return _json(host, "POST", "/v1/completions", body)["usage"]["completion_tokens"]


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
        bodies = [_body(self.model_id, self.prompts[i % len(self.prompts)], self.out, False) for i in range(n)]
        t0 = time.perf_counter()
        with ThreadPoolExecutor(concurrency) as pool:
            tokens = sum(pool.map(lambda b: completion(host, b), bodies))
        wall = time.perf_counter() - t0
        return {"requests": n, "tokens": tokens, "wall_s": wall, "tok_s": tokens / wall}

    def latency(self, host: str, concurrency: int, waves: int) -> dict:
        n = requests_for(concurrency, waves)
        bodies = [_body(self.model_id, self.prompts[i % len(self.prompts)], self.out, True) for i in range(n)]
        with ThreadPoolExecutor(concurrency) as pool:
            runs = list(pool.map(lambda b: streamed(host, b), bodies))
        ttft = [r["ttft"] for r in runs]
        itl = [g for r in runs for g in r["gaps"]]
        return {"requests": n, "ttft_p50_ms": 1e3 * _pct(ttft, 50), "ttft_p99_ms": 1e3 * _pct(ttft, 99),
                "itl_p50_ms": 1e3 * _pct(itl, 50), "itl_p99_ms": 1e3 * _pct(itl, 99)}


# --- servers -------------------------------------------------------------------------------------

def _cold_env(base: dict, home: Path) -> dict:
    """Every cache of this server under its own empty folder: a cold start, as on a fresh host."""
    home.mkdir(parents=True, exist_ok=True)
    env = dict(base)
    env.update(HOME=str(home), XDG_CACHE_HOME=str(home / ".cache"), VLLM_CACHE_ROOT=str(home / ".cache/vllm"),
               TRITON_CACHE_DIR=str(home / ".cache/triton"), FLASHINFER_WORKSPACE_BASE=str(home),
               TORCHINDUCTOR_CACHE_DIR=str(home / ".cache/inductor"))
    for k in ("VLLM_TUNED_CONFIG_FOLDER", "LMI_FP8_MOE_STOCK_ORDER", "LMI_FP8_MOE_ONE_LAUNCH_QUANT",
              "LMI_MOE_ONE_PASS_TOPK", "VLLM_USE_FLASHINFER_SAMPLER"):
        env.pop(k, None)
    return env


def _without_nvcc(env: dict) -> dict:
    env = dict(env)
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep)
                                  if p and not (Path(p) / "nvcc").exists())
    # FlashInfer falls back to /usr/local/cuda when CUDA_HOME is unset (H200 run 2 found nvcc there),
    # so point it at a folder without nvcc instead of unsetting it
    env["CUDA_HOME"] = env["CUDA_PATH"] = "/nonexistent-cuda"
    return env


def server_command(a, model: Model, arm: str, model_dir: Path, work: Path, port: int) -> tuple[list[str], dict]:
    """The command and environment of one arm's server: the image through its launcher (settings as OPTION_*
    variables), stock as vLLM's own OpenAI server (the same settings as flags)."""
    name = f"{model.name}.{arm}"
    env = _cold_env(os.environ, work / "homes" / name)
    # jit-monitor-verbose: vLLM's JIT monitor otherwise warns once per kernel, so a second compile of the
    # same kernel (stock's first larger batch, H200 runs 3-4) would leave no line to count
    engine_args = {"jit-monitor-verbose": True,
                   "max-num-seqs": str(MAX_NUM_SEQS), "max-model-len": str(a.in_tokens + a.out_tokens + 64),
                   "gpu-memory-utilization": str(a.gpu_mem), "kv-cache-memory-bytes": str(a.kv_bytes),
                   **dict(model.engine_args)}
    if a.profile:
        prof = work / "profiles" / name
        prof.mkdir(parents=True, exist_ok=True)
        engine_args["profiler-config"] = json.dumps({"profiler": "torch", "torch_profiler_dir": str(prof),
                                                     "torch_profiler_with_stack": False})
    if arm in IMAGE_ARM_OPTIONS:
        env.update(IMAGE_ARM_OPTIONS[arm])
        env.update({"SERVING_PYTHON": a.image_python, "OPTION_MODEL_ID": str(model_dir), "OPTION_HOST": "127.0.0.1",
                    "OPTION_PORT": str(port), "SERVING_MODEL_DIR": str(work / "no-model-dir")})
        env.update({"OPTION_" + k.upper().replace("-", "_"): "true" if v is True else v
                    for k, v in engine_args.items()})
        cmd = [str(ROOT / "entrypoint.sh"), "serve"]
    else:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (a.stock_site, env.get("PYTHONPATH", "")) if p)
        if arm == "stock-no-nvcc":
            env = _without_nvcc(env)
        if arm == "stock-debug":
            env["VLLM_LOGGING_LEVEL"] = "DEBUG"
        cmd = [a.image_python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
               "--host", "127.0.0.1", "--port", str(port)]
        for k, v in engine_args.items():
            cmd += ["--" + k] if v is True else ["--" + k, v]
    return cmd, env


def start_server(a, model: Model, arm: str, model_dir: Path, work: Path) -> Server:
    port = free_port()
    name = f"{model.name}.{arm}"
    cmd, env = server_command(a, model, arm, model_dir, work, port)
    log_path = work / "logs" / f"{name}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT, start_new_session=True)
    return Server(name, model, arm, port, proc, log_path, time.monotonic())


def _check(s: Server) -> None:
    """One look at a starting server: records its ready time, or that it exited."""
    if s.proc.poll() is not None:
        s.failed = f"exited with {s.proc.returncode}"
    else:
        try:
            conn, r = _request(s.host, "GET", "/ping", timeout=2)
            ok = r.status == 200
            conn.close()
        except OSError:
            ok = False
        if ok:
            s.ready_s = time.monotonic() - s.started
            log(f"{s.name}: ready after {s.ready_s:.0f} s")
            return
    if s.failed:
        log(f"{s.name}: {s.failed}; log tail:\n{s.log()[-2500:]}")


def wait_ready(servers: list[Server], end: float) -> None:
    """Until every server is up or failed; at `end` (monotonic) the ones still starting count as failed."""
    while any(s.ready_s is None and not s.failed for s in servers):
        for s in servers:
            if s.ready_s is None and not s.failed:
                if time.monotonic() >= end:
                    s.failed = "not ready by the deadline"
                    log(f"{s.name}: {s.failed}; log tail:\n{s.log()[-2500:]}")
                else:
                    _check(s)
        time.sleep(1)


def log_facts(s: Server) -> dict:
    """What the engine log says about routing, warm-up, FlashInfer and JIT compiles."""
    text = s.log()
    pick = re.compile(r"Fp8 MoE backend|TRITON preferred|Warming up the fused-MoE|FlashInfer|Building JIT module|"
                      r"nvcc|Using .*MoE|moe backend|does not support the deployment", re.I)
    lines = []
    for ln in text.splitlines():
        if pick.search(ln) and len(lines) < 40:
            lines.append(ln[-300:])
    return {"jit_warnings": text.count(JIT_WARNING), "flashinfer_jit_builds": text.count("Building JIT module"),
            "log_lines": lines}


def record_facts(results: dict, s: Server) -> None:
    results["servers"].setdefault(s.name, {}).update(log_facts(s), **s.facts)


# --- profile: GPU time by kernel class -------------------------------------------------------------

KERNEL_CLASSES = (
    ("moe_gemm", re.compile(r"fused_moe_kernel")),
    ("attention", re.compile(r"flash|attn|attention|fmha|reshape_and_cache|paged", re.I)),
    ("other_gemm", re.compile(r"gemm|gemv|xmma|nvjet|cutlass|scaled_mm|matmul|sm90_", re.I)),
)


GPU_EVENT_CATEGORIES = ("kernel", "gpu_memset", "gpu_memcpy")


def classify(trace_path: Path) -> dict:
    with gzip.open(trace_path, "rt") if trace_path.suffix == ".gz" else open(trace_path) as f:
        events = json.load(f)["traceEvents"]
    # memsets and copies are GPU work of the step too: vLLM's dynamic FP8 quantization clears its scale with a
    # memset (0.85 us each, 2.4% of a one-client window in H200 run 6), which kernels alone would not count
    kernels = sorted((e for e in events if e.get("cat") in GPU_EVENT_CATEGORIES and "dur" in e), key=lambda e: e["ts"])
    us: dict[str, float] = {}
    other: dict[str, float] = {}
    moe_seen = 0
    for e in kernels:
        cls = next((c for c, rx in KERNEL_CLASSES if rx.search(e["name"])), "other")
        if cls == "moe_gemm":
            # each MoE layer runs its w13 GEMM, then its w2 GEMM (the split-K kernel is one of them)
            cls = "moe_w13" if moe_seen % 2 == 0 else "moe_w2"
            moe_seen += 1
        if cls == "other":
            other[e["name"][:80]] = other.get(e["name"][:80], 0) + e["dur"]
        us[cls] = us.get(cls, 0) + e["dur"]
    total = sum(us.values()) or 1
    return {"total_gpu_ms": total / 1e3, "share": {k: round(v / total, 4) for k, v in sorted(us.items())},
            "top_other": sorted(other.items(), key=lambda kv: -kv[1])[:8]}


def profile_steps(concurrency: int, out_tokens: int) -> int:
    """Engine steps in a profile window (one wave of streamed requests): its requests run
    `concurrency` at a time, each for out_tokens steps (the first one its prefill)."""
    return -(-requests_for(concurrency, 1) // concurrency) * out_tokens


def profile(s: Server, wl: Workload, concurrency: int, prof_dir: Path) -> dict:
    before = set(prof_dir.rglob("*.json*"))
    _json(s.host, "POST", "/start_profile")
    wl.latency(s.host, concurrency, 1)
    _json(s.host, "POST", "/stop_profile")
    end = time.monotonic() + 120
    new = []
    while time.monotonic() < end:
        new = sorted(p for p in set(prof_dir.rglob("*.json*")) - before if "rank0" in p.name or "rank" not in p.name)
        if new and all(p.stat().st_size > 0 for p in new):
            time.sleep(2)
            break
        time.sleep(1)
    if not new:
        return {"error": "no trace written"}
    worker = max(new, key=lambda p: p.stat().st_size)  # the GPU worker's trace is the large one
    return {"trace": worker.name, **classify(worker)}


# --- the run -------------------------------------------------------------------------------------

def log(msg: str) -> None:
    print(f"[e2e {time.strftime('%H:%M:%S')}] {msg}", flush=True)


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
                lambda i: streamed(host, _body(wl.model_id, wl.prompts[i], wl.out, True))["ttft"], range(c)))
        firsts[str(c)] = {"first_ttft_ms": 1e3 * min(results), "max_ttft_ms": 1e3 * max(results),
                          "wall_s": time.perf_counter() - t0}
    sweep(wl, host, 1)
    return firsts


PROFILE_CLASSES = (("moe_w13", "MoE w13"), ("moe_w2", "MoE w2"), ("attention", "attention"),
                   ("other_gemm", "other GEMMs"), ("other", "everything else"))


def profile_table(results: dict) -> list[str]:
    """GPU time per engine step by kernel class, from each profile window (--profile)."""
    out_tokens = int(results["args"]["out_tokens"])
    rows = []
    for mname, m in results["models"].items():
        for key, p in (m.get("profile") or {}).items():
            if "share" not in p:
                rows.append(f"| {mname} | {key} | {p.get('error', 'no trace')} |" + " |" * (len(PROFILE_CLASSES) + 1))
                continue
            arm, _, conc = key.rpartition(".c")
            step = p["total_gpu_ms"] / profile_steps(int(conc), out_tokens)
            rows.append(f"| {mname} | {arm} | {conc} | {p['total_gpu_ms']:.1f} | {step:.3f} | " + " | ".join(
                f"{100 * p['share'].get(c, 0):.1f}%" for c, _ in PROFILE_CLASSES) + " |")
    if not rows:
        return []
    return ["", "| model | arm | clients | GPU ms in window | GPU ms per step | "
            + " | ".join(name for _, name in PROFILE_CLASSES) + " |",
            "|---|---|---|---|---|" + "---|" * len(PROFILE_CLASSES)] + rows


def paired_ratios(runs: list[dict], model: str, kind: str, metric: str, clients: str,
                  arm: str = "image") -> list[float]:
    """Every repetition's arm/stock ratio for one figure (the arm's figure over the stock figure measured just
    before it), over the recorded runs that measured it."""
    out = []
    for res in runs:
        reps = res["models"].get(model, {}).get("reps", {})
        for st, im in zip(reps.get("stock", []), reps.get(arm, [])):
            if clients in st[kind] and clients in im[kind]:
                out.append(im[kind][clients][metric] / st[kind][clients][metric])
    return out


def summarize(results: dict) -> str:
    out = ["| model | arm | metric | clients | stock | arm | arm/stock median | paired ratio range |",
           "|---|---|---|---|---|---|---|---|"]
    for mname, m in results["models"].items():
        reps = m.get("reps", {})
        for arm in [a for a in MEASURED_ARMS[1:] if reps.get(a)]:
            if not reps.get("stock"):
                break
            for kind, metric, conc in ([("throughput", "tok_s", c) for c in THROUGHPUT_CONCURRENCY]
                                       + [("latency", k, c) for c in LATENCY_CONCURRENCY
                                          for k in ("ttft_p50_ms", "ttft_p99_ms", "itl_p50_ms", "itl_p99_ms")]):
                ratios = paired_ratios([results], mname, kind, metric, str(conc), arm)
                if not ratios:  # not measured in this run (--clients)
                    continue
                st = [r[kind][str(conc)][metric] for r in reps["stock"]]
                im = [r[kind][str(conc)][metric] for r in reps[arm]]
                out.append(f"| {mname} | {arm} | {metric} | {conc} | {statistics.median(st):.1f} | "
                           f"{statistics.median(im):.1f} | {statistics.median(ratios):.3f} | "
                           f"{min(ratios):.3f}-{max(ratios):.3f} |")
    out += profile_table(results)
    out += ["", "| server | start to /ping 200 (s) | first request TTFT (ms) | JIT warnings | FlashInfer JIT builds |",
            "|---|---|---|---|---|"]
    for name, s in results["servers"].items():
        out.append(f"| {name} | {s.get('ready_s') or s.get('failed')} | {s.get('first_ttft_ms', '-')} | "
                   f"{s.get('jit_warnings', '-')} | {s.get('flashinfer_jit_builds', '-')} |")
    return "\n".join(out) + "\n"


def measure_model(a, m: Model, arms: dict[str, Server], vocab: int, results: dict, save) -> None:
    """One model's warm-up pass per arm, the alternating repetitions, and the profiles."""
    if not arms:
        return
    model_id = _json(next(iter(arms.values())).host, "GET", "/v1/models")["data"][0]["id"]
    wl = Workload(model_id, a.in_tokens, a.out_tokens, vocab)
    mres = results["models"].setdefault(m.name, {"layers": m.layers, "first_pass": {}, "reps": {}, "profile": {}})
    measured = [arm for arm in MEASURED_ARMS if arm in arms]
    for arm, s in arms.items():
        s.facts["first_ttft_ms"] = round(1e3 * streamed(s.host, _body(model_id, wl.prompts[0], 16, True))["ttft"], 1)
        if arm in measured:
            mres["first_pass"][arm] = first_pass(wl, s.host)
        log(f"{s.name}: first request TTFT {s.facts['first_ttft_ms']} ms")
    for rep in range(a.reps):
        for arm in measured:
            r = sweep(wl, arms[arm].host, a.waves, a.clients)
            mres["reps"].setdefault(arm, []).append(r)
            log(f"{m.name} rep {rep} {arm}: " + ", ".join(
                f"c{c} {v['tok_s']:.0f} tok/s" for c, v in r["throughput"].items()))
        save()
    # the servers' facts now, not only at the end: a run cut short during the profiles (the lease
    # ending, as in H200 run 3) still keeps each server's first TTFT and JIT counts
    for s in arms.values():
        record_facts(results, s)
    save()
    if a.profile:
        for arm in measured:
            for c in LATENCY_CONCURRENCY:
                try:
                    mres["profile"][f"{arm}.c{c}"] = profile(arms[arm], wl, c, a.work / "profiles" /
                                                             arms[arm].name)
                except Exception as e:  # a profile is extra: record why it failed, keep the figures
                    mres["profile"][f"{arm}.c{c}"] = {"error": repr(e)[:300]}
        save()


def make_model(a, m: Model) -> Path:
    """The model's weights (kept in --models-dir between runs), written by a child process so that
    their memory (tens of GB for the DeepSeek-V3 shard) goes back before the servers start."""
    t0 = time.monotonic()
    out = a.models_dir / m.name
    spec = (f"preset_spec({m.preset!r}, layers={m.layers}, fp8=True, fp8_scheme={m.fp8!r})" if m.preset
            else "TinySpec()")
    subprocess.run([sys.executable, "-c", "from pathlib import Path; from serving.tiny_model import *; "
                    f"ensure(Path({str(out)!r}), {spec})"], cwd=ROOT, check=True)
    log(f"model {m.name}: {time.monotonic() - t0:.0f} s")
    return out


def chosen_models(names: list[str]) -> list[Model]:
    """The models to run, in the order given, each once (H200 run 4 asked for the Qwen3-Coder shard first,
    to profile it early in the lease, and got the table's order instead)."""
    by_name = {m.name: m for m in MODELS + (CPU_CHECK,)}
    return [by_name[n] for n in dict.fromkeys(names)]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.e2e_bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--stock-site", required=True, help="folder holding the pristine vllm package (stock arm)")
    p.add_argument("--image-python", default=sys.executable, help="Python with the patched vLLM (both arms run it)")
    p.add_argument("--models-dir", type=Path, required=True, help="where the models are made (kept between runs)")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--work", type=Path, default=Path("/tmp/e2e-work"))
    p.add_argument("--models", nargs="*", default=[m.name for m in MODELS],
                   choices=[m.name for m in MODELS + (CPU_CHECK,)])
    all_arms = sorted({arm for m in MODELS for arm in m.arms})
    p.add_argument("--arms", nargs="*", default=all_arms, choices=all_arms,
                   help="start only these of each model's arms")
    p.add_argument("--layers", nargs="+", default=[str(DEFAULT_LAYERS)], metavar="N|MODEL=N",
                   help="decoder layers: N for every model, MODEL=N for one (enough that the layers, not the "
                        "host's per-step work, set the step)")
    p.add_argument("--drop-models", action="store_true",
                   help="delete each model's folder once its servers stop (the H200 host's 64 GB disk holds one "
                        "deep shard at a time)")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--waves", type=int, default=6,
                   help="requests per client in each measured run (2 gave ±35%% swings between repetitions)")
    p.add_argument("--in-tokens", type=int, default=128)
    p.add_argument("--out-tokens", type=int, default=128)
    p.add_argument("--gpu-mem", type=float, default=0.08, help="each server's gpu-memory-utilization")
    p.add_argument("--kv-bytes", type=int, default=3 << 29,
                   help="each server's KV cache (1.5 GiB: 128 sequences of 320 tokens need under 1 GiB)")
    p.add_argument("--ready-timeout", type=float, default=900)
    p.add_argument("--profile", action="store_true", help="torch-profiler traces at 1 and 32 clients")
    p.add_argument("--clients", type=int, nargs="+", choices=sorted(set(THROUGHPUT_CONCURRENCY + LATENCY_CONCURRENCY)),
                   help="measure only these concurrencies (default: all); the warm-up pass and the profiles "
                        "still cover every one")
    a = p.parse_args(argv)
    try:
        depth = parse_layers(a.layers, list(dict.fromkeys(a.models)))
    except ValueError as e:
        p.error(str(e))
    chosen = chosen_models(a.models)
    for m in chosen:
        if not m.preset and depth[m.name] != DEFAULT_LAYERS:
            p.error(f"--layers: {m.name} is the embedded model, its depth is fixed; give the others' as MODEL=N")
    # A SIGTERM (tools/h200_session.sh stop) unwinds through the finally below, so the servers, each in its own
    # session, are stopped too: run 8 killed the bench without it and left an engine core holding the GPU's memory.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    a.out.mkdir(parents=True, exist_ok=True)
    if a.work.exists():
        shutil.rmtree(a.work)
    from serving.tiny_model import TinySpec, preset_spec

    chosen = [with_layers(m, depth[m.name]) for m in chosen]
    vocab = min(spec.vocab for spec in [preset_spec(m.preset) if m.preset else TinySpec() for m in chosen])
    results = {"args": {k: str(v) for k, v in vars(a).items()}, "servers": {}, "models": {}}

    def save():
        (a.out / "e2e.json").write_text(json.dumps(results, indent=1))
        (a.out / "e2e.md").write_text(summarize(results))

    # One model at a time: its arms start together (their start times side by side under the same
    # load), are measured, and are stopped before the next model starts. All models at once put up
    # to 9 cold starts and their JIT builds (FlashInfer's fused_moe_90, DeepGEMM's warm-up) on 16
    # cores: load 60, every figure skewed, and the bench itself killed for memory (H200, run 2).
    for m in chosen:
        model_dir = make_model(a, m)
        group = [start_server(a, m, arm, model_dir, a.work)
                 for arm in m.arms if arm in a.arms or not m.preset]
        try:
            wait_ready(group, time.monotonic() + a.ready_timeout)
            for s in group:
                results["servers"][s.name] = {"ready_s": round(s.ready_s, 1) if s.ready_s else None,
                                              "failed": s.failed}
            save()
            measure_model(a, m, {s.arm: s for s in group if not s.failed}, vocab, results, save)
        except Exception as e:  # one model's failure (a server died mid-run) keeps the others' figures
            log(f"{m.name}: measurement failed: {e!r}")
            results["models"].setdefault(m.name, {})["error"] = repr(e)[:500]
        finally:
            for s in group:
                record_facts(results, s)
                stop(s.proc, grace=20)
                (a.out / "logs").mkdir(exist_ok=True)
                shutil.copy(s.log_path, a.out / "logs" / f"{s.name}.log")
            save()
            if a.drop_models:
                shutil.rmtree(model_dir, ignore_errors=True)
    print(summarize(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
