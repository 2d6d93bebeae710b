"""Exit the container non-zero when the engine dies, so SageMaker replaces it.

What vLLM 0.32 does by itself when the EngineCore process dies: /ping turns 503, and a
5-second watchdog stops uvicorn, after which the API server returns from main() and the
process exits with status 0 -- which reads as a clean stop, not a failure.

We tell the two cases apart by who asked: a requested stop (SIGTERM/SIGINT) goes through
AsyncLLM.shutdown() before the engine goes away; an engine crash marks the client errored
without it. An errored engine with no shutdown requested ends the process at once with
ExitCode.ENGINE_DIED (after vLLM's own clean-up of the engine processes has run).
"""
from __future__ import annotations

import asyncio
import logging
import os
import sys
import time

from ..exit_codes import ExitCode

log = logging.getLogger("vllm.lmi")  # a child of vLLM's logger: same handlers and format

POLL_S = 0.25
# A stop signal sent to the whole process group reaches the EngineCore as early as the API
# server, so the engine may look dead a moment before vLLM's handler calls shutdown().
SIGNAL_GRACE_S = 1.0
CLEANUP_WAIT_S = 5.0


class EngineWatch:
    def __init__(self, engine_client) -> None:
        self.client = engine_client
        self.shutdown_requested = False
        self._task: asyncio.Task | None = None
        original = engine_client.shutdown

        def shutdown(*args, **kwargs):  # vLLM calls this on SIGTERM/SIGINT and at normal exit
            self.shutdown_requested = True
            return original(*args, **kwargs)

        engine_client.shutdown = shutdown

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="lmi-engine-watch")

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()

    def engine_died(self) -> bool:
        try:
            return bool(self.client.errored) and not self.shutdown_requested
        except Exception:  # an engine client we do not know: leave the decision to vLLM
            return False

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(POLL_S)
            if self.engine_died():
                await asyncio.sleep(SIGNAL_GRACE_S)
                if self.engine_died():
                    self.exit_now()

    def exit_now(self) -> None:
        log.error("the engine process died; exiting with status %d so the platform replaces "
                  "this container", ExitCode.ENGINE_DIED)
        # vLLM's engine monitor thread stops the remaining engine processes; let it finish.
        core = getattr(self.client, "engine_core", None)
        fin = getattr(core, "_finalizer", None)
        deadline = time.monotonic() + CLEANUP_WAIT_S
        while fin is not None and fin.alive and time.monotonic() < deadline:
            time.sleep(0.05)
        for h in logging.getLogger().handlers + logging.getLogger("vllm").handlers:
            try:
                h.flush()
            except Exception:
                pass
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(ExitCode.ENGINE_DIED)
