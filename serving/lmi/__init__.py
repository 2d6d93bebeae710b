"""LMI/TGI request bodies on SageMaker's /invocations, inside vLLM's own HTTP server."""
