"""Benchmarks: the H200 fused-MoE kernel harness (bench/moe/) and the HTTP load generator (lmi_vs_openai)."""
