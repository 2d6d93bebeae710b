"""Shared fixtures: the real CPU vLLM engine, started by the launcher, for every HTTP test.

Starting the engine takes about a minute on this machine (the engine's own warm-up), so the session
shares its servers and starts them early; tests that must break a server start their own, or end a
shared one after its other users.
"""
from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any, Callable

import pytest

from check_script import Check, check_result
from tools import launcher_process
from tools.launcher_process import Server, free_port, stop  # noqa: F401  (re-exported for tests)

# Planted secrets: no log, argv, error message or error body may show them (tests/test_launcher_e2e.py).
PLANTED_SECRET = "hf_PLANTEDsecretVALUE123"
PLANTED_SECRETS = {
    "HF_TOKEN": PLANTED_SECRET,
    "AWS_ACCESS_KEY_ID": "AKIAPLANTEDKEYID4242",
    "AWS_SECRET_ACCESS_KEY": "PLANTEDawsSECRETaccessKEY/4242+abc",
    "AWS_SESSION_TOKEN": "PLANTEDawsSESSIONtoken4242",
    "OPTION_API_KEY": "sk-PLANTEDapiKEY4242",  # a setting marked secret: vLLM then guards /v1 with it
}


# The session's server runs every default, compiled execution included, and so does a server whose answers are
# compared with its answers (compiled and eager numerics differ: the compat server). The other servers test what
# does not depend on it and serve eager: a boot then skips torch.compile, 13 of its CPU-seconds here (init engine
# 14.3 s compiled, 1.2 s eager).
EAGER = {"OPTION_ENFORCE_EAGER": "true"}

# The environment every test server starts from: the session's, as it was before any test ran. Servers spawn
# while other tests run, and a test may set variables of its own (monkeypatch) that no server must inherit.
SESSION_ENV = dict(os.environ)

# (server, seconds from its spawn to /ping 200) of every server the session started
READY_TIMES: list[tuple[str, float]] = []
READY_TIMEOUT_S = 600  # several servers boot side by side on 2 cores while other tests run

_RUNNING: list[pytest.Item] = []  # the test being set up or run


def metric_total(exposition: str, name: str) -> float:
    """The sum of metric `name`'s samples over its label sets in a Prometheus text answer (a /metrics body)."""
    return sum(float(line.rsplit(" ", 1)[1]) for line in exposition.splitlines() if line.startswith(name + "{"))


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    _RUNNING[:] = [item]


def _check_engine_mark() -> None:
    # `make test-quick` leaves out the tests marked engine: every test that uses an engine server carries the mark
    item = _RUNNING[0] if _RUNNING else None
    assert item is None or item.get_closest_marker("engine"), f"{item.nodeid} uses the engine: mark it engine"


SERVER_NICE = 10  # the server under test must not starve the test client (launcher_process.yield_cpu)


def spawn_server(tmp: Path, env_extra: dict[str, str] | None = None, args: list[str] | None = None,
                 nice: int = SERVER_NICE) -> Server:
    """The launcher on a free loopback port, with planted secrets and the hub offline (loopback only), not yet
    ready (await_server waits for it)."""
    env = {**PLANTED_SECRETS, "HF_HUB_OFFLINE": "1", **(env_extra or {})}
    return launcher_process.spawn_launcher(tmp, env, args, nice=nice, base_env=SESSION_ENV)


def await_server(srv: Server, name: str) -> Server:
    _check_engine_mark()
    launcher_process.await_ready(srv, READY_TIMEOUT_S)
    READY_TIMES.append((name, srv.ready_s))
    return srv


def start_launcher(tmp: Path, env_extra: dict[str, str] | None = None, args: list[str] | None = None) -> Server:
    """spawn_server, then await_server: a server of the test's own."""
    _check_engine_mark()
    return await_server(spawn_server(tmp, env_extra, args), os.environ.get("PYTEST_CURRENT_TEST", "?").split(" ")[0])


def pytest_terminal_summary(terminalreporter):
    """Each engine server's time to ready: what the suite's engine tests wait for."""
    if READY_TIMES:
        terminalreporter.section("engine servers: spawn to ready (an early start's: to its first use, if later)")
        for name, seconds in READY_TIMES:
            terminalreporter.write_line(f"{seconds:6.1f} s  {name}")


# -- early starts --------------------------------------------------------------------------------
# Starting an engine is most of an engine test's time, and leaves a core idle (the server's processes import
# one after another). So every server the selected tests will use is spawned while the tests that need no engine
# run, which go first; the fixtures then wait for it. A server holds about 2 GiB, so the next one is spawned only
# while the machine has EARLY_MEMORY_FLOOR available; a test that needs a server not yet spawned spawns it itself.
# The starts share two cores, so each gets a CPU priority by its first use: the one the first engine test needs at
# SERVER_NICE, the next one step nicer, and so on (to 19). It is then ready first, and its tests run while the
# later ones still boot.

EARLY: dict[str, Callable[[Path, int], Any]] = {}  # fixture name -> its start, fn(tmp, nice) -> an object with .proc
EARLY_MEMORY_FLOOR = 5 << 30  # bytes of MemAvailable


def starts_early(fixture: str):
    """Register fn(tmp, nice) as the early start of `fixture`: made at the session's start when a selected test
    uses it, its processes at CPU priority `nice`."""
    def register(fn):
        EARLY[fixture] = fn
        return fn
    return register


TESTS = Path(__file__).resolve().parent
_BUILD = "import importlib, sys; from pathlib import Path; m, f = sys.argv[1].split(':'); " \
         "getattr(importlib.import_module(m), f)(Path(sys.argv[2]))"


def made_by_child(builder: str, out: Path) -> Path:
    """`out`, made by builder ("module:function" of tests/ or the repository, called with out) in a child Python.
    An early start's model folder is made so, never in the spawning thread: that thread runs beside the tests, and
    importing transformers there while a test imports vLLM in the main thread can leave a module half-initialized
    for the test ("cannot import name 'PreTrainedConfig' from 'transformers'")."""
    env = {**SESSION_ENV, "PYTHONPATH": os.pathsep.join([str(TESTS.parent), str(TESTS)])}
    done = subprocess.run([sys.executable, "-c", _BUILD, builder, str(out)], cwd=TESTS, env=env,
                          capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"{builder}({out}) failed with exit {done.returncode}:\n{done.stderr[-3000:]}")
    return out


def _memory_available() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


def _await_memory(closed: threading.Event) -> bool:
    """Wait until the machine has EARLY_MEMORY_FLOOR available; False when `closed` is set first."""
    while _memory_available() < EARLY_MEMORY_FLOOR:
        if closed.wait(1):
            return False
    return not closed.is_set()


def _first_use(session, registry: dict) -> list[str]:
    """The names of `registry` that the session's tests use as fixtures, in the tests' order."""
    return list(dict.fromkeys(name for item in session.items for name in item.fixturenames if name in registry))


class EarlyStarts:
    """The selected early starts, spawned by a thread in the order given (their first use), each once memory
    allows, at CPU priorities in that order."""

    def __init__(self, names: list[str], mktemp: Callable[[str], Path]):
        self.started: dict[str, Any] = {}
        self._nice = {name: min(19, SERVER_NICE + rank) for rank, name in enumerate(names)}
        self._mktemp = mktemp
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._spawn_all, args=(names,), daemon=True)
        self._thread.start()

    def _spawn_all(self, names: list[str]) -> None:
        for name in names:
            if not _await_memory(self._closed):
                return
            try:
                self.get(name)
            except Exception:  # noqa: BLE001 -- the test that needs it spawns it again and shows the error
                if self._closed.is_set():
                    return

    def get(self, name: str) -> Any:
        """The start of `name`, spawned now if the thread has not reached it (one spawn per name)."""
        with self._lock:
            if name not in self.started:
                if self._closed.is_set():
                    raise RuntimeError(f"early start {name} asked for after the session's servers were stopped")
                self.started[name] = EARLY[name](self._mktemp(name), self._nice.get(name, 19))
            return self.started[name]

    def close(self) -> None:
        with self._lock:
            self._closed.set()
        self._thread.join()
        for obj in self.started.values():
            stop(obj.proc)


@pytest.fixture(scope="session", autouse=True)
def early_starts(request, tmp_path_factory) -> EarlyStarts:
    # in the order of first use (the tests' order: pytest_collection_modifyitems)
    first_use = _first_use(request.session, EARLY)
    # the session's temporary root made here, before the thread: pytest makes it at its first use, and the thread's
    # first mktemp and a test's first tmp_path at once can each make one (a test then fails in setup: "... is not
    # a normalized and relative path")
    tmp_path_factory.getbasetemp()
    starts = EarlyStarts(first_use, tmp_path_factory.mktemp)
    yield starts
    starts.close()


def early(request, name: str) -> Any:
    """The early start of fixture `name` (spawned now if it was not yet, e.g. a fixture requested dynamically)."""
    return request.getfixturevalue("early_starts").get(name)


def pytest_collection_modifyitems(items):
    """The tests that need no engine first (while the early starts boot), then the engine's, then the tests that
    end a shared server (marked ends_shared_server), after every other test that uses it, and last the tests that
    read a check run in the background (check_fixture), by when most of those have run on the CPU left idle."""
    def group(item) -> int:
        if any(name in CHECKS for name in item.fixturenames):
            return 3
        if item.get_closest_marker("ends_shared_server"):
            return 2
        return 1 if item.get_closest_marker("engine") else 0
    items.sort(key=group)  # stable: file order within each group


# -- checks in the background --------------------------------------------------------------------
# A check script (tests/check_script.py) needs no engine but up to minutes of CPU (Triton's interpreter). The
# selected ones run from the session's start, as many at once as there are cores, each in a session of its own
# (ended with the suite's process: launcher_process.guarded) at the lowest CPU priority, so they take the CPU the
# other tests leave idle (the engine tests mostly wait on their servers); the tests that read them run last
# (pytest_collection_modifyitems) and wait for what is left.

CHECKS: dict[str, Callable[[Path], Check]] = {}  # fixture name -> fn(a temporary folder of its own) giving the check
CHECK_NICE = 19
CHECK_WAIT_S = 600  # from when a test starts waiting for its check, not from the check's start at CHECK_NICE


def check_fixture(name: str, make: Callable[[Path], Check]):
    """A module-scoped fixture `name` whose value is the JSON object of the check make(tmp) gives, run in the
    background from the session's start. Assign it to an attribute of the test module."""
    assert name not in CHECKS, f"two checks named {name}: a check's fixture name is the session's"
    CHECKS[name] = make

    @pytest.fixture(scope="module", name=name)
    def result(background_checks):
        return background_checks.result(name)
    return result


class _CheckRun:
    def __init__(self, check: Check):
        self.check = check
        self.proc: subprocess.Popen | None = None
        self.done = threading.Event()
        self.outcome: tuple[int, str, str] | None = None  # returncode, stdout, stderr


class BackgroundChecks:
    """The checks given, run in their order (their first use), as many at once as the machine has cores (a check is
    one busy process), each once memory allows; a check asked for that is not among them (a fixture requested
    dynamically) is made by make(name) and run when asked."""

    def __init__(self, checks: dict[str, Check], make: Callable[[str], Check] | None = None):
        self._make = make
        self._runs = {name: _CheckRun(check) for name, check in checks.items()}
        self._queue = list(self._runs.values())
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._threads = [threading.Thread(target=self._run_queue, daemon=True)
                         for _ in range(min(len(self._queue), len(os.sched_getaffinity(0))))]
        for thread in self._threads:
            thread.start()

    def _run_queue(self) -> None:
        while True:
            if not _await_memory(self._closed):
                return
            with self._lock:  # no check starts once close() began
                if self._closed.is_set() or not self._queue:
                    return
                run = self._queue.pop(0)
                self._start(run, CHECK_NICE)
            self._finish(run)

    @staticmethod
    def _start(run: _CheckRun, nice: int) -> None:
        try:
            run.proc = subprocess.Popen(launcher_process.guarded(run.check.command()), cwd=TESTS.parent,
                                        env=run.check.environ(SESSION_ENV), stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE, text=True, start_new_session=True)
        except OSError as e:
            run.outcome = (-1, "", f"the check could not start: {e}")
            run.done.set()
            return
        launcher_process.yield_cpu(run.proc.pid, nice)

    @staticmethod
    def _finish(run: _CheckRun) -> None:
        if run.proc is not None:
            out, err = run.proc.communicate()
            run.outcome = (run.proc.returncode, out, err)
            run.done.set()

    def result(self, name: str) -> dict:
        run = self._runs.get(name)
        if run is None:
            run = _CheckRun(self._make(name))
            self._start(run, 0)
            self._finish(run)
        if not run.done.wait(CHECK_WAIT_S):
            if run.proc is not None:
                stop(run.proc, grace=5)
            pytest.fail(f"{run.check.script} did not finish within {CHECK_WAIT_S} s of this test waiting for it")
        return check_result(run.check, *run.outcome)

    def close(self) -> None:
        with self._lock:
            self._closed.set()
        for run in self._runs.values():
            if run.proc is not None and run.proc.poll() is None:
                stop(run.proc, grace=5)
        for thread in self._threads:
            thread.join()


@pytest.fixture(scope="session", autouse=True)
def background_checks(request, tmp_path_factory) -> BackgroundChecks:
    def make(name: str) -> Check:
        return CHECKS[name](tmp_path_factory.mktemp(name))

    checks = BackgroundChecks({name: make(name) for name in _first_use(request.session, CHECKS)}, make)
    yield checks
    checks.close()


@starts_early("server")
def _session_server(tmp: Path, nice: int) -> Server:
    return spawn_server(tmp, nice=nice)


@pytest.fixture(scope="session")
def server(request) -> Server:
    """The launcher serving the embedded tiny model on the real CPU engine with every default (shared by the
    session; tests/test_lmi_engine_death.py kills its engine at the end)."""
    srv = await_server(early(request, "server"), "server (the session's)")
    yield srv
    stop(srv.proc)


@starts_early("adapter_server")
def _adapter_server(tmp: Path, nice: int) -> Server:
    mdir = made_by_child("adapter_model:adapter_model_dir", tmp / "model")
    return spawn_server(tmp, {"SERVING_MODEL_DIR": str(mdir), "OPTION_ENABLE_STATEFUL_SESSIONS": "true",
                              "OPTION_ENABLE_AUTO_TOOL_CHOICE": "true", "OPTION_TOOL_CALL_PARSER": "hermes",
                              "SERVING_ENGINE_IN_PROCESS": "false", "OPTION_API_SERVER_COUNT": "2", **EAGER},
                        nice=nice)


@pytest.fixture(scope="session")
def adapter_server(request) -> Server:
    """The launcher serving tests/adapter_model.py's tiny dense Qwen3 and its LoRA adapters, sticky sessions
    on (OPTION_ENABLE_STATEFUL_SESSIONS, LMI's name) and a tool-call parser, as LMI's tool-calling test model
    is configured (option.enable_auto_tool_choice, option.tool_call_parser), with `vllm serve` exec'd in a fresh
    interpreter (engine_in_process=false; every other server runs vLLM's CLI in the launcher's process, the
    default) and two API server processes (option.api_server_count 2, vLLM's flag; every other server runs one);
    shared by the session."""
    srv = await_server(early(request, "adapter_server"), "adapter_server")
    yield srv
    stop(srv.proc)


@starts_early("api_servers_server")
def _api_servers_server(tmp: Path, nice: int) -> Server:
    return spawn_server(tmp, {"OPTION_API_SERVER_COUNT": "2", **EAGER}, nice=nice)


@pytest.fixture(scope="session")
def api_servers_server(request) -> Server:
    """The launcher with two API server processes (option.api_server_count 2; the GPU build runs four), vLLM's CLI
    in its process, serving eager; shared by the session (tests/test_lmi_engine_death.py kills its engine at the
    end)."""
    srv = await_server(early(request, "api_servers_server"), "api_servers_server")
    yield srv
    stop(srv.proc)


@pytest.fixture(scope="session")
def va():
    """vLLM's own argument parser as the launcher reads it (serving/vllm_args.py), built once: plan() takes it."""
    from serving.vllm_args import VllmArgs
    return VllmArgs()


@pytest.fixture
def gpu_build(monkeypatch):
    """The launcher deciding as on the GPU build (this machine runs the CPU build)."""
    from serving import launcher
    monkeypatch.setattr(launcher, "is_cpu_build", lambda: False)


@pytest.fixture
def launcher_main(monkeypatch, capsys, caplog):
    """`python -m serving --dry-run` (or --prepare-only) run as the launcher's main() in this process, where the
    command line is not the subject: run(env, argv, drop) clears the caller's variables starting with `drop`,
    sets `env`, and gives (exit status, stdout, stderr followed by the log)."""
    from serving.launcher import main

    def run(env: dict[str, str], argv: list[str], drop: tuple[str, ...] = ("OPTION_", "SM_VLLM_", "HF_")):
        assert {"--dry-run", "--prepare-only"} & set(argv), "main() would start the engine in the test's process"
        for k in list(os.environ):
            if k.startswith(drop):
                monkeypatch.delenv(k)
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        capsys.readouterr()
        caplog.clear()
        with caplog.at_level("INFO"):
            rc = main(argv)
        out = capsys.readouterr()
        return rc, out.out, out.err + caplog.text
    return run


@pytest.fixture(scope="module")
def moto_env():
    """A real AWS-compatible server on loopback (moto's server mode) and the environment that points boto3 at it."""
    from moto.server import ThreadedMotoServer

    port = free_port()
    srv = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    srv.start()
    env = {"AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}", "AWS_ACCESS_KEY_ID": "testing-key-id",
           "AWS_SECRET_ACCESS_KEY": "testing-SECRET-value", "AWS_DEFAULT_REGION": "us-east-1"}
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield env
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        srv.stop()


STALL_BOUND_S = 3  # client_body_timeout of user_code_server: short, so the stalled-client tests run in seconds


@starts_early("user_code_server")
def _user_code_server(tmp: Path, nice: int) -> Server:
    mdir = made_by_child("user_code:lmi_model_folder", tmp / "model")
    return spawn_server(tmp, {"SERVING_MODEL_DIR": str(mdir), "LMI_CACHE_DIR": str(tmp / "cache"),
                              "PIP_NO_INDEX": "1", "OPTION_CLIENT_BODY_TIMEOUT": str(STALL_BOUND_S),
                              "CUSTOM_FASTAPI_PING_HANDLER": "lmi_fixture_greeting:ping", **EAGER}, nice=nice)


@pytest.fixture(scope="session")
def user_code_server(request) -> Server:
    """The tiny model in a model folder with LMI users' code (tests/user_code.py: model.py with LMI's
    documented formatter examples, requirements.txt installed from the wheel folder beside it, no index),
    a /ping handler from that package named by AWS's vLLM image's CUSTOM_FASTAPI_PING_HANDLER, and a
    short client_body_timeout."""
    srv = await_server(early(request, "user_code_server"), "user_code_server")
    yield srv
    stop(srv.proc)
