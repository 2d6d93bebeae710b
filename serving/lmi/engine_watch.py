"""Exit the container non-zero when the engine dies, so SageMaker replaces it.

What vLLM 0.32 does by itself when the EngineCore process dies: /ping turns 503, and a
5-second watchdog stops uvicorn, after which the API server returns from main() and the
process exits with status 0 -- which reads as a clean stop, not a failure.

We tell the two cases apart by who asked: a requested stop (SIGTERM/SIGINT) goes through
AsyncLLM.shutdown() before the engine goes away; an engine crash marks the client errored
without it. An errored engine with no shutdown requested ends the process at once with
ExitCode.ENGINE_DIED (after vLLM's own clean-up of the engine processes has run) -- or, where engine auto-recovery
is on and allows another start (serving/recovery.py), starts the engine again in place and keeps serving.

With more than one API server process (api_server_count) only the launcher's process watches the engine core's
processes: when one dies it ends the API server processes and exits 1, and the streams in flight are cut. So there
the launcher's process (`end_api_servers_on_engine_death`) first tells each API server process that the engine died
(ENGINE_DIED_SIGNAL), which fails its requests in flight as vLLM does when it sees the death itself (each stream ends
with its error record) and exits ExitCode.ENGINE_DIED; then the launcher's process exits ExitCode.ENGINE_DIED too.
"""
from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
import time

from ..exit_codes import ExitCode
from ..recovery import Recovery, start_again

log = logging.getLogger("vllm.lmi")  # a child of vLLM's logger: same handlers and format

POLL_S = 0.25
# A stop signal sent to the whole process group reaches the EngineCore as early as the API
# server, so the engine may look dead a moment before vLLM's handler calls shutdown().
SIGNAL_GRACE_S = 1.0
CLEANUP_WAIT_S = 5.0
ENGINE_DIED_SIGNAL = signal.SIGUSR1  # from the launcher's process to each API server process: the engine died
# How long the launcher's process gives the API server processes to end their streams and exit by themselves
# (a poll, the grace above, and the streams' last bytes) before vLLM stops the rest.
API_SERVERS_EXIT_S = 4.0


class EngineWatch:
    def __init__(self, engine_client, app_state=None) -> None:
        self.client = engine_client  # the app's engine client: a new one after each recovery
        self.first = engine_client  # the client vLLM's server was started with and keeps calling
        self.state = app_state  # the app's state, where a recovery swaps a new engine client in (None: no recovery)
        self.recovery = Recovery.from_env(os.environ)
        self.shutdown_requested = False
        self._task: asyncio.Task | None = None
        original = engine_client.shutdown

        def shutdown(*args, **kwargs):  # vLLM calls this on SIGTERM/SIGINT and at normal exit, on its first client
            self.shutdown_requested = True
            try:
                return original(*args, **kwargs)
            finally:
                if self.client is not engine_client:  # a recovery's client: vLLM does not know it
                    self.client.shutdown(*args, **kwargs)

        engine_client.shutdown = shutdown

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._task = loop.create_task(self._run(), name="lmi-engine-watch")
        loop.add_signal_handler(ENGINE_DIED_SIGNAL, self.engine_died_elsewhere)

    def engine_died_elsewhere(self) -> None:
        """The launcher's process saw the engine core die (ENGINE_DIED_SIGNAL): fail every request in flight with
        vLLM's EngineDeadError, as vLLM's engine client does when it sees the death itself; the watch then exits."""
        from vllm.v1.engine.exceptions import EngineDeadError

        core = getattr(self.client, "engine_core", None)
        queue = getattr(core, "outputs_queue", None)
        if queue is None:  # an engine client we do not know: exit without failing its requests first
            log.error("the engine process died (the launcher's process says so)")
            self.exit_now()
        core.resources.engine_dead = True
        queue.put_nowait(EngineDeadError())

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
                    await self._recover_or_exit()

    async def _recover_or_exit(self) -> None:
        """Start the engine again in place while engine_max_start_retries allows (serving/recovery.py), else exit."""
        while True:
            refusal = "no app state to swap a new engine into" if self.state is None else \
                self.recovery.refusal(self.client)
            if refusal is not None:
                if self.recovery.enabled:
                    log.error("the engine process died; not starting it again: %s", refusal)
                self.exit_now()
            self.recovery.starts += 1
            log.error("the engine process died; starting it again in place (start %d of %d)",
                      self.recovery.starts, self.recovery.max_start_retries)
            t0 = time.monotonic()
            try:
                new = await start_again(self.state, self.client)
            except Exception as e:  # noqa: BLE001 -- a failed start counts as one; the next or the exit follows
                log.error("the engine did not start again: %s: %s", type(e).__name__, e)
                continue
            if self.shutdown_requested:  # a stop arrived while the engine started: it is not the app's to keep
                new.shutdown()
                return
            self.client = new
            self.first.do_log_stats = self._log_stats  # vLLM's periodic stats log calls the first client
            log.warning("the engine serves again, %.1f s after it was found dead (%d start(s) left)",
                        time.monotonic() - t0 + SIGNAL_GRACE_S, self.recovery.left)
            return

    async def _log_stats(self) -> None:
        await self.client.do_log_stats()

    def exit_now(self) -> None:
        log.error("the engine process died; exiting with status %d so the platform replaces "
                  "this container", ExitCode.ENGINE_DIED)
        # vLLM's engine monitor thread stops the remaining engine processes; let it finish (an API server process
        # of several owns none: the launcher's process stops them).
        core = getattr(self.client, "engine_core", None)
        owns_engines = getattr(getattr(core, "resources", None), "engine_manager", None) is not None
        fin = getattr(core, "_finalizer", None) if owns_engines else None
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


def end_api_servers_on_engine_death() -> None:
    """In the launcher's process, before vLLM's CLI runs in it (serving.engine_cli, in process or exec'd): where
    `vllm serve` runs more than one API server process and an engine core process dies, tell each API server process
    (ENGINE_DIED_SIGNAL), give them API_SERVERS_EXIT_S to end their streams and exit, and exit ExitCode.ENGINE_DIED
    (vLLM stops what is left)."""
    from vllm.entrypoints.cli import serve

    wait = serve.wait_for_completion_or_failure

    def wait_or_end(*args, **kwargs):
        try:
            return wait(*args, **kwargs)
        except RuntimeError:
            servers = getattr(kwargs.get("api_server_manager"), "processes", None) or []
            engines = kwargs.get("engine_manager")
            if getattr(engines, "failed_proc_name", None) is None and not any(
                    p.exitcode == ExitCode.ENGINE_DIED for p in servers):
                raise  # not the engine: vLLM's own handling
        log.error("the engine process died; ending the API server processes, then exiting with status %d so "
                  "the platform replaces this container", ExitCode.ENGINE_DIED)
        for p in servers:
            if p.exitcode is None:
                os.kill(p.pid, ENGINE_DIED_SIGNAL)
        deadline = time.monotonic() + API_SERVERS_EXIT_S
        for p in servers:
            p.join(max(deadline - time.monotonic(), 0.0))
        raise SystemExit(ExitCode.ENGINE_DIED)

    serve.wait_for_completion_or_failure = wait_or_end
