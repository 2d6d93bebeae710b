"""Each arm's server: its command and environment (the image through its launcher, stock as vLLM's own OpenAI
server, the peers from runtimes of their own), its start (tools/launcher_process.py waits for it and stops it), and
what its log says."""
from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

from serving.kernels import deep_gemm_nvcc
from serving.paths import CONFIGS_DIR, ROOT
from serving.settings import TABLE, to_environment
from tools.launcher_process import Server, free_port, spawn

from .capacity import sglang_sized_args
from .config import Config
from .kv_pool import pool_facts
from .models import (ARM_ENV, CANDIDATES_ARM, CONTAINER_SETTINGS, IMAGE_ARM_ENGINE_ARGS, IMAGE_ARM_SETTINGS,
                     NO_NVCC_ARM, PEER_ARMS, SGLANG_ARMS, Model)

JIT_WARNING = "JIT compilation during inference"
MAX_NUM_SEQS = 128
# The settings the image arms switch, and the sampler, under every name the launcher and the engine read them by
# (and the tuned configs): no arm may inherit a value of one from the bench's environment (the stock arms run the
# same Python).
NOT_INHERITED = ("VLLM_TUNED_CONFIG_FOLDER", *(
    name for key in sorted({k for arm in IMAGE_ARM_SETTINGS.values() for k in arm} | {"flashinfer_sampler"})
    for name in (*TABLE[key].env_names, TABLE[key].engine_env) if name))
# A peer's runtime is its Python alone: nothing of the bench's own search path reaches it.
NOT_INHERITED_BY_PEERS = ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")

# SGLang's pool of KV tokens is sized by a memory profile, min(profiled, --max-total-tokens); the profile is the free
# memory after its weights less (1 - mem_fraction_static) x the free memory before them. At 0.99 that slack is
# about 1.4 GiB, so the profile cannot bind before the token cap does while the other arms of the model load beside
# it (SGLang's own default on an H200 holds back about 13 GiB for activations and CUDA graphs, which here would cut
# its pool short of the others' whenever they have taken that memory first). Nothing else reads the fraction: its
# activations and CUDA graphs take what is free, as vLLM's do.
SGLANG_MEM_FRACTION_STATIC = 0.99
# How the readiness of each kind of server is asked: vLLM (the launcher, stock, vllm-latest) serves /ping once its
# engine is up; SGLang's /ping answers 200 as soon as its HTTP server listens, before its warm-up request, and
# /health answers 503 until that warm-up has run (then 200 after a one-token generation).
READY_PATH = {arm: "/health" for arm in SGLANG_ARMS}


@dataclass(frozen=True)
class Matched:
    """One engine setting of the stock arm (vLLM's flag), the setting that carries it to a peer, and why."""
    vllm: str
    sglang: str
    vllm_latest: str
    why: str


# Which setting of each peer carries which of the stock arm's (vLLM 0.32's) engine settings, and why
# (tests/test_e2e_bench.py checks the commands against it); the sglang column holds for every arm of SGLANG_ARMS.
PEERS = (
    Matched("--model DIR", "--model-path DIR", "vllm serve DIR",
            "the same checkpoint folder, served under the same name (SGLang's --served-model-name defaults to the "
            "path, as vLLM's does): the workload's model id is one string"),
    Matched("--host 127.0.0.1 --port P", "--host 127.0.0.1 --port P", "--host 127.0.0.1 --port P",
            "the same scheme: loopback, a free port each"),
    Matched("--max-model-len N", "--context-length N", "--max-model-len N",
            "the longest sequence a request may have (prompt, output and 64 to spare)"),
    Matched("--max-num-seqs 128", "--max-running-requests 128", "--max-num-seqs 128",
            "the batch limit: requests scheduled at once (128 clients at most)"),
    Matched("--kv-cache-memory-bytes B", "--max-total-tokens T (T = B over the KV bytes of a token, to vLLM's "
            "16-token blocks)", "--kv-cache-memory-bytes B",
            "the same KV budget: vLLM takes it in bytes and skips its memory profile; SGLang takes a pool of "
            "tokens, so B becomes the tokens B holds (2 x layers x KV heads x head size x 2 bytes each for the "
            "bf16 cache both keep; its log's '#tokens' and vLLM's 'GPU KV cache size' are recorded per server)"),
    Matched("--gpu-memory-utilization G", f"--mem-fraction-static {SGLANG_MEM_FRACTION_STATIC}",
            "--gpu-memory-utilization G",
            "with a KV budget given, vLLM reads G only to check at start that this share of the GPU is free; "
            "SGLang's fraction sizes its memory profile, set high enough that the token cap, not the profile, "
            "decides its pool (SGLANG_MEM_FRACTION_STATIC)"),
    Matched("--jit-monitor-verbose", "(none)", "--jit-monitor-verbose",
            "vLLM logs every kernel compiled while serving; SGLang (0.5.21, 0.5.23) has no such monitor, so its "
            "compiles are not counted (the warm-up pass's first TTFT at each new concurrency shows a compile's "
            "stall)"),
    Matched("--linear-backend cutlass (block-FP8 models)",
            "SGLANG_JIT_DEEPGEMM_PRECOMPILE=false (its default kernel, DeepGEMM on Hopper, compiled as used)",
            "--linear-backend cutlass",
            "SGLang (0.5.21, 0.5.23) refuses --fp8-gemm-backend cutlass on SM90 ('deprecated on this hardware'); its "
            "default block-FP8 linear kernel is DeepGEMM, which by default it compiles at start for every M up to "
            "16K (10-20 minutes by its own log, beyond a device lease): compiled as used instead, during each arm's "
            "warm-up pass, so its start to first 200 leaves that compile out and its first requests carry it"),
    Matched("(vLLM's FP8 MoE backend order)", "(none: --moe-runner-backend auto)", "(its own order)",
            "each engine's default MoE runner: SGLang's Triton fused MoE with its own per-Triton-version configs "
            "(its log names the config file, or says it runs the default config)"),
    Matched("--profiler-config {torch, dir, with_stack false} (--profile)",
            "SGLANG_TORCH_PROFILER_DIR=dir SGLANG_PROFILE_WITH_STACK=false SGLANG_PROFILE_RECORD_SHAPES=false",
            "--profiler-config {torch, dir, with_stack false}",
            "the same torch-profiler window through each server's /start_profile and /stop_profile, without "
            "Python stacks or shapes"),
    Matched("(prefix caching, chunked prefill, CUDA graphs, sampler: defaults)",
            "(radix cache, chunked prefill, CUDA graphs, sampler: defaults)", "(defaults)",
            "each engine as its users get it; no prompt reaches a server twice (the workload numbers its prompts), "
            "so no measured prefill is a cache hit"),
)


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


def kv_bytes_per_token(model_dir: Path) -> int:
    """Bytes of KV cache one token takes in the model of model_dir (its config.json), as both engines keep it: the
    checkpoint's dtype (bf16), a key and a value per KV head and layer, or MLA's one latent vector and its rope
    part per layer."""
    c = json.loads((model_dir / "config.json").read_text())
    elt = 4 if (c.get("torch_dtype") or c.get("dtype")) == "float32" else 2
    if c.get("kv_lora_rank"):
        return c["num_hidden_layers"] * (c["kv_lora_rank"] + c["qk_rope_head_dim"]) * elt
    head_dim = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
    return 2 * c["num_hidden_layers"] * c.get("num_key_value_heads", c["num_attention_heads"]) * head_dim * elt


def kv_tokens(kv_bytes: int, model_dir: Path, block: int = 16) -> int:
    """The tokens a KV budget of kv_bytes holds, in whole blocks of `block` tokens as vLLM counts them (vLLM's log
    of H200 run 9: 1.5 GiB, the 94-layer Qwen3-235B shard -> 'GPU KV cache size: 33,456 tokens')."""
    return kv_bytes // kv_bytes_per_token(model_dir) // block * block


def kv_sequences(kv_bytes: int, model_dir: Path, seq_tokens: int, block: int = 16) -> int:
    """How many sequences of seq_tokens (prompt and output) a KV budget of kv_bytes holds at once, each in whole
    blocks: at more clients than that, requests wait for a finished one's blocks."""
    return kv_tokens(kv_bytes, model_dir, block) // (-(-seq_tokens // block) * block)


def engine_args(cfg: Config, model: Model, name: str) -> dict[str, object]:
    """The workload's vLLM engine settings, which every vLLM arm gets (flag without dashes -> value, True for a bare
    flag): lengths, batch and memory (models.WORKLOAD_ENGINE_ARGS) and the bench's instruments. A model's own
    engine_args go to its stock and vllm-latest arms only (server_command)."""
    # jit-monitor-verbose: vLLM's JIT monitor otherwise warns once per kernel, so a second compile of the
    # same kernel (stock's first larger batch) would leave no line to count
    args: dict[str, object] = {
        "jit-monitor-verbose": True, "max-num-seqs": str(MAX_NUM_SEQS),
        "max-model-len": str(cfg.max_model_len), "gpu-memory-utilization": str(cfg.gpu_mem)}
    if cfg.kv_pool == "fixed":  # "sized": vLLM sizes the pool from gpu-memory-utilization, as a deployment's
        args["kv-cache-memory-bytes"] = str(cfg.kv_bytes)
    if cfg.profile:
        prof = cfg.profile_dir(name)
        prof.mkdir(parents=True, exist_ok=True)
        args["profiler-config"] = json.dumps({"profiler": "torch", "torch_profiler_dir": str(prof),
                                              "torch_profiler_with_stack": False})
    return args


def _flags(args: dict[str, object]) -> list[str]:
    out: list[str] = []
    for k, v in args.items():
        out += ["--" + k] if v is True else ["--" + k, str(v)]
    return out


# A model's own engine settings (Model.engine_args) as SGLang takes them: None where SGLang keeps its default (PEERS
# says why). A model setting missing here stops the sglang arm rather than go unmatched.
SGLANG_ENGINE_ARGS: dict[str, str | None] = {"linear-backend": None}
# ... and the environment SGLang takes in their stead (PEERS says why).
SGLANG_ENGINE_ENV: dict[str, dict[str, str]] = {"linear-backend": {"SGLANG_JIT_DEEPGEMM_PRECOMPILE": "false"}}


def sglang_command(cfg: Config, model: Model, arm: str, model_dir: Path,
                   port: int) -> tuple[list[str], dict[str, str]]:
    """The SGLang server of arm (one of SGLANG_ARMS) from its runtime's Python, on the stock arm's settings, as PEERS
    matches them: its command, and the environment the model's own engine settings become."""
    extra, env = [], {}
    for k, v in model.engine_args:
        if k not in SGLANG_ENGINE_ARGS:
            raise ValueError(f"{model.name}: engine setting --{k} has no SGLang counterpart in SGLANG_ENGINE_ARGS")
        if SGLANG_ENGINE_ARGS[k]:
            extra += [SGLANG_ENGINE_ARGS[k], v]
        env.update(SGLANG_ENGINE_ENV.get(k, {}))
    return [cfg.peer_python(arm), "-m", "sglang.launch_server", "--model-path", str(model_dir),
            "--host", "127.0.0.1", "--port", str(port),
            "--context-length", str(cfg.max_model_len),
            "--max-running-requests", str(MAX_NUM_SEQS),
            *(["--max-total-tokens", str(kv_tokens(cfg.kv_bytes, model_dir)),
               "--mem-fraction-static", str(SGLANG_MEM_FRACTION_STATIC)] if cfg.kv_pool == "fixed"
              else sglang_sized_args(cfg)), *extra], env


def server_command(cfg: Config, model: Model, arm: str, model_dir: Path, port: int) -> tuple[list[str], dict]:
    """The command and environment of one arm's server: the image through its launcher (settings as OPTION_*
    variables), stock as `vllm serve` (the same settings as flags), vllm-latest as `vllm serve` of its
    own runtime (the same flags), sglang and sglang-latest as SGLang's server of its own runtime (PEERS)."""
    name = server_name(model, arm)
    env = _cold_env(os.environ, cfg.home(name))
    if arm in PEER_ARMS:
        for k in NOT_INHERITED_BY_PEERS:
            env.pop(k, None)
    args = {**engine_args(cfg, model, name), **IMAGE_ARM_ENGINE_ARGS.get(arm, {})}
    if arm not in IMAGE_ARM_SETTINGS:  # the image arms run the container's own kernels (serving/kernels.py)
        args.update(model.engine_args)
    if arm in IMAGE_ARM_SETTINGS:
        settings = {**CONTAINER_SETTINGS, **IMAGE_ARM_SETTINGS[arm]}
        if arm == CANDIDATES_ARM:
            settings["configs_dir"] = str(candidate_configs_dir(cfg))
        env.update(to_environment({"model_id": str(model_dir), "host": "127.0.0.1", "port": port, **settings,
                                   **{k.replace("-", "_"): v for k, v in args.items()}}))
        env.update({"SERVING_PYTHON": cfg.image_python, "SERVING_MODEL_DIR": str(cfg.work / "no-model-dir")})
        if arm == NO_NVCC_ARM or cfg.image_no_nvcc:
            env = _without_nvcc(env)
        cmd = [str(ROOT / "entrypoint.sh"), "serve"]
    elif arm == "vllm-latest":
        # vLLM's supported entry point (the `vllm` program is vllm.entrypoints.cli.main:main)
        cmd = [cfg.vllm_latest_python, "-m", "vllm.entrypoints.cli.main", "serve", str(model_dir),
               "--host", "127.0.0.1", "--port", str(port), *_flags(args)]
    elif arm in SGLANG_ARMS:
        if cfg.profile:
            # the vLLM arms' profiler settings: no Python stacks, no shapes (SGLang records both by default)
            env.update(SGLANG_TORCH_PROFILER_DIR=str(cfg.profile_dir(name)),  # made by engine_args
                       SGLANG_PROFILE_WITH_STACK="false", SGLANG_PROFILE_RECORD_SHAPES="false")
        cmd, model_env = sglang_command(cfg, model, arm, model_dir, port)
        env.update(model_env)
    else:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (cfg.stock_site, env.get("PYTHONPATH", "")) if p)
        if arm == "stock-no-nvcc":
            env = _without_nvcc(env)
        # `vllm serve`, as the image's launcher starts it (the stock arm runs the GPU wheel's `vllm` distribution)
        cmd = [cfg.image_python, "-m", "vllm.entrypoints.cli.main", "serve", str(model_dir),
               "--host", "127.0.0.1", "--port", str(port), *_flags(args)]
    env.update(ARM_ENV.get(arm, {}))
    return cmd, env


def candidate_configs_dir(cfg: Config) -> Path:
    """The image-candidates arm's configs folder: the image's configs (LMI_CONFIGS_DIR where the session set it,
    else configs/) with the files of --candidate-configs laid over them, a file of the same name replaced."""
    folder = cfg.work / "candidate-configs"
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.glob("*.json"):
        old.unlink()
    for source in (Path(os.environ.get("LMI_CONFIGS_DIR") or CONFIGS_DIR), cfg.candidate_configs):
        for f in sorted(source.glob("*.json")) if source else ():
            (folder / f.name).write_bytes(f.read_bytes())
    return folder


def start_server(cfg: Config, model: Model, arm: str, model_dir: Path, facts: dict | None = None) -> Server:
    """One arm's server, started in a session of its own (launcher_process.stop ends it and its engine). The
    peers start in their own home folder, so that no module of this repository shadows one of their runtime's
    (python -m puts the working folder first on the path). `facts`, where given, gets the nvcc its environment
    shows a JIT (DeepGEMM's, FlashInfer's), or None: the image arms run without one as their container does
    (--image-no-nvcc), stock and the peers with the host's."""
    port = free_port()
    name = server_name(model, arm)
    cmd, env = server_command(cfg, model, arm, model_dir, port)
    if facts is not None:
        found = deep_gemm_nvcc(env)
        facts["nvcc"] = str(found) if found else None
    cwd = cfg.home(name) if arm in PEER_ARMS else ROOT
    return spawn(cmd, env, cfg.log_path(name), port, name=name, model=str(model_dir), cwd=cwd,
                 ready_path=READY_PATH.get(arm, "/ping"))


# The Triton config Inductor's autotuner picked for each of a server's generated kernels, as its cache holds it
# (inductor_cache/<xx>/<hash>.py beside the pick, <key>.best_config). A kernel is known by its source up to the
# benchmark harness Inductor appends (`def get_args`, whose byte count differs between servers whose graphs saw other
# sizes). Two servers that compiled the same kernel may pick differently: the autotuner times each candidate at the
# first call, and the arms of a model start together on one GPU, so one server's timing can run beside another's
# work. A pick that is slower at decode sizes costs every step (the Q/K norm + RoPE kernel's picks seen take 1.6 to
# 4.3 µs at one token on the H200).
PICK_KEYS = ("XBLOCK", "YBLOCK", "R0_BLOCK", "R1_BLOCK", "num_warps", "num_stages")
KERNEL_NAME = re.compile(r"'kernel_name': '(triton_\w+)'")  # an unnamed copy says 'Placeholder.DESCRIPTIVE_NAME'
SIZE_HINTS = re.compile(r"size_hints=(\{[^}]*\})")


def inductor_picks(home: Path) -> dict[str, dict]:
    """Per generated kernel (a hash of its source without the harness): its name and the config picked. A folder
    holding several sources and one pick cannot say whose pick it is: left out."""
    picks = {}
    for best in sorted(home.glob(".cache/vllm/torch_compile_cache/**/inductor_cache/*/*.best_config")):
        sources = sorted(best.parent.glob("*.py"))
        if len(sources) != 1 or len(list(best.parent.glob("*.best_config"))) != 1:
            continue
        try:
            config = json.loads(best.read_text())
        except ValueError:
            continue
        text = sources[0].read_text(errors="replace")
        name, hints = KERNEL_NAME.search(text), SIZE_HINTS.search(text)
        kernel = hashlib.sha256(text.split("\ndef get_args(")[0].encode()).hexdigest()[:16]
        picks[kernel] = {"kernel": name.group(1) if name else f"unnamed, size_hints {hints.group(1) if hints else '?'}",
                         "config": {k: config[k] for k in PICK_KEYS if k in config}}
    return picks


# vLLM's and SGLang's warning that no tuned fused-MoE file of this GPU holds a shape (each then runs its default
# config): the file name it looked for, SGLang's w2 file ending in _down
MOE_CONFIG_NOT_FOUND = re.compile(r"Config file not found at (?:[^\s,]*/)?(E=\d+,N=\d+,device_name=[^,]+,dtype=[^,]+"
                                  r"(?:,block_shape=\[\d+, ?\d+\])?(?:_down)?\.json)")


def log_facts(s: Server) -> dict:
    """What the engine log says about routing, warm-up, FlashInfer, the KV pool, JIT compiles and the fused-MoE
    files it did not find. SGLang logs no compile while serving: its count is None (not counted), not 0."""
    text = s.log()
    pick = re.compile(r"Fp8 MoE backend|TRITON preferred|Warming up the fused-MoE|FlashInfer|Building JIT module|"
                      r"nvcc|Using .*MoE|moe backend|does not support the deployment|"
                      r"KV cache size|KV Cache is allocated|max_total_num_tokens|MoE kernel config|moe_runner|"
                      r"DeepGEMM|deep_gemm|Capture cuda graph|tuned configs:|Selected \w+Kernel|FP8 kernels", re.I)
    lines = []
    for ln in text.splitlines():
        if pick.search(ln) and len(lines) < 40:
            lines.append(ln[-300:])
    sglang = s.name.rsplit(".", 1)[-1] in SGLANG_ARMS
    return {"jit_warnings": None if sglang else text.count(JIT_WARNING),
            "flashinfer_jit_builds": text.count("Building JIT module"), "log_lines": lines, **pool_facts(text),
            "moe_configs_not_found": sorted(set(MOE_CONFIG_NOT_FOUND.findall(text)))}
