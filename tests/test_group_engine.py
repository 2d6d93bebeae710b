"""A group of two hosts on the CPU engine: two launcher processes on 127.0.0.1 as rank 0 (the leader, HTTP) and rank 1
(a headless worker), given their roles by LeaderWorkerSet's variables, serve the embedded tiny model with tensor
parallelism over the two "hosts" (one core each). The leader's greedy output is the single-process server's; a
worker that dies ends the leader with exit 4; a leader that dies ends the worker.

The data-parallel-with-expert-parallel form also starts and answers /ping on the CPU engine, but its first step
fails: vLLM 0.32's CPU communicator has no all_gatherv (NotImplementedError in base_device_communicator.py), which
expert parallelism's dispatch calls; so the group here is tensor parallel (group_form=tp).
"""
from __future__ import annotations

import http.client
import json
import os
import signal
import time

import pytest
from conftest import EAGER, PLANTED_SECRETS, SERVER_NICE, await_server, spawn_server, stop

from tools.launcher_process import Server, free_port

pytestmark = pytest.mark.engine

PROMPTS = ("Hello world", "What is deep learning?", "The capital of France is")
TOKENS = 16
TIE = 0.05  # log-probability: two tokens this close tie within bf16 rounding
# Measured on the 2-core machine: the leader exited 2.3 s after its worker was killed, and a worker 12 s after its
# leader (vLLM's headless shutdown waits 10 s for its own worker process before it kills it).
WORKER_DEATH_BOUND_S = 30
LEADER_DEATH_BOUND_S = 60
_PORTS: dict[str, int] = {}


def _group_env(rank: int, ports: dict[str, int]) -> dict[str, str]:
    """Rank `rank` of a group of two on loopback: LWS's variables, tensor parallel, one core a host, eager."""
    return {"LWS_GROUP_SIZE": "2", "LWS_WORKER_INDEX": str(rank), "LWS_LEADER_ADDRESS": "127.0.0.1",
            "OPTION_GROUP_FORM": "tp", "OPTION_MASTER_PORT": str(ports["master"]),
            "OPTION_GROUP_PORT": str(ports["link"]), "OPTION_GROUP_JOIN_TIMEOUT": "300",
            "VLLM_HOST_IP": "127.0.0.1",  # the leader's message queue address: loopback, not the host's IP
            "VLLM_CPU_OMP_THREADS_BIND": str(rank), **EAGER}


def _ports() -> dict[str, int]:
    if not _PORTS:
        _PORTS.update(master=free_port(), link=free_port())
    return _PORTS


# Not started early: the session's early servers boot together, and two more engine processes among them take the
# suite's peak memory to the 2-core machine's 24 GiB.
@pytest.fixture(scope="module")
def group_leader(tmp_path_factory) -> Server:
    return spawn_server(tmp_path_factory.mktemp("group_leader"), _group_env(0, _ports()), nice=SERVER_NICE)


@pytest.fixture(scope="module")
def group_worker(tmp_path_factory) -> Server:
    return spawn_server(tmp_path_factory.mktemp("group_worker"), _group_env(1, _ports()), nice=SERVER_NICE)


@pytest.fixture(scope="module")
def group(group_leader, group_worker) -> tuple[Server, Server]:
    """(leader, worker), both spawned before either is awaited, both answering /ping 200 (the worker's is its group
    link's)."""
    leader = await_server(group_leader, "group_leader")
    worker = await_server(group_worker, "group_worker (its /ping)")
    yield leader, worker
    stop(worker.proc)
    stop(leader.proc)


def _completion(srv: Server, prompt: str) -> list[tuple[str, dict[str, float]]]:
    """Greedy tokens of an OpenAI completion, each with its top-2 log-probabilities."""
    conn = http.client.HTTPConnection(srv.host, timeout=120)
    try:
        body = {"prompt": prompt, "max_tokens": TOKENS, "temperature": 0, "logprobs": 2}
        conn.request("POST", "/v1/completions", json.dumps(body), {
            "Content-Type": "application/json", "Authorization": f"Bearer {PLANTED_SECRETS['OPTION_API_KEY']}"})
        r = conn.getresponse()
        data = r.read()
        assert r.status == 200, data
        lp = json.loads(data)["choices"][0]["logprobs"]
        return list(zip(lp["tokens"], lp["top_logprobs"]))
    finally:
        conn.close()


def test_the_group_splits_the_model_and_answers_as_one_process(group, api_servers_server):
    """Greedy output as a single-process server's (both eager): token for token, with the same log-probabilities, up
    to where two tokens tie within bf16 rounding (tensor parallelism sums each layer's halves in another order, so
    one of two near-equal tokens may win instead); there the outputs may part."""
    leader, worker = group
    matched = 0
    for prompt in PROMPTS:
        for (tok, top), (ref_tok, ref_top) in zip(_completion(leader, prompt), _completion(api_servers_server, prompt)):
            if tok != ref_tok:
                assert abs(ref_top[ref_tok] - ref_top.get(tok, -1e9)) < TIE, (prompt, matched, top, ref_top)
                assert abs(top[tok] - top.get(ref_tok, -1e9)) < TIE, (prompt, matched, top, ref_top)
                break
            assert abs(top[tok] - ref_top[tok]) < TIE, (prompt, tok, top, ref_top)
            matched += 1
    assert matched >= len(PROMPTS) * TOKENS * 3 // 4, matched
    wlog, llog = worker.log(), leader.log()
    assert "--headless" in wlog and "Launching vLLM (v0.32.0) headless multiproc executor" in wlog
    assert "TP rank 1" in wlog and "TP rank 0" in llog and "world_size=2" in llog
    assert "group: worker rank 1 joined" in llog and "--port" not in wlog.split("starting engine")[1].splitlines()[0]
    from serving.healthcheck import healthcheck  # the image's HEALTHCHECK, on the worker's port
    assert healthcheck({"OPTION_HOST": "127.0.0.1", "OPTION_PORT": worker.url.rsplit(":", 1)[1]}) == 0


def test_a_worker_that_dies_ends_the_leader_with_exit_4(group):
    leader, worker = group
    killed = time.monotonic()
    os.killpg(worker.proc.pid, signal.SIGKILL)  # the worker's host is gone: launcher, engine and link at once
    worker.proc.wait(10)
    rc = leader.proc.wait(WORKER_DEATH_BOUND_S)
    took = time.monotonic() - killed
    assert rc == 4, leader.failure_log()
    log = leader.log()
    assert "group: worker rank 1 left the group" in log and "exiting with status 4" in log, log[-3000:]
    print(f"the leader exited {rc} {took:.1f} s after its worker was killed")


def test_a_leader_that_dies_ends_the_worker(tmp_path):
    """A second group, killed once the worker's headless engine runs: the worker's link stops it."""
    ports = {"master": free_port(), "link": free_port()}
    leader = spawn_server(tmp_path / "leader", _group_env(0, ports), nice=SERVER_NICE)
    worker = spawn_server(tmp_path / "worker", _group_env(1, ports), nice=SERVER_NICE)
    try:
        end = time.monotonic() + 300
        while "headless multiproc executor" not in worker.log() or "joined" not in leader.log():
            assert leader.proc.poll() is None and worker.proc.poll() is None, worker.failure_log()
            assert time.monotonic() < end, worker.failure_log()
            time.sleep(1)
        killed = time.monotonic()
        os.killpg(leader.proc.pid, signal.SIGKILL)
        worker.proc.wait(LEADER_DEATH_BOUND_S)
        print(f"the worker exited {worker.proc.returncode} {time.monotonic() - killed:.1f} s after its leader")
        assert "group: the leader closed the group link; stopping this worker (rank 1)" in worker.log()
    finally:
        stop(worker.proc, grace=10)
        stop(leader.proc, grace=10)
