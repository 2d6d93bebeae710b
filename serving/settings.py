"""The one table of settings the container understands, and what is derived from it.

Each setting is declared once, as a `Setting` row of SETTINGS: its canonical key (the `option.<key>` of
serving.properties), the LMI aliases users bring, extra environment names from the TGI/HF convention, the vLLM
flag it becomes, its parser (whose return type is the value's type), its default, its help and the reasons
behind the default (`why`). Everything else comes from this table: the environment names (`OPTION_<KEY>` for
the key and every alias, `SM_VLLM_<FLAG>` for the flag), their precedence (`rank`), the typed `Settings` object
the launcher hands on (one field per row), the dry-run report, `--list-settings`, and docs/settings.md
(`python -m serving.settings_doc --write`). Adding a setting is adding a row.

Keys that are not declared here but are arguments of the installed vLLM's OpenAI server pass through unchanged
(see `vllm_args.py`).
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Iterable, Mapping

from .paths import CONFIGS_DIR
from .settings_model import Level, Setting, rank, sm_vllm_name, value_type
from .settings_parsers import (DTYPE_ALIASES, Context, SettingValueError, expand_tp, flag_set, parse_bool,
                               parse_device_name, parse_dtype, parse_int, parse_non_negative_int, parse_path,
                               parse_positive_int, parse_str, parse_tp)

__all__ = ["BY_ENV", "BY_FLAG", "BY_KEY", "DTYPE_ALIASES", "SETTINGS", "TABLE", "Context", "Level", "Setting",
           "SettingValueError", "Settings", "engine_value", "expand_tp", "flag_set", "looks_secret", "markdown_table",
           "parse_bool", "parse_device_name", "parse_dtype", "parse_int", "parse_non_negative_int", "parse_path",
           "parse_positive_int", "parse_str", "parse_tp", "rank", "settings_class", "sm_vllm_name", "to_environment",
           "value_type"]

SETTINGS: tuple[Setting, ...] = (
    Setting("model_id", "Model to serve: hub id, local folder, or s3://bucket/prefix/ (downloaded before start). "
            "Unset: the model in the model directory, else the embedded tiny model.",
            flag="--model", env=("MODEL_ID", "HF_MODEL_ID"), example="Qwen/Qwen3-235B-A22B-FP8"),
    Setting("revision", "Model revision (branch, tag or commit) for a hub id.",
            flag="--revision", env=("REVISION", "HF_MODEL_REVISION", "HF_REVISION")),
    Setting("tensor_parallel_size", "Tensor parallel degree; `max` uses every visible GPU. Unset: every visible "
            "GPU (1 on the CPU build or with no GPU).",
            parse=parse_tp, flag="--tensor-parallel-size", aliases=("tensor_parallel_degree",),
            env=("NUM_SHARD", "SM_NUM_GPUS", "TENSOR_PARALLEL_DEGREE"), example="max", contextual=expand_tp),
    Setting("max_num_seqs", "Most sequences batched at once (LMI: max_rolling_batch_size).",
            parse=parse_int, flag="--max-num-seqs", aliases=("max_rolling_batch_size",), env=("MAX_BATCH_SIZE",)),
    Setting("max_num_batched_tokens", "Most tokens in one engine step (LMI: max_rolling_batch_prefill_tokens).",
            parse=parse_int, flag="--max-num-batched-tokens", aliases=("max_rolling_batch_prefill_tokens",),
            env=("MAX_BATCH_PREFILL_TOKENS",)),
    Setting("cuda_graph_max_tokens", "Largest engine step, in tokens, run as a CUDA graph, prefill steps included "
            "(at most max_num_batched_tokens); 0: vLLM's own sizes only, which gives graph memory back to the KV "
            "cache. Not applied where compilation_config sets capture sizes, with enforce_eager, or on the CPU build "
            "(default 0 there).",
            parse=parse_non_negative_int, default=8192, example="0",
            why="Above vLLM's own sizes (2 x max_num_seqs, at most 512) the launcher captures sizes a quarter of a "
                "power of two apart, which pad a step by under 25%. Run eagerly, each fused-MoE layer costs about a "
                "millisecond of Python on the host: on an H200 an 896-token step of the 94-layer Qwen3-235B EP8 "
                "shard took 175 ms for about 30 ms of GPU work. With graphs up to 8192 tokens (where SGLang 0.5.21 "
                "captures its prefill steps too) that shard served 1.13x stock vLLM's output tokens/s at 8 and 32 "
                "clients (0.99x with vLLM's own sizes) at a third of its time to first token, for 1.2 GiB more graph "
                "memory, taken from the KV cache, and about 20 s more start."),
    Setting("cuda_graph_profile_all", "false: vLLM's memory profile extrapolates what the full CUDA graphs take from "
            "the largest two, instead of capturing every one and setting aside their sum before it sizes the KV "
            "cache (patch 0014; that capture runs once more at start).", parse=parse_bool,
            env=("LMI_CUDA_GRAPH_PROFILE_ALL",), engine_env="LMI_CUDA_GRAPH_PROFILE_ALL",
            why="Under the launcher's full graphs vLLM's extrapolation sets aside more than the graphs take, and "
                "the KV cache gets the difference less: with it the image held 0.81x stock vLLM's KV tokens at the "
                "same gpu_memory_utilization; with this and flash_attn_graph_split_tokens, 0.99x (the performance "
                "page's KV pool tables)."),
    Setting("flash_attn_graph_split_tokens", "In a CUDA-graph step of more than N tokens FlashAttention splits the "
            "KV into at most S x N / tokens parts (S: vLLM's bound, 32 unless attention_config sets "
            "flash_attn_max_num_splits_for_cuda_graph), so the graph's split buffers hold no more than an N-token "
            "step's (patch 0015; 512 unless set); 0: S for every step.", parse=parse_non_negative_int,
            env=("LMI_FLASH_ATTN_GRAPH_SPLIT_TOKENS",), engine_env="LMI_FLASH_ATTN_GRAPH_SPLIT_TOKENS", example="0",
            why="Under full graphs up to 8,192 tokens a graph of that size holds 1 GiB of split buffers on the "
                "Qwen3-235B EP8 shard (8 heads of 128, 32 splits), memory the KV cache then lacks; a step of that "
                "many tokens occupies every SM without splitting. With it and cuda_graph_profile_all the image's "
                "KV cache holds 0.99x stock vLLM's tokens (the performance page's KV pool tables)."),
    Setting("cuda_graph_full_steps", "Run every CUDA-graph step, steps with prompt tokens too, as one graph with "
            "attention inside (vLLM's cudagraph_mode FULL); false: vLLM's FULL_AND_PIECEWISE. Not applied where "
            "compilation_config sets cudagraph_mode or compiles nothing, with enforce_eager, a KV connector "
            "(kv_transfer_config), LoRA (enable_lora, also set by an adapters/ folder), or on the CPU build (default "
            "false there).",
            parse=parse_bool, default=True, example="false",
            why="FULL_AND_PIECEWISE runs a step with prompt tokens piecewise, attention eager between the graph "
                "pieces of every layer: such a step took 55-68 ms of host time whatever its size, against 5-6 ms for "
                "a decode step. On a 94-layer Qwen3-235B EP8 shard one graph per step gave 1.01-1.04x the "
                "output tokens/s at 1-128 clients and 0.64x the time to first token at one client, for 1.6 GiB more "
                "graph memory (taken from the KV cache). Where the model's attention backend cannot run such a step "
                "in one graph (FlashInfer, the MLA backends), vLLM keeps its own mode and says so."),
    Setting("quantization", "Quantization method, e.g. fp8 (LMI: quantize).",
            flag="--quantization", aliases=("quantize",), env=("QUANTIZE", "HF_MODEL_QUANTIZE")),
    Setting("trust_remote_code", "Run the model repository's own Python code.",
            parse=parse_bool, flag="--trust-remote-code",
            env=("TRUST_REMOTE_CODE", "HF_TRUST_REMOTE_CODE", "HF_MODEL_TRUST_REMOTE_CODE")),
    Setting("max_model_len", "Context length (prompt + output; TGI: MAX_TOTAL_TOKENS).", parse=parse_int,
            flag="--max-model-len", env=("MAX_TOTAL_TOKENS",)),
    Setting("dtype", "Weight and activation dtype (auto, bfloat16, float16, ...; LMI's bf16, fp16, fp32 too).",
            parse=parse_dtype, flag="--dtype", env=("DTYPE",)),
    Setting("gpu_memory_utilization", "Share of GPU memory vLLM may use (TGI: CUDA_MEMORY_FRACTION).",
            flag="--gpu-memory-utilization", env=("CUDA_MEMORY_FRACTION",)),
    Setting("enable_expert_parallel", "Expert parallelism for MoE layers.",
            parse=parse_bool, flag="--enable-expert-parallel"),
    Setting("moe_backend", "The MoE kernel backend (e.g. triton, flashinfer_cutlass, deep_gemm); unset: triton for an "
            "FP8 checkpoint on the GPU build (serving/kernels.py), vLLM's choice otherwise. flashinfer_cutlass and "
            "deep_gemm compile with nvcc at start.", flag="--moe-backend"),
    Setting("fp8_moe_stock_order", "true: vLLM's stock FP8 MoE backend order instead of the patched Triton-first "
            "order for per-tensor FP8 on Hopper (patch 0001).", parse=parse_bool, env=("LMI_FP8_MOE_STOCK_ORDER",),
            engine_env="LMI_FP8_MOE_STOCK_ORDER"),
    Setting("fp8_moe_one_launch_quant", "false: vLLM's two-kernel dynamic per-tensor FP8 quantization of the fused "
            "MoE's inputs instead of the one-launch kernel for decode sizes (patch 0006).", parse=parse_bool,
            env=("LMI_FP8_MOE_ONE_LAUNCH_QUANT",), engine_env="LMI_FP8_MOE_ONE_LAUNCH_QUANT"),
    Setting("moe_one_pass_topk", "false: vLLM's topk_softmax op for the MoE router's softmax top-k instead of the "
            "one-pass kernel for batches of up to 4,096 tokens (patch 0007).", parse=parse_bool,
            env=("LMI_MOE_ONE_PASS_TOPK",), engine_env="LMI_MOE_ONE_PASS_TOPK"),
    Setting("moe_router_fp32_logits", "false: the MoE router's bf16 gate gives bf16 logits, as the model sets it, "
            "instead of float32 logits where the model leaves its dtype unset (Qwen3-MoE, DeepSeek-V3), which run "
            "vLLM's one-kernel ll_bf16_gemm for up to 16 tokens on Hopper (patch 0009).", parse=parse_bool,
            env=("LMI_MOE_ROUTER_FP32_LOGITS",), engine_env="LMI_MOE_ROUTER_FP32_LOGITS"),
    Setting("block_fp8_small_m_triton", "false: vLLM's CUTLASS kernel for every block-FP8 dense GEMM instead of the "
            "split-K Triton tier for decode batches where configs/ holds a small-M file for the layer's shape "
            "(patch 0010).", parse=parse_bool, env=("LMI_BLOCK_FP8_SMALL_M_TRITON",),
            engine_env="LMI_BLOCK_FP8_SMALL_M_TRITON"),
    Setting("block_fp8_decode_gemv", "false: CUTLASS for the token counts of a small-M file's GEMV entries instead of "
            "the matrix-vector kernel (patch 0010; configs/ holds them for the Qwen3-Coder EP8 rank's qkv and o_proj "
            "at one token).",
            parse=parse_bool, env=("LMI_BLOCK_FP8_DECODE_GEMV",), engine_env="LMI_BLOCK_FP8_DECODE_GEMV"),
    Setting("moe_decode_gemv", "false: vLLM's fused_moe_kernel for every fused-MoE batch instead of the matrix-vector "
            "kernel where a tuned config entry of a block-FP8 shape holds a GEMV dict (few routed pairs, no expert "
            "map; patch 0011; configs/ holds them for the Qwen3-235B and Qwen3-Coder EP8 ranks).", parse=parse_bool,
            env=("LMI_MOE_DECODE_GEMV",),
            engine_env="LMI_MOE_DECODE_GEMV"),
    Setting("moe_decode_gemv_expert_map", "true: under expert parallelism (an expert map) too, a fused-MoE batch of a "
            "few routed pairs whose tuned entry holds a GEMV dict runs patch 0011's matrix-vector kernel over its "
            "mapped expert ids, another rank's pairs written as zeros.", parse=parse_bool,
            env=("LMI_MOE_DECODE_GEMV_EXPERT_MAP",), engine_env="LMI_MOE_DECODE_GEMV_EXPERT_MAP",
            why="Off until an engine has run it under an expert map. Its kernels took 0.72-0.93x vLLM's time at 1-4 "
                "tokens on the Qwen3-Coder EP8 rank and 0.82-1.11x on the Qwen3-235B rank."),
    Setting("moe_decode_gemv_silu", "true: where patch 0011's matrix-vector kernel runs the w2 GEMM, it also runs "
            "SiLU-and-mul and the FP8 group quantization of its input, from the w13 output, instead of vLLM's "
            "act_and_mul and quantization kernels before it (patch 0012).", parse=parse_bool,
            env=("LMI_MOE_DECODE_GEMV_SILU",), engine_env="LMI_MOE_DECODE_GEMV_SILU",
            why="Off: slower on the H200, 13.0 against 12.3 µs a layer at one token."),
    Setting("qk_norm_rope_fusion", "true: vLLM's fused Q/K RMSNorm + RoPE CUDA kernel (its enable_qk_norm_rope_fusion "
            "compilation pass) instead of the Triton kernel torch.compile generates for Qwen3-style attention. Not "
            "applied on the CPU build, with enforce_eager, or where compilation_config sets the pass.",
            parse=parse_bool, default=False,
            why="Off until the engine bench measures it. Inductor's autotuner picks the generated kernel's block sizes "
                "anew at each start; on the H200 the picks seen take 1.6 to 4.3 µs a layer at one token."),
    Setting("norm_quant", "How the RMSNorm before a block-FP8 linear layer and the FP8 quantization of its output "
            "run: compiled (torch.compile generates both), separate (the norm generated, the quantization vLLM's "
            "op) or vllm (vLLM's fused CUDA kernel). Not applied without block-FP8 weights, on the CPU build, with "
            "enforce_eager, or where compilation_config sets the pass or names quant_fp8.",
            choices=("vllm", "separate", "compiled"), default="compiled", instead="vllm, separate or compiled",
            why="compiled turns vLLM's fuse_norm_quant pass off and runs its quantization op in its native form "
                "(custom_ops -quant_fp8); where Inductor compiles nothing it is not applied. On the Qwen3-Coder EP8 "
                "shard (H200) the generated kernels take 4.6 µs a layer at one token against 7.6 for vLLM's fused "
                "kernel; that shard serves 1.018x, 1.020x and 1.011x "
                "the tokens/s at 1, 8 and 32 clients, and starts 12-20 s later."),
    Setting("compile_decode_tokens", "Decode batch sizes up to this many tokens get torch.compile graphs of their own "
            "(compilation_config compile_sizes), their generated kernels specialized to the size; each size adds "
            "compile time at start. 0: one graph for every size, as vLLM does; not applied on the CPU build, with "
            "enforce_eager, where Inductor compiles nothing, or where compilation_config sets compile_sizes.",
            parse=parse_non_negative_int, default=0, example="8",
            why="Specialized to one token, the norm and quantization took 2.9 µs in a kernel bench against 4.6 µs "
                "in the engine's graph for every size; but at 8 the Qwen3-Coder EP8 shard's one-client step was "
                "slower (ITL 3.84 against 3.71 ms) and its start took 515 against 225 s."),
    Setting("flashinfer_sampler", "FlashInfer's top-k/top-p sampler instead of vLLM's own PyTorch sampler.",
            parse=parse_bool, default=False, env=("VLLM_USE_FLASHINFER_SAMPLER",),
            engine_env="VLLM_USE_FLASHINFER_SAMPLER",
            why="Off: FlashInfer compiles it with nvcc at the first start on every fresh host, which takes minutes "
                "against the health-check timeout and fails where there is no nvcc."),
    Setting("aot_compile", "false: vLLM's torch.compile without its AOT compile (VLLM_USE_AOT_COMPILE=0), which "
            "serializes the compiled model under VLLM_CACHE_ROOT at a cold start so that a later start skips "
            "Dynamo's trace. Unset: vLLM's default (on).",
            parse=parse_bool, env=("VLLM_USE_AOT_COMPILE",), engine_env="VLLM_USE_AOT_COMPILE",
            why="A container whose cache does not survive restarts never reads the artifacts, but the compiled model "
                "runs faster with them: off, the per-tensor Qwen3-235B TP8 shard at 94 layers (an H100) compiled in "
                "97 against 121 s and was ready after 283 against 301 s, at 0.996-1.014x the tokens/s, but its "
                "one-client ITL p90 and p99 were higher (6.4-7.1 against 5.9-6.0 ms, 8.3-9.5 against 6.3-8.3)."),
    Setting("disable_compile_cache", "true: vLLM's torch.compile neither writes nor reads its cache under "
            "VLLM_CACHE_ROOT (VLLM_DISABLE_COMPILE_CACHE=1); the AOT compile stays unless aot_compile says otherwise. "
            "Unset: true where VLLM_CACHE_ROOT lies on the container's own filesystem (its overlay root, a tmpfs), "
            "vLLM's default (the cache on) where it lies on one that lasts or compilation_config names a cache_dir.",
            parse=parse_bool, env=("VLLM_DISABLE_COMPILE_CACHE",), engine_env="VLLM_DISABLE_COMPILE_CACHE",
            why="A cache on the container's own filesystem ends with the container, so no later start reads it, and "
                "writing it costs start time: the AOT artifacts took 16-17 of the 72 s of torch.compile on the "
                "per-tensor Qwen3-235B TP8 shard at 94 layers (an H100). Without them, and with "
                "worker_multiproc_method fork, that shard was ready after 188.1 against SGLang 0.5.21's 209.5 s. "
                "vLLM alone would turn the AOT compile off with the cache; the launcher keeps it "
                "(serving/compile_cache.py)."),
    Setting("worker_multiproc_method", "How vLLM starts its engine-core process and, under tensor parallelism, its "
            "workers (VLLM_WORKER_MULTIPROC_METHOD): fork, as copies of the process that already imported torch and "
            "vLLM, or spawn, as fresh interpreters (what `vllm serve` picks when the variable is unset). vLLM itself "
            "spawns where CUDA was initialized before the fork, and its CPU platform always spawns.",
            choices=("fork", "spawn"), default="fork", instead="fork or spawn",
            env=("VLLM_WORKER_MULTIPROC_METHOD",), engine_env="VLLM_WORKER_MULTIPROC_METHOD",
            why="Spawned interpreters import torch and vLLM again: on an H100 host the engine core's first log line "
                "came 10 s after the API server's spawned and 1 s forked. Forked, the per-tensor Qwen3-235B TP8 "
                "shard at 94 layers was ready after 188.1 against SGLang 0.5.21's 209.5 s."),
    Setting("port", "HTTP port.", parse=parse_positive_int, default=8080, flag="--port",
            env=("SAGEMAKER_BIND_TO_PORT",)),
    Setting("host", "Address to listen on.", default="0.0.0.0", flag="--host"),
    Setting("group_size", "Hosts serving one model together: a leader, which serves HTTP, and headless workers "
            "(docs/multi-host.md). Unset or 1: this host alone.", parse=parse_positive_int, env=("LWS_GROUP_SIZE",),
            example="2"),
    Setting("group_rank", "This host's rank in its group: 0 the leader, 1 and up the workers.",
            parse=parse_non_negative_int, env=("LWS_WORKER_INDEX",), example="1"),
    Setting("group_leader_address", "The group leader's host name or IP address, as every host of the group reaches "
            "it.", env=("LWS_LEADER_ADDRESS",), example="10.0.0.1"),
    Setting("group_form", "How a group splits the model: tp (tensor parallel across the hosts) or dp_ep (data "
            "parallel with expert parallelism). Unset: dp_ep for a Mixture-of-Experts checkpoint, tp otherwise.",
            choices=("tp", "dp_ep"), instead="tp or dp_ep", example="tp",
            why="vLLM's multi-host recipe for DeepSeek-V3 on two 8-GPU hosts is data parallel 16 with expert "
                "parallelism; dense models split by tensor parallelism."),
    Setting("group_port", "The group link's TCP port on the leader: each worker's launcher holds a connection to "
            "it, and a host that leaves ends the group.", parse=parse_positive_int, default=29600),
    Setting("group_join_timeout", "Seconds the leader waits for every worker to join the group link, and a worker "
            "for the leader's link to answer, before the start fails.", parse=parse_positive_int, default=600),
    Setting("max_request_bytes", "Largest request body /invocations accepts (413 beyond it); SageMaker's real-time "
            "payload limit is 6 MiB.", parse=parse_positive_int, default=6 * 1024 * 1024,
            env=("SAGEMAKER_MAX_REQUEST_SIZE", "SERVING_MAX_REQUEST_BYTES"),
            engine_env="SERVING_MAX_REQUEST_BYTES"),
    Setting("client_body_timeout", "Seconds a client may send nothing while its request head or body is incomplete; "
            "then it gets 408 and its connection is closed (nginx's client_header_timeout and client_body_timeout). "
            "It bounds silence, not the whole upload: a slow body that keeps arriving is read to its end.",
            parse=parse_positive_int, default=60, env=("SERVING_CLIENT_BODY_TIMEOUT",),
            engine_env="SERVING_CLIENT_BODY_TIMEOUT"),
    Setting("shutdown_timeout", "Graceful drain on SIGTERM (scale-in): new requests and /ping get 503 while "
            "requests in flight get this many seconds to finish; then any left end with an error record and the "
            "process exits 0.",
            parse=parse_positive_int, default=60, flag="--shutdown-timeout", aliases=("drain_timeout",),
            why="60 s is SageMaker's real-time invocation timeout: no request in flight could run longer."),
    Setting("engine_auto_recovery", "When the engine process dies, start it again in the same server process "
            "(/ping answers 503 meanwhile, streams in flight end with their error record) instead of exiting 4; one "
            "API server process only (AWS's vLLM image's name).", parse=parse_bool, default=True,
            env=("ENGINE_AUTO_RECOVERY",), engine_env="SERVING_ENGINE_AUTO_RECOVERY", example="false",
            reader="engine watch (engine)",
            why="A start in place keeps the API server process (its imports, HTTP server and model files) and "
                "starts the engine processes only. On the 2-core CPU build (tiny MoE model, every default, the "
                "machine shared and busy) the server served again 126 s after its engine core was killed, against "
                "418 s for a fresh start of the launcher beside it (46 s against 188 s eager); replacing a "
                "container adds the instance, the image and the model download on top. Three starts is the AWS "
                "vLLM image's default."),
    Setting("engine_max_start_retries", "How many times engine_auto_recovery starts the engine again over the "
            "server's life; a death after that exits 4 (AWS's vLLM image's name).", parse=parse_non_negative_int,
            default=3, env=("ENGINE_MAX_START_RETRIES",), engine_env="SERVING_ENGINE_MAX_START_RETRIES",
            example="1", reader="engine watch (engine)"),
    Setting("hf_token", "Hub token for gated models; passed to vLLM in the environment, never printed.",
            env=("HUGGING_FACE_HUB_TOKEN", "HF_TOKEN"), secret=True, engine_env="HF_TOKEN"),
    Setting("api_key", "Bearer key vLLM's server requires on its /v1 routes (not /ping or /invocations, which "
            "SageMaker guards); passed in the environment, never printed.",
            secret=True, engine_env="VLLM_API_KEY"),
    Setting("engine", "LMI's engine; serving.properties may write it top-level (engine=Python).", top_level=True,
            choices=("python",),
            instead="this container runs vLLM in one Python process: engine=Python (LMI's MPI engine is for lmi-dist "
                    "and TensorRT-LLM)", no_effect="the engine is always vLLM's, in Python"),
    Setting("rolling_batch", "LMI's batching engine.",
            choices=("vllm", "auto", "disable"),
            instead="this container always runs vLLM: use vllm, or leave it unset",
            no_effect="the engine is always vLLM, batching continuously"),
    # -- names LMI, the SageMaker SDK and TGI write that have no effect here (accepted, one log line each) --
    Setting("model_loading_timeout", "LMI's model-loading timeout.", env=("SAGEMAKER_STARTUP_TIMEOUT",),
            no_effect="the engine loads without a timeout of its own; SageMaker bounds the start with the endpoint's "
                      "ContainerStartupHealthCheckTimeoutInSeconds (set that at least this high)"),
    Setting("predict_timeout", "LMI's per-request timeout.", env=("SAGEMAKER_MODEL_SERVER_TIMEOUT_SECONDS",),
            no_effect="a request runs until it finishes or its client goes away (SageMaker's own invocation timeout "
                      "applies)"),
    Setting("min_workers", "LMI's model-server worker count.", aliases=("minWorkers",), top_level=True,
            env=("SAGEMAKER_MODEL_SERVER_WORKERS", "SAGEMAKER_NUM_MODEL_WORKERS", "SERVING_MIN_WORKERS"),
            no_effect="one vLLM engine serves the model on tensor_parallel_size GPUs; there are no worker copies"),
    Setting("max_workers", "LMI's model-server worker count.", aliases=("maxWorkers",), top_level=True,
            env=("SERVING_MAX_WORKERS",),
            no_effect="one vLLM engine serves the model on tensor_parallel_size GPUs; there are no worker copies"),
    Setting("job_queue_size", "LMI's request queue length (LMI: MAX_CONCURRENT_REQUESTS).", top_level=True,
            env=("MAX_CONCURRENT_REQUESTS", "SERVING_JOB_QUEUE_SIZE"),
            no_effect="vLLM's scheduler queues every request beyond max_num_seqs; there is no separate queue limit"),
    Setting("batch_size", "DJL's dynamic batch size.", top_level=True, env=("SERVING_BATCH_SIZE",),
            no_effect="vLLM batches continuously (max_num_seqs), not in DJL's fixed batches"),
    Setting("max_batch_delay", "DJL's dynamic batching delay.", top_level=True, env=("SERVING_MAX_BATCH_DELAY",),
            no_effect="vLLM batches continuously (max_num_seqs), not in DJL's fixed batches"),
    Setting("parallel_loading", "LMI's parallel loading of model copies.",
            no_effect="one engine, one copy of the model: nothing to load in parallel"),
    Setting("async_mode", "LMI's async vLLM handler.", no_effect="vLLM's async engine is always used"),
    Setting("entrypoint", "LMI's inference handler.", aliases=("entryPoint",),
            choices=("djl_python.lmi_vllm.vllm_async_service", "djl_python.huggingface", "djl_python.vllm"),
            instead="a custom LMI handler (model.py as the entry point) is not supported; this container serves "
                    "vLLM with LMI's request schema, and applies the @input_formatter / @output_formatter functions "
                    "of model.py without it: leave option.entryPoint unset",
            no_effect="the built-in vLLM handler is always used"),
    Setting("enable_streaming", "LMI's streaming switch (old releases).",
            no_effect="streaming is chosen per request (\"stream\": true)"),
    Setting("output_formatter", "LMI's stream format for OpenAI bodies on /invocations: json (vLLM's server-sent "
            "events) or jsonlines (LMI: one chunk object a line, no `data:`). LMI bodies always stream jsonlines "
            "(TGI's events with tgi_compat).", choices=("json", "jsonlines"), default="json",
            instead="a custom output formatter is a function marked @output_formatter in model.py",
            engine_env="LMI_OUTPUT_FORMATTER"),
    Setting("tgi_compat", "true: TGI's answer shapes for LMI bodies (a list of generated_text objects, `data:` "
            "server-sent events when streaming), so Hugging Face clients read them.", parse=parse_bool,
            default=False, engine_env="LMI_TGI_COMPAT"),
    Setting("fail_fast", "DJL's exit-on-failure switch.", top_level=True, env=("SERVING_FAIL_FAST",),
            no_effect="the container always exits when the engine dies (exit code 4)"),
    Setting("task", "The model's task (HF_TASK).", env=("HF_TASK",), choices=("text-generation",),
            instead="this container serves text generation only",
            no_effect="text generation is what the container serves"),
    Setting("load_models", "DJL's model list.", env=("SERVING_LOAD_MODELS",),
            no_effect="the model comes from model_id or the model directory"),
    Setting("paged_attention", "LMI's paged-attention switch (old releases).",
            no_effect="vLLM always uses paged attention"),
    Setting("max_input_tokens", "TGI's largest prompt (MAX_INPUT_TOKENS, MAX_INPUT_LENGTH).",
            env=("MAX_INPUT_LENGTH", "MAX_INPUT_TOKENS"),
            no_effect="vLLM refuses a prompt when prompt + max_new_tokens exceeds max_model_len (TGI: "
                      "MAX_TOTAL_TOKENS); set that instead"),
    Setting("max_batch_total_tokens", "TGI's token budget of a batch.", env=("MAX_BATCH_TOTAL_TOKENS",),
            no_effect="vLLM sizes its KV cache from gpu_memory_utilization (TGI: CUDA_MEMORY_FRACTION)"),
    Setting("max_best_of", "TGI's request limit.", env=("MAX_BEST_OF",), no_effect="vLLM checks requests itself"),
    Setting("max_stop_sequences", "TGI's request limit.", env=("MAX_STOP_SEQUENCES",),
            no_effect="vLLM checks requests itself"),
    Setting("max_top_n_tokens", "TGI's request limit.", env=("MAX_TOP_N_TOKENS",),
            no_effect="vLLM checks requests itself (max_logprobs)"),
    Setting("messages_api_enabled", "TGI's chat switch.", env=("MESSAGES_API_ENABLED",),
            no_effect="chat bodies (messages) are always accepted on /invocations"),
    Setting("sharded", "TGI's sharding switch.", env=("SHARDED",),
            no_effect="tensor_parallel_size decides how the model is split"),
    Setting("cpu_offload_gb", "GiB of weights each GPU offloads to CPU memory (LMI: cpu_offload_gb_per_gpu).",
            flag="--cpu-offload-gb", aliases=("cpu_offload_gb_per_gpu",)),
    Setting("lora_extra_vocab_size", "LMI's LoRA extra vocabulary (its vLLM guide lists it).",
            no_effect="vLLM 0.32 has no extra LoRA vocabulary; adapters use the model's"),
    Setting("max_seq_len_to_capture", "Older vLLM's CUDA-graph length limit (LMI examples set it).",
            no_effect="vLLM 0.32 sizes CUDA graphs by its compilation config (option.compilation_config)"),
    Setting("enable_stateful_sessions", "SageMaker's sticky sessions: {\"requestType\": \"NEW_SESSION\"} and "
            "\"CLOSE\" bodies on /invocations, X-Amzn-SageMaker-Session-Id on requests (LMI's default: on).",
            parse=parse_bool, default=True, env=("SAGEMAKER_ENABLE_STATEFUL_SESSIONS",),
            engine_env="SAGEMAKER_ENABLE_STATEFUL_SESSIONS"),
    Setting("sessions_path", "Where session data is kept (default: /dev/shm/sagemaker_sessions).",
            env=("SAGEMAKER_SESSIONS_PATH",), engine_env="SAGEMAKER_SESSIONS_PATH"),
    Setting("sessions_expiration", "Seconds a session stays valid (default: 1200).", parse=parse_positive_int,
            env=("SAGEMAKER_SESSIONS_EXPIRATION",), engine_env="SAGEMAKER_SESSIONS_EXPIRATION"),
    Setting("install_requirements", "Install the model folder's requirements.txt at start with pip into the cache "
            "folder (never the image's own packages) and put it on the engine's path; a failed install stops the "
            "start. Without network, pip's environment (PIP_FIND_LINKS, PIP_NO_INDEX) and wheels in a requirements/ "
            "folder beside the file serve it.",
            parse=parse_bool, default=True, env=("STANDARD_AUTO_INSTALL_REQ",)),
    Setting("engine_in_process", "true: run vLLM's CLI (`vllm serve`) in the launcher's own process, which already "
            "imported vLLM, rather than exec a new interpreter; it execs anyway where the engine's Python path (the "
            "user's code, requirements.txt's packages) shadows a module it imported, or where its parse ran without "
            "a device. false: always exec.",
            parse=parse_bool, default=True, env=("SERVING_ENGINE_IN_PROCESS",),
            why="The engine skips a second import of vLLM: the per-tensor Qwen3-235B TP8 shard at 94 layers was "
                "ready after 154 against 164 s (an H100, each server started alone, at 0.998x the one-client "
                "tokens/s), the CPU engine after 38 against 48 s."),
    Setting("download_dir", "Where an s3:// model is downloaded (default: a folder under the cache directory).",
            env=("SERVING_DOWNLOAD_DIR",)),
    Setting("model_dir", "The model directory: serving.properties, and the model itself when it holds config.json.",
            parse=parse_path, default=Path("/opt/ml/model"), env=("SERVING_MODEL_DIR",), location=True),
    Setting("cache_dir", "The project's cache: the embedded tiny model, s3:// downloads, the tests' pinned wheels.",
            parse=parse_path, default=Path.home() / ".cache" / "lmi-fp8", default_text="~/.cache/lmi-fp8",
            env=("LMI_CACHE_DIR",), location=True),
    Setting("configs_dir", "Tuned fused-MoE configs handed to vLLM as VLLM_TUNED_CONFIG_FOLDER (unless that is set).",
            parse=parse_path, default=CONFIGS_DIR,
            default_text="configs/ beside serving/", env=("LMI_CONFIGS_DIR",), location=True),
    Setting("configs_device", "The GPU (e.g. NVIDIA_H200) whose tuned files in configs_dir (fused-MoE configs, patch "
            "0010's small-M files) this GPU reads for a shape where neither configs_dir nor vLLM holds one of its own. "
            "Unset: an H100 80GB HBM3 reads the H200's, any other GPU only its own; none: only its own; a GPU that "
            "configs_dir has no files of stops the start.",
            parse=parse_device_name, example="NVIDIA_H200",
            why="An H100 80GB HBM3 is the H200's chip with less memory bandwidth. On it the H200's fused-MoE entries "
                "took 0.85-1.00x the time of vLLM's default config at 1-512 tokens and patch 0011's matrix-vector "
                "entries 0.78-0.95x, and the Qwen3-235B EP8 shard served 1.089x the tokens/s at 8 clients and 1.053x "
                "at 32 with the small-M files than without. The launcher lays the files out under the cache "
                "directory under this GPU's name (serving/tuned_configs.py)."),
    Setting("custom_code_dir", "Where the engine looks for the user's code (model.py, CUSTOM_SCRIPT_FILENAME) "
            "and requirements.txt. Unset: the model's own folder (local, the model directory, or the s3:// "
            "download), else the model directory; handed to mhcs in the engine.",
            parse=parse_path, env=("SAGEMAKER_MODEL_PATH",), location=True, reader="launcher and mhcs (engine)"),
    Setting("custom_script_filename", "The script mhcs loads from the code folder: its custom_sagemaker_ping_handler "
            "and custom_sagemaker_invocation_handler functions and its decorated handlers; LMI's "
            "@input_formatter / @output_formatter functions in it apply to every request.", default="model.py",
            env=("CUSTOM_SCRIPT_FILENAME",), location=True, reader="launcher and mhcs (engine)"),
    Setting("custom_ping_handler", "`file.py:function` or `module:function` answering /ping (AWS's vLLM image's "
            "name; beats the script's handlers). During the drain /ping answers 503 whatever it says.",
            env=("CUSTOM_FASTAPI_PING_HANDLER",), location=True, reader="mhcs (engine)"),
    Setting("custom_invocation_handler", "`file.py:function` or `module:function` answering every /invocations "
            "body, LMI bodies included (AWS's vLLM image's name; beats the script's handlers).",
            env=("CUSTOM_FASTAPI_INVOCATION_HANDLER",), location=True, reader="mhcs (engine)"),
    Setting("custom_pre_process", "`file.py:function` that gets each request (FastAPI Request) before vLLM's routes "
            "answer it (AWS's vLLM image's name).", env=("CUSTOM_PRE_PROCESS",), location=True,
            reader="mhcs (engine)"),
    Setting("custom_post_process", "`file.py:function` that gets each response of vLLM's routes before it is sent "
            "(AWS's vLLM image's name).", env=("CUSTOM_POST_PROCESS",), location=True, reader="mhcs (engine)"),
    Setting("custom_pre_post_process", "`file.py:function`, a FastAPI HTTP middleware around vLLM's routes; beats "
            "custom_pre_process and custom_post_process.", env=("CUSTOM_FASTAPI_MIDDLEWARE_PRE_POST_PROCESS",),
            location=True, reader="mhcs (engine)"),
    Setting("python", "The Python entrypoint.sh starts the launcher with (default: the project's .venv, else "
            "python3); read by entrypoint.sh itself.", env=("SERVING_PYTHON",), location=True),
    Setting("cuda_compat_dir", "CUDA's forward-compatibility libraries, put first on the library path when the host "
            "driver is older than theirs; read by entrypoint.sh itself.", parse=parse_path,
            default=Path("/usr/local/cuda/compat"), env=("SERVING_CUDA_COMPAT_DIR",), location=True),
    Setting("driver_version_file", "Where entrypoint.sh reads the host's NVIDIA driver version.", parse=parse_path,
            default=Path("/proc/driver/nvidia/version"), env=("SERVING_DRIVER_VERSION_FILE",), location=True),
)

TABLE: dict[str, Setting] = {s.key: s for s in SETTINGS}
assert len(TABLE) == len(SETTINGS), "a key declared twice"

BY_KEY: dict[str, Setting] = {}  # option keys (canonical and aliases) -> setting
for _s in SETTINGS:
    for _k in _s.option_keys:
        assert _k not in BY_KEY, f"option key {_k} declared twice"
        BY_KEY[_k] = _s

BY_ENV: dict[str, Setting] = {}
for _s in SETTINGS:
    for _e in _s.env_names:
        assert _e not in BY_ENV, f"environment name {_e} declared twice"
        BY_ENV[_e] = _s

BY_FLAG: dict[str, Setting] = {s.flag: s for s in SETTINGS if s.flag}


def settings_class(rows: Iterable[Setting]) -> type:
    """A frozen, slotted dataclass with one field per row, in order: typed `value_type(row)`, defaulting to the
    row's default, secrets out of its repr."""
    fields = [(s.key, value_type(s), dataclasses.field(default=s.default, repr=not s.secret)) for s in rows]
    doc = ("The effective value of every declared setting (None: unset and no default), typed and frozen: a "
           "misspelt setting is an AttributeError, not a silent None. One field per row of serving.settings.SETTINGS.")
    return dataclasses.make_dataclass("Settings", fields, frozen=True, slots=True,
                                      namespace={"__module__": __name__, "__doc__": doc})


Settings = settings_class(SETTINGS)


def engine_value(key: str, env: Mapping[str, str]) -> object:
    """A setting the launcher handed to the engine process in its `engine_env` variable, parsed
    as the table says (unset: the table's default)."""
    s = TABLE[key]
    raw = env.get(s.engine_env or "", "").strip()
    if not raw:
        return s.default
    try:
        return s.parse(raw)
    except SettingValueError as e:
        raise SettingValueError(f"{s.engine_env}={raw!r}: {e}") from None


def to_environment(values: Mapping[str, object]) -> dict[str, str]:
    """Environment that makes the container resolve these values (e.g. for a SageMaker model):
    each key, declared or a vLLM argument, under its `OPTION_<KEY>` name (a location under its own)."""
    out = {}
    for key, v in values.items():
        s = TABLE.get(key) or BY_KEY.get(key)
        name = s.env_names[0] if s is not None else f"OPTION_{key.upper()}"
        out[name] = ("true" if v else "false") if isinstance(v, bool) else str(v)
    return out


SECRET_LAST_WORDS = ("token", "secret", "password", "apikey")
SECRET_LAST_PAIRS = (("api", "key"), ("access", "key"), ("secret", "key"))


def looks_secret(name: str) -> bool:
    """Names that end in the secret itself: hf_token, api_key, AWS_SECRET_ACCESS_KEY.
    Not long_prefill_token_threshold or return_tokens_as_token_ids (a masked number would surprise)."""
    words = name.lower().replace("-", "_").split("_")
    return words[-1] in SECRET_LAST_WORDS or tuple(words[-2:]) in SECRET_LAST_PAIRS


def flag_cell(s: Setting) -> str:
    """The reference's vLLM-flag column: the flag, "no effect", or who reads the setting."""
    return f"`{s.flag}`" if s.flag else "no effect" if s.no_effect else f"({s.reader or 'launcher'})"


def default_cell(s: Setting) -> str:
    return f"`{s.default_text or s.default}`" if s.default is not None else ""


def meaning(s: Setting) -> str:
    """The help text with what the table says about accepted values and settings without effect."""
    text = s.help
    if s.choices:
        text += f" Accepted: {', '.join(s.choices)}; anything else stops the start ({s.instead})."
    if s.no_effect:
        text += f" No effect here: {s.no_effect}."
    return text


def markdown_table() -> str:
    """The settings table `--list-settings` prints: names, vLLM flag, default and meaning of each setting."""
    rows = ["| serving.properties | environment | vLLM flag | default | meaning |", "|---|---|---|---|---|"]
    for s in SETTINGS:
        keys = ", ".join(f"`option.{k}`" for k in s.option_keys) or "(environment only)"
        envs = ", ".join(f"`{e}`" for e in s.env_names)
        rows.append(f"| {keys} | {envs} | {flag_cell(s)} | {default_cell(s)} | {meaning(s)} |")
    return "\n".join(rows)
