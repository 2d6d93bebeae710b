"""The benchmark models, the arms that serve them, and their weights (made by serving.tiny_model)."""
from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass, replace
from pathlib import Path

from serving.paths import ROOT

# Decoder layers of every model unless --layers says otherwise. At this depth a one-client decode step on an H200
# is bound by the host's per-step work (inter-token 1.7-2.3 ms against 1.1-1.6 ms of GPU work per step), not by the
# kernels: what the kernels give a deployment is measured at its depth (--layers).
DEFAULT_LAYERS = 16


@dataclass(frozen=True)
class Model:
    """One benchmark model: a serving.tiny_model preset in one FP8 scheme, the arms that serve it, and engine
    arguments its stock arms get (stock, vllm-latest; flag without its leading dashes -> value). The image arms get
    none of them: they run the container's defaults plus the workload's own settings (WORKLOAD_ENGINE_ARGS)."""
    name: str
    preset: str
    fp8: str
    arms: tuple[str, ...] = ("stock", "image")
    engine_args: tuple[tuple[str, str], ...] = ()
    layers: int = DEFAULT_LAYERS
    positions: int | None = None  # the checkpoint's max_position_embeddings; None: its preset's (cli.with_positions)

    @property
    def vocab(self) -> int:
        return self.spec.vocab

    @property
    def spec(self):
        """The serving.tiny_model spec of its checkpoint, the one tiny_model_args gives (a TinySpec)."""
        from bench.e2e.shards import preset_spec
        from serving.tiny_model import TinySpec

        if not self.preset:
            return TinySpec()
        return preset_spec(self.preset, layers=self.layers, fp8=True, fp8_scheme=self.fp8,
                           **({"max_position": self.positions} if self.positions else {}))


def tiny_model_args(m: Model) -> list[str]:
    """serving.tiny_model's flags for the model's checkpoint (the spec they describe is m.spec)."""
    if not m.preset:
        return []
    return ["--preset", m.preset, "--layers", str(m.layers), "--fp8", m.fp8,
            *(["--max-position", str(m.positions)] if m.positions else [])]


def with_layers(m: Model, layers: int) -> Model:
    """The model at `layers` decoder layers. Away from the default depth the name says it (qwen3-235b-tp8-tensor@94L),
    so that its figures, servers and folder never mix with another depth's; at the default depth the name stays
    plain, the name the recorded runs give it."""
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
# (IMAGE_ARM_SETTINGS below, keys of serving/settings.py's table; or one vLLM flag, IMAGE_ARM_ENGINE_ARGS), so image
# against them is one patch alone:
# "image-stock-order" (vLLM's own FP8 MoE backend order: patch 0001), "image-vllm-quant" (vLLM's two-kernel FP8
# quantization of the MoE inputs: patch 0006), "image-vllm-topk" (vLLM's topk_softmax op for the router: patch
# 0007), "image-eager-prefill" (vLLM's own CUDA-graph sizes, every step above them eager: option.cuda_graph_max_tokens
# 0, serving/cuda_graphs.py), "image-piecewise-prompts" (vLLM's default cudagraph_mode FULL_AND_PIECEWISE, a step with
# prompt tokens piecewise, attention eager between the graph pieces of every layer, where the image runs every step in
# one graph: option.cuda_graph_full_steps false; run 38 ran the image's mode as "image-full-graphs" beside the image
# with vLLM's), "image-bf16-router" (the model's bf16 router logits, cuBLAS's gate: patch 0009),
# "image-cutlass-dense" (CUTLASS for every block-FP8 dense GEMM, no small-M Triton tier: patch 0010),
# "image-gemv-silu" (SiLU-and-mul and the w2 input's quantization inside 0011's w2 GEMV: patch 0012, off in the
# image; run 22 ran it as the image, beside "image-vllm-act", the same arm with it off),
# "image-qk-norm-rope" (vLLM's fused Q/K RMSNorm + RoPE kernel: option.qk_norm_rope_fusion, off in the image),
# "image-vllm-norm-quant" and "image-separate-norm-quant" (the RMSNorm before a block-FP8 linear layer and its FP8
# quantization as vLLM's fused CUDA kernel, or the norm generated and the quantization as vLLM's op, where the image
# has torch.compile generate both: option.norm_quant vllm or separate, serving/compile_passes.py; run 23 ran the
# image's choice as "image-compiled-norm-quant" beside the image with vllm), and
# "image-compile-decode-sizes" (torch.compile graphs of their own for decode steps of 1, 2, 4 and 8 tokens:
# option.compile_decode_tokens 8, serving/compile_passes.py),
# "image-no-nvcc" (the image as its container runs it: no nvcc on PATH or under CUDA_HOME; the launcher chooses the
# same kernels with or without one, DeepGEMM off among them (serving/kernels.py); the image arm runs where the
# host's nvcc is found, as stock does), and
# "image-no-aot-compile" (vLLM's torch.compile without its AOT compile: option.aot_compile false),
# "image-compile-cache" (vLLM's compile cache written, AOT artifacts included, where the image in its container
# leaves it off: option.disable_compile_cache false, as with a cache volume), "image-spawn" (vLLM's engine core
# started as a fresh interpreter that imports torch and vLLM again, as `vllm serve` does, where the image forks it:
# option.worker_multiproc_method spawn),
# "image-candidates" (the image with the files of --candidate-configs laid over configs/: how a config file not yet
# shipped is gated beside the image), and "image-exec" (the launcher execs `vllm serve` in a fresh interpreter rather
# than run vLLM's CLI in its own process, which imported vLLM to check the settings: what engine_in_process, the
# image's default, saves of start to ready). Not measured, started for what their logs say:
# "stock-debug" (stock at VLLM_LOGGING_LEVEL=DEBUG: why each MoE backend ahead of the chosen one was rejected) and
# "stock-no-nvcc" (stock with nvcc off PATH and CUDA_HOME, as in the image's runtime base: what FlashInfer's JIT
# does there). A static-scale stock start compiles FlashInfer's fused_moe_90 for over 12 minutes on an H200: give
# that model --ready-timeout 1800.
# Image arms that differ from "image" by one vLLM engine flag (without its leading dashes -> value) rather than a
# setting of the table: "image-attn-one-split" (FlashAttention 3's decode steps in CUDA graphs on one KV split, so
# without its combine kernel: vLLM's attention_config flash_attn_max_num_splits_for_cuda_graph 1; vLLM captures them
# with up to 32 splits, and FlashAttention then runs its combine kernel after every layer's attention whatever the
# context; SGLang's decode steps run no combine kernel, run 15's profile). A measure of that kernel's cost at the
# bench's short contexts, not a default: on one split a few long contexts run on as many thread blocks as the layer
# has KV heads. "image-one-api-server" (vLLM's one API server process in front of the engine core, api_server_count
# 1, where the image runs four, each with the container's middleware): what a burst of streamed requests' HTTP
# parsing, tokenization and streaming in one Python process costs its first token (runs 43 and 44 ran the image with
# one as "image", beside "image-api-servers", four).
# Arms that differ from theirs ("stock") by vLLM environment variables only: "stock-debug".
ARM_ENV: dict[str, dict[str, str]] = {
    "stock-debug": {"VLLM_LOGGING_LEVEL": "DEBUG"},
}
IMAGE_ARM_ENGINE_ARGS: dict[str, dict[str, str]] = {
    "image-attn-one-split": {"attention-config": '{"flash_attn_max_num_splits_for_cuda_graph": 1}'},
    "image-one-api-server": {"api-server-count": "1"},
}
IMAGE_ARM_SETTINGS: dict[str, dict[str, object]] = {
    "image": {},
    "image-stock-order": {"fp8_moe_stock_order": True},
    "image-vllm-quant": {"fp8_moe_one_launch_quant": False},
    "image-vllm-topk": {"moe_one_pass_topk": False},
    "image-eager-prefill": {"cuda_graph_max_tokens": 0},
    # vLLM's default cudagraph_mode FULL_AND_PIECEWISE: a step with prompt tokens runs piecewise, attention eager
    # between the graph pieces of every layer (the image runs every step in one graph: cuda_graph_full_steps)
    "image-piecewise-prompts": {"cuda_graph_full_steps": False},
    # vLLM's graph memory as it sets it: the profile's extrapolation from the largest two full graphs (patch 0014
    # off) and FlashAttention's split bound at every graph size (patch 0015 off)
    "image-graph-estimate": {"cuda_graph_profile_all": False, "flash_attn_graph_split_tokens": 0},
    "image-bf16-router": {"moe_router_fp32_logits": False},
    "image-cutlass-dense": {"block_fp8_small_m_triton": False},
    "image-gemv-silu": {"moe_decode_gemv_silu": True},
    "image-qk-norm-rope": {"qk_norm_rope_fusion": True},
    "image-vllm-norm-quant": {"norm_quant": "vllm"},
    "image-separate-norm-quant": {"norm_quant": "separate"},
    "image-compile-decode-sizes": {"compile_decode_tokens": 8},
    "image-no-aot-compile": {"aot_compile": False},
    "image-compile-cache": {"disable_compile_cache": False},
    "image-spawn": {"worker_multiproc_method": "spawn"},
    "image-exec": {"engine_in_process": False},
    "image-no-nvcc": {},  # its environment hides nvcc (servers.server_command)
    "image-candidates": {},  # its configs_dir is made per run (servers.candidate_configs_dir)
    **{arm: {} for arm in IMAGE_ARM_ENGINE_ARGS},  # one vLLM flag each, no setting of the table
}
# What the image's launcher decides from the container's own filesystem, which the bench's host does not have:
# VLLM_CACHE_ROOT on the container's overlay root, so its compile cache off (serving/compile_cache.py; on a host's
# disk the launcher keeps vLLM's default). Every image arm runs with these unless its own settings say otherwise.
CONTAINER_SETTINGS: dict[str, object] = {"disable_compile_cache": True}
# The peers a user would pick instead of the image, each from a runtime of its own (bench/e2e/servers.py PEERS says
# which settings of theirs match which of vLLM's, and why): "sglang" (SGLang 0.5.21's own server, its default MoE
# runner, on the image's torch 2.13), "vllm-latest" (stock vLLM 0.34.0 on torch 2.14, with the stock arm's engine
# flags) and "sglang-latest" (SGLang 0.5.23, the newest, on torch 2.14.1, started as "sglang" is). A run refuses
# them unless their runtime is given (--sglang-python, --vllm-latest-python, --sglang-latest-python).
SGLANG_ARMS = ("sglang", "sglang-latest")
PEER_ARMS = ("sglang", "vllm-latest", "sglang-latest")
CANDIDATES_ARM = "image-candidates"
QK_NORM_ROPE_ARM = "image-qk-norm-rope"
NORM_QUANT_ARMS = ("image-vllm-norm-quant", "image-separate-norm-quant")
COMPILE_SIZES_ARM = "image-compile-decode-sizes"
NO_NVCC_ARM = "image-no-nvcc"
ATTN_ONE_SPLIT_ARM = "image-attn-one-split"
ONE_API_SERVER_ARM = "image-one-api-server"
PIECEWISE_PROMPTS_ARM = "image-piecewise-prompts"
NO_AOT_COMPILE_ARM = "image-no-aot-compile"
COMPILE_CACHE_ARM = "image-compile-cache"
SPAWN_ARM = "image-spawn"
EXEC_ARM = "image-exec"
MEASURED_ARMS = ("stock", "image", "image-stock-order", "image-vllm-quant", "image-vllm-topk", "image-eager-prefill",
                 "image-bf16-router", "image-cutlass-dense", "image-gemv-silu", QK_NORM_ROPE_ARM, *NORM_QUANT_ARMS,
                 COMPILE_SIZES_ARM, NO_NVCC_ARM, ATTN_ONE_SPLIT_ARM, PIECEWISE_PROMPTS_ARM, NO_AOT_COMPILE_ARM,
                 COMPILE_CACHE_ARM, SPAWN_ARM, EXEC_ARM, ONE_API_SERVER_ARM, CANDIDATES_ARM, *PEER_ARMS)
# Block FP8, the stock arms: the linear layers on vLLM's prebuilt CUTLASS block-scaled kernel, the kernel the image
# chooses itself (serving/kernels.py). vLLM's default there is FlashInfer's DeepGEMM kernel, built with nvcc at start
# and followed by DeepGEMM's JIT warm-up of 512 shapes (42-48 minutes on an H200 by its own estimate), beyond one
# session's device time.
BLOCK_FP8_ENGINE_ARGS = (("linear-backend", "cutlass"),)
# The engine flags an image arm carries: the workload's own settings (lengths, batch, memory; servers.engine_args)
# and the bench's instruments (JIT-compile lines, the profiler), nothing the container would choose itself; the arms
# of IMAGE_ARM_ENGINE_ARGS add their one flag.
WORKLOAD_ENGINE_ARGS = ("max-num-seqs", "max-model-len", "gpu-memory-utilization", "kv-cache-memory-bytes")
INSTRUMENT_ENGINE_ARGS = ("jit-monitor-verbose", "profiler-config")
# Every GPU model has the Q/K norm + RoPE arm, the norm + quantization arms, the decode compile sizes, the image
# without nvcc, the one-split attention arm, the piecewise-prompts arm, the image without vLLM's AOT compile, with its
# compile cache, with its engine core spawned, the exec'ing launcher, with one API server, the candidates arm and
# the peers, less the arms of Qwen3's attention (FlashAttention 3) where its preset has MLA; a run starts the
# candidates arm and the peers only when --arms names them.
PASS_ARMS = (QK_NORM_ROPE_ARM, *NORM_QUANT_ARMS, COMPILE_SIZES_ARM, NO_NVCC_ARM, ATTN_ONE_SPLIT_ARM,
             PIECEWISE_PROMPTS_ARM, NO_AOT_COMPILE_ARM, COMPILE_CACHE_ARM, SPAWN_ARM, EXEC_ARM, ONE_API_SERVER_ARM)
QWEN3_ATTENTION_ARMS = (QK_NORM_ROPE_ARM, ATTN_ONE_SPLIT_ARM, PIECEWISE_PROMPTS_ARM)


def _with_shared_arms(m: Model) -> Model:
    mla = m.spec.arch == "deepseek_v3"
    passes = tuple(a for a in PASS_ARMS if not (mla and a in QWEN3_ATTENTION_ARMS))
    return replace(m, arms=(*m.arms, *passes, CANDIDATES_ARM, *PEER_ARMS))


MODELS = tuple(_with_shared_arms(m) for m in (
    Model("qwen3-235b-tp8-tensor", "qwen3-235b-a22b-tp8", "tensor",
          ("stock", "image", "image-vllm-quant", "image-vllm-topk", "image-eager-prefill", "stock-debug")),
    # Static activation scales: the only per-tensor checkpoints FlashInfer CUTLASS MoE accepts, so
    # the one case where the routing patch changes stock's backend.
    Model("qwen3-235b-tp8-static", "qwen3-235b-a22b-tp8", "static",
          ("stock", "image", "image-stock-order", "stock-no-nvcc")),
    Model("deepseek-v3-tp8-block", "deepseek-v3-tp8", "block", engine_args=BLOCK_FP8_ENGINE_ARGS),
    Model("qwen3-coder-480b-tp8-tensor", "qwen3-coder-480b-a35b-tp8", "tensor",
          ("stock", "image", "image-vllm-quant", "image-vllm-topk")),
    # The official block-FP8 checkpoints as vLLM's recipes deploy them: one expert-parallel rank, or one TP4 rank.
    Model("qwen3-235b-ep8-block", "qwen3-235b-a22b-ep8", "block",
          ("stock", "image", "image-vllm-topk", "image-eager-prefill", "image-bf16-router", "image-cutlass-dense",
           "image-gemv-silu", "image-graph-estimate"),
          engine_args=BLOCK_FP8_ENGINE_ARGS),
    Model("qwen3-coder-480b-ep8-block", "qwen3-coder-480b-a35b-ep8", "block", ("stock", "image", "image-gemv-silu"),
          engine_args=BLOCK_FP8_ENGINE_ARGS),
    Model("deepseek-v3-ep8-block", "deepseek-v3-ep8", "block", engine_args=BLOCK_FP8_ENGINE_ARGS),
    Model("qwen3-235b-tp4-block", "qwen3-235b-a22b-tp4", "block", engine_args=BLOCK_FP8_ENGINE_ARGS),
    Model("qwen3-coder-480b-tp4-block", "qwen3-coder-480b-a35b-tp4", "block", engine_args=BLOCK_FP8_ENGINE_ARGS),
    # DeepSeek-V3's TP8 rank in its own architecture (MLA, grouped sigmoid routing, shared expert, dense first layers)
    Model("deepseek-v3-tp8-mla-block", "deepseek-v3-tp8-mla", "block", engine_args=BLOCK_FP8_ENGINE_ARGS),
))
# The embedded bf16 tiny model: a check of the bench itself on the CPU engine (--models tiny-cpu), stock and image
# only (the peers' runtimes are GPU builds).
CPU_CHECK = Model("tiny-cpu", "", "")
ARMS = tuple(sorted({arm for m in MODELS for arm in m.arms}))
# What --arms starts when not given: every arm but the peers and the candidates arm, which need their runtime or
# their files given.
DEFAULT_ARMS = tuple(a for a in ARMS if a not in (*PEER_ARMS, CANDIDATES_ARM))


def chosen_models(names: list[str]) -> list[Model]:
    """The models to run, in the order given (a session puts first the model it must not lose when its device
    lease ends), each once."""
    by_name = {m.name: m for m in MODELS + (CPU_CHECK,)}
    return [by_name[n] for n in dict.fromkeys(names)]


def make_model(m: Model, models_dir: Path) -> Path:
    """The model's weights in models_dir/NAME, kept there between runs (serving.tiny_model --reuse), written by a
    child process so that their memory (tens of GB for the DeepSeek-V3 shard) goes back before the servers start."""
    out = models_dir / m.name
    cmd = [sys.executable, "-m", "bench.e2e.shards", "--out", str(out), "--reuse", *tiny_model_args(m)]
    subprocess.run(cmd, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)  # its stdout: the folder's path
    return out
