"""The image against stock vLLM 0.32.0 in the real engine, side by side on one GPU (and against its peers).

    python -m bench.e2e --stock-site DIR --image-python PY --models-dir DIR --out DIR [--reps 3] [--profile]
        [--layers N [MODEL=N ...]]   # e.g. --layers 94 qwen3-coder-480b-tp8-tensor=40: deployment depth
        [--arms stock image sglang vllm-latest --sglang-python PY --vllm-latest-python PY]   # the peers too
        [--arms ... sglang-latest --sglang-latest-python PY]   # and the newest SGLang
        [--cross-check N]            # then N repetitions by vLLM's own client, `vllm bench serve`
        [--workload default long mixed decode-heavy burst]   # the workload shapes, each in turn
        [--kv-pool sized --gpu-mem G [--max-model-len N]]     # each engine sizes its own KV pool

Every arm is an HTTP server on loopback: "image" is this project's launcher (./entrypoint.sh serve:
the patched vLLM, configs/, the image's settings); "stock" is vLLM's own OpenAI server from the
pristine wheel (DIR first on PYTHONPATH: its own configs, no series, vLLM's defaults). One model
at a time: its arms start at once from empty caches (each its own HOME, vLLM, Triton and
FlashInfer cache), so their start times are side by side under the same load (--start-alone:
one at a time, each ready before the next starts, each start time its own); once all are up,
the arms are measured in turn (stock, image, image, stock, stock, image, ...: every other
repetition the other way round) after one unmeasured warm-up pass each; then the model's servers
are stopped and the next model starts.

Per arm and repetition:
- output tokens/s with 1, 8, 32 and 128 concurrent clients (non-streamed OpenAI completions,
  fixed prompt and output lengths, ignore_eos), the server's max-num-seqs 128;
- time to first token and inter-token latency, p50 and p99, and output tokens/s of those streamed requests
  (stream_tok_s), 1, 8 and 32 clients (each chunk that carries a token counts, with text or not, as vLLM's own
  client counts them);
and per server: time from start to the first /ping 200, the first request's time to first token,
the time to first token of the first request at each new concurrency (the warm-up pass), and
the count of vLLM's "JIT compilation during inference" warnings, and the fused-MoE config files its
engine looked for and did not find (it ran its default config there; e2e.md names them: a GPU the
tuned files do not reach), and the nvcc its environment shows a JIT (none for the image arms with --image-no-nvcc,
as their container runs; the host's for stock and the peers). With --profile, a torch-profiler
trace of a short run at 1 and 32 clients gives each arm's GPU time by kernel class.

Workload shapes (--workload, workload.shapes): "default" is the sweep above at --in-tokens and --out-tokens;
"long" (prompts of 2,048-3,904 tokens), "mixed" (prompts and outputs drawn from a range around a mean, seeded),
"decode-heavy" (128-token prompts, 1,024 output tokens) run the same sweep with their lengths; "burst" sends 128
streamed requests released at once, measured as one run. Each shape gets its own warm-up pass and repetitions; each
result names its shape (today's stay where they were, every other under the model's workloads.NAME). The profiles
and the cross-check keep today's shape.

KV pools (--kv-pool): "fixed" gives every arm --kv-bytes (vLLM's --kv-cache-memory-bytes; SGLang the tokens it
holds); "sized" gives none, so each engine sizes its pool from --gpu-mem and the context (--max-model-len, a
deployment's 16,384 unless given; a shard is made with as many positions), as a deployment's is: the arms start one
at a time (--start-alone), each sizing its pool with no other start's allocations in the way, and SGLang's
--mem-fraction-static is the same share of the GPU over the memory free at its start. Every server's KV tokens, KV
and CUDA-graph memory are read from its log (kv_pool) and shown in e2e.md beside each shape's figures.
--one-at-a-time serves each arm alone, started, measured and stopped before the next, so that each may take a
deployment's share of the GPU (--gpu-mem 0.9); a ratio then pairs repetitions that ran one after the other.

Both arms take OpenAI bodies on /v1/completions (stock vLLM has no LMI bodies); what LMI bodies
cost on top is measured by bench/http/lmi_vs_openai.py. Results: OUT/e2e.json and OUT/e2e.md.

The peers a user would pick instead, each from a Python of its own (tools/peer_runtimes.py makes them on the GPU
host), measured in the same turns and compared with the image figure by figure (e2e.md's image/peer table):
"sglang" is SGLang 0.5.21's own server (python -m sglang.launch_server, its default MoE runner), "vllm-latest" stock
vLLM 0.34.0 on torch 2.14 (vllm serve, the stock arm's flags), "sglang-latest" SGLang 0.5.23 on torch 2.14.1, started
as "sglang" is. servers.PEERS says which SGLang setting carries which
of vLLM's, and why (the same KV budget as tokens, the same context length and batch limit); SGLang is ready at
/health (its /ping answers before its warm-up), and its compiles while serving are not counted (it logs none).
--arms names them (the default leaves them out); a peer named without its runtime's Python is refused.

With --cross-check N, every measured arm is measured again after the bench's own repetitions by a client this
project did not write, vLLM's `vllm bench serve` (random prompts of the same lengths, ignore_eos, greedy, the same
concurrencies, the arms alternating; it streams), and e2e.md sets its paired ratios beside the bench's own.

Before anything is made or started, a run that the host cannot hold is refused, naming the most layers that fit: the
checkpoints on the disk under --models-dir, and each model's servers, started together, in the GPU's free memory.

The parts: models (the models, their arms and their weights), config (one run's settings), servers (each arm's
server: command, environment, what its log says), workload (the HTTP client, the shapes, prompts and measured runs),
crosscheck (the same arms by vLLM's own client), traces (GPU time by kernel class from the profiler), report (the
tables of e2e.md), kv_pool (each server's KV pool from its log; e2e.md's pool and workload tables), capacity (what
the host's disk and GPU hold), run (one run, model by model), cli (the command line).
"""
