"""The launcher's HTTP server under load, on any machine (loopback only).

- load: many concurrent clients, every answer checked;
- lmi_vs_openai: one workload through LMI and OpenAI request bodies;
- api_server_cpu: the API server processes' CPU time per streamed request of a burst;
- middleware_overhead: the container's ASGI middleware against the bare app (in-process).
"""
