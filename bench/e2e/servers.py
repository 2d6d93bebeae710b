"""Each arm's server: its command and environment (the image through its launcher, stock as vLLM's own OpenAI
server), its start (tools/launcher_process.py waits for it and stops it), and what its log says."""
from __future__ import annotations

import json
import os
import re
from pathlib import Path

from serving.paths import ROOT
from serving.settings import TABLE, to_environment
from tools.launcher_process import Server, free_port, spawn

from .config import Config
from .models import IMAGE_ARM_SETTINGS, Model

JIT_WARNING = "JIT compilation during inference"
MAX_NUM_SEQS = 128
# The settings the image arms switch, and the sampler, under the names the engine reads them by (and the tuned
# configs): no arm may inherit a value of one from the bench's environment (the stock arms run the same Python).
NOT_INHERITED = ("VLLM_TUNED_CONFIG_FOLDER", *(
    TABLE[key].engine_env for key in sorted({k for arm in IMAGE_ARM_SETTINGS.values() for k in arm}
                                            | {"flashinfer_sampler"})))


def server_name(model: Model, arm: str) -> str:
    return f"{model.name}.{arm}"


def _cold_env(base: dict, home: Path) -> dict:
    """Every cache of this server under its own empty folder: a cold start, as on a fresh host."""
    home.mkdir(parents=True, exist_ok=True)
    env = dict(base)
    env.update(HOME=str(home), XDG_CACHE_HOME=str(home / ".cache"), VLLM_CACHE_ROOT=str(home / ".cache/vllm"),
               TRITON_CACHE_DIR=str(home / ".cache/triton"), FLASHINFER_WORKSPACE_BASE=str(home),
               TORCHINDUCTOR_CACHE_DIR=str(home / ".cache/inductor"))
    for k in NOT_INHERITED:
        env.pop(k, None)
    return env


def _without_nvcc(env: dict) -> dict:
    env = dict(env)
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep)
                                  if p and not (Path(p) / "nvcc").exists())
    # FlashInfer falls back to /usr/local/cuda when CUDA_HOME is unset, and nvcc may be there, so point it at a
    # folder without nvcc instead of unsetting it
    env["CUDA_HOME"] = env["CUDA_PATH"] = "/nonexistent-cuda"
    return env


def server_command(cfg: Config, model: Model, arm: str, model_dir: Path, port: int) -> tuple[list[str], dict]:
    """The command and environment of one arm's server: the image through its launcher (settings as OPTION_*
    variables), stock as vLLM's own OpenAI server (the same settings as flags)."""
    name = server_name(model, arm)
    env = _cold_env(os.environ, cfg.home(name))
    # jit-monitor-verbose: vLLM's JIT monitor otherwise warns once per kernel, so a second compile of the
    # same kernel (stock's first larger batch) would leave no line to count
    engine_args = {"jit-monitor-verbose": True,
                   "max-num-seqs": str(MAX_NUM_SEQS), "max-model-len": str(cfg.in_tokens + cfg.out_tokens + 64),
                   "gpu-memory-utilization": str(cfg.gpu_mem), "kv-cache-memory-bytes": str(cfg.kv_bytes),
                   **dict(model.engine_args)}
    if cfg.profile:
        prof = cfg.profile_dir(name)
        prof.mkdir(parents=True, exist_ok=True)
        engine_args["profiler-config"] = json.dumps({"profiler": "torch", "torch_profiler_dir": str(prof),
                                                     "torch_profiler_with_stack": False})
    if arm in IMAGE_ARM_SETTINGS:
        env.update(to_environment({"model_id": str(model_dir), "host": "127.0.0.1", "port": port,
                                   **IMAGE_ARM_SETTINGS[arm],
                                   **{k.replace("-", "_"): v for k, v in engine_args.items()}}))
        env.update({"SERVING_PYTHON": cfg.image_python, "SERVING_MODEL_DIR": str(cfg.work / "no-model-dir")})
        cmd = [str(ROOT / "entrypoint.sh"), "serve"]
    else:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (cfg.stock_site, env.get("PYTHONPATH", "")) if p)
        if arm == "stock-no-nvcc":
            env = _without_nvcc(env)
        if arm == "stock-debug":
            env["VLLM_LOGGING_LEVEL"] = "DEBUG"
        # `vllm serve`, as the image's launcher starts it (the stock arm runs the GPU wheel's `vllm` distribution)
        cmd = [cfg.image_python, "-m", "vllm.entrypoints.cli.main", "serve", str(model_dir),
               "--host", "127.0.0.1", "--port", str(port)]
        for k, v in engine_args.items():
            cmd += ["--" + k] if v is True else ["--" + k, v]
    return cmd, env


def start_server(cfg: Config, model: Model, arm: str, model_dir: Path) -> Server:
    """One arm's server, started in a session of its own (launcher_process.stop ends it and its engine)."""
    port = free_port()
    name = server_name(model, arm)
    cmd, env = server_command(cfg, model, arm, model_dir, port)
    return spawn(cmd, env, cfg.log_path(name), port, name=name, model=str(model_dir), cwd=ROOT)


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
