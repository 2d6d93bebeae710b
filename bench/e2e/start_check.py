"""The image's launcher on one model folder with its defaults, started on two host layouts of nvcc at once: on PATH,
and only under /usr/local/cuda (PATH without it, CUDA_HOME and CUDA_PATH unset). Each server gets the model and
the workload's own settings (context length, memory) and nothing else; once ready, one completion. The report
(start_check.json) holds, per layout, which JIT's nvcc rule finds one (serving/kernels.py), the time to ready, the
completion, and the start log's lines that name the kernels.

    python -m bench.e2e.start_check --model DIR --image-python PY --out DIR [--ready-timeout S]
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
import time
from pathlib import Path

from serving.kernels import deep_gemm_nvcc, flashinfer_nvcc
from serving.paths import ROOT
from tools.launcher_process import free_port, spawn, stop, wait_ready

from .servers import _cold_env
from .workload import request_json

DEFAULT_CUDA_BIN = Path("/usr/local/cuda/bin")
KV_BYTES = 3 << 29  # each server's KV cache: the bench's default
GPU_MEM = 0.08      # the share vLLM checks free at start, small enough for two servers at once (the bench's)
MAX_MODEL_LEN = 4096
KERNEL_LINES = re.compile(r"FP8 kernels|Selected \w+Kernel|MoE backend|Using \w+ .*MoE|linear_backend|moe_backend|"
                          r"nvcc|Building JIT|JIT compil|DeepGEMM|deep_gemm|flashinfer", re.I)


def layouts(base: dict[str, str]) -> dict[str, dict[str, str]]:
    """The two environments: nvcc on PATH (the default CUDA folder's bin/ put first where PATH lacks one), and nvcc
    only under the default CUDA folder."""
    path = [p for p in base.get("PATH", "").split(os.pathsep) if p]
    on_path = dict(base)
    if not shutil.which("nvcc", path=os.pathsep.join(path)):
        on_path["PATH"] = os.pathsep.join([str(DEFAULT_CUDA_BIN), *path])
    hidden = {k: v for k, v in base.items() if k not in ("CUDA_HOME", "CUDA_PATH")}
    hidden["PATH"] = os.pathsep.join(p for p in path if not (Path(p) / "nvcc").exists())
    return {"nvcc-on-path": on_path, "nvcc-under-usr-local-cuda-only": hidden}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.e2e.start_check", description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--image-python", required=True, help="the image's runtime's Python (SERVING_PYTHON)")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--ready-timeout", type=float, default=900)
    a = ap.parse_args(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    servers, report = {}, {"model": str(a.model), "layouts": {}}
    for name, env in layouts(dict(os.environ)).items():
        port = free_port()
        env = _cold_env(env, a.out / "homes" / name)
        env.update(OPTION_MODEL_ID=str(a.model), OPTION_HOST="127.0.0.1", OPTION_PORT=str(port),
                   OPTION_MAX_MODEL_LEN=str(MAX_MODEL_LEN), OPTION_KV_CACHE_MEMORY_BYTES=str(KV_BYTES),
                   OPTION_GPU_MEMORY_UTILIZATION=str(GPU_MEM), SERVING_PYTHON=a.image_python,
                   SERVING_MODEL_DIR=str(a.out / "no-model-dir"))
        found = {"deepgemm": deep_gemm_nvcc(env), "flashinfer_build": flashinfer_nvcc(env),
                 "flashinfer_gemm_runtime": flashinfer_nvcc(env, gemm_runtime=True),
                 "on_path": shutil.which("nvcc", path=env.get("PATH", ""))}
        report["layouts"][name] = {"nvcc_found_by": {k: str(v) if v else None for k, v in found.items()},
                                   "cuda_home": env.get("CUDA_HOME")}
        servers[name] = spawn([str(ROOT / "entrypoint.sh"), "serve"], env, a.out / f"{name}.log", port, name=name,
                              model=str(a.model))
    try:
        wait_ready(list(servers.values()), a.ready_timeout, report=lambda line: print(line, flush=True))
        for name, srv in servers.items():
            r = report["layouts"][name]
            r["ready_s"], r["failed"] = round(srv.ready_s, 1), srv.failed
            if not srv.failed:
                t0 = time.monotonic()
                try:
                    model_id = request_json(srv.host, "GET", "/v1/models", timeout=30)["data"][0]["id"]
                    out = request_json(srv.host, "POST", "/v1/completions", {
                        "model": model_id, "prompt": "The capital of France is", "max_tokens": 16}, timeout=120)
                    r["completion"] = {"tokens": out["usage"]["completion_tokens"], "ms": round(
                        (time.monotonic() - t0) * 1000, 1), "text": out["choices"][0]["text"]}
                except Exception as e:  # the report says what failed; the exit status too
                    r["completion"] = {"error": f"{type(e).__name__}: {e}"}
            r["kernel_lines"] = [ln[-300:] for ln in srv.log().splitlines() if KERNEL_LINES.search(ln)][:60]
    finally:
        for srv in servers.values():
            stop(srv.proc, 60)
    (a.out / "start_check.json").write_text(json.dumps(report, indent=1))
    print(json.dumps(report, indent=1))
    ok = all(not r.get("failed") and "tokens" in r.get("completion", {}) for r in report["layouts"].values())
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
