"""Benchmarks of the image, by what they measure. bench/README.md says how to run each; bench/data/ holds the
recorded results the performance page cites.

- e2e/ (`python -m bench.e2e`): the engine bench: shard models served by the image, stock vLLM and the peers side by
  side on one GPU; e2e/runbook.sh runs it, with the kernel benches and config tuning, on a GPU host.
- kernels/: the kernels the patch series changes, on a GPU: the fused-MoE harness (`python -m bench.kernels.moe`:
  tune, bench, compile counts; moe.make_configs and moe.gemv_configs write configs/), the decode step's dense GEMMs
  (decode_gemm; small_m_configs writes patch 0010's files from it), patch 0006's quantization (fp8_quant) and
  patch 0007's routing (router_topk).
- http/: the launcher's HTTP server on any machine (loopback): load (many clients, every answer checked),
  lmi_vs_openai (one workload through LMI and OpenAI bodies), api_server_cpu (the API server processes' CPU time per
  streamed request), middleware_overhead (the container's ASGI middleware against the bare app).
"""
