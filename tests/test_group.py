"""A group of hosts serving one model (serving/group.py, serving/group_link.py), without an engine: each role's
command from LeaderWorkerSet's variables or the project's own settings, the one-line refusals, and the group link
between real processes on loopback. tests/test_group_engine.py runs the group on the CPU engine."""
from __future__ import annotations

import http.client
import http.server
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tools.launcher_process import free_port

# DeepSeek-V3's config.json, the fields the launcher reads (the published checkpoint's values)
DEEPSEEK_V3 = {
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "hidden_size": 7168,
    "num_hidden_layers": 61, "first_k_dense_replace": 3, "intermediate_size": 18432, "moe_intermediate_size": 2048,
    "n_routed_experts": 256, "n_shared_experts": 1, "num_experts_per_tok": 8, "num_attention_heads": 128,
    "num_key_value_heads": 128, "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64, "v_head_dim": 128, "vocab_size": 129280,
    "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                            "weight_block_size": [128, 128]},
}
DENSE = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 8192, "intermediate_size": 28672,
         "num_attention_heads": 64, "num_key_value_heads": 8, "num_hidden_layers": 80, "vocab_size": 128256}
EIGHT_GPUS = {"CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7"}
LWS = {"LWS_GROUP_SIZE": "2", "LWS_LEADER_ADDRESS": "10.0.0.1"}
DROP = ("OPTION_", "SM_VLLM_", "HF_", "LWS_")


def _folder(tmp: Path, name: str, config: dict) -> str:
    d = tmp / name
    d.mkdir()
    (d / "config.json").write_text(json.dumps(config))
    return str(d)


def _command(out: str) -> list[str]:
    return shlex.split(out.strip().splitlines()[-1])


def _flags(argv: list[str]) -> dict[str, str | bool]:
    """The command's flags after `serve MODEL`: --flag value, or --flag alone as True."""
    i, out = argv.index("serve") + 2, {}
    while i < len(argv):
        if i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            out[argv[i]] = argv[i + 1]
            i += 2
        else:
            out[argv[i]] = True
            i += 1
    return out


def _role_line(out: str) -> str:
    return next(line for line in out.splitlines() if line.startswith("group: "))


def test_deepseek_v3_on_two_8_gpu_hosts_is_vllms_dp16_ep_recipe(tmp_path, launcher_main, gpu_build):
    """vLLM's two-host DeepSeek-V3 example (expert_parallel_deployment.md): data parallel 16, 8 a host, expert
    parallel; the worker headless from rank 8, with no HTTP flag."""
    model = _folder(tmp_path, "dsv3", DEEPSEEK_V3)
    env = {**LWS, **EIGHT_GPUS, "OPTION_MODEL_ID": model, "OPTION_DATA_PARALLEL_RPC_PORT": "13345"}
    rc, out, err = launcher_main({**env, "LWS_WORKER_INDEX": "0"}, ["--dry-run"], DROP)
    assert rc == 0, err
    lead = _flags(_command(out))
    keys = ("--data-parallel-size", "--data-parallel-size-local", "--data-parallel-address", "--data-parallel-rpc-port",
            "--tensor-parallel-size", "--enable-expert-parallel")
    assert {k: lead.get(k) for k in keys} == {
        "--data-parallel-size": "16", "--data-parallel-size-local": "8", "--data-parallel-address": "10.0.0.1",
        "--data-parallel-rpc-port": "13345", "--tensor-parallel-size": "1", "--enable-expert-parallel": True}
    assert "--headless" not in lead and lead["--port"] == "8080" and "--middleware" in lead
    role = _role_line(out)
    assert role.startswith("group: leader, rank 0 of 2 hosts")
    assert "form dp_ep (default for a Mixture-of-Experts" in role
    assert "(from env LWS_GROUP_SIZE, env LWS_WORKER_INDEX, env LWS_LEADER_ADDRESS)" in role

    rc, out, err = launcher_main({**env, "LWS_WORKER_INDEX": "1"}, ["--dry-run"], DROP)
    assert rc == 0, err
    work = _flags(_command(out))
    assert work["--headless"] is True and work["--data-parallel-start-rank"] == "8"
    assert work["--data-parallel-size"] == "16" and work["--data-parallel-size-local"] == "8"
    assert not {"--port", "--host", "--middleware", "--api-server-count"} & set(work), work
    assert _role_line(out).startswith("group: worker, rank 1 of 2 hosts")
    assert "answers /ping on port 8080" in _role_line(out)


def test_tensor_parallel_across_hosts_from_own_settings(tmp_path, launcher_main, gpu_build):
    """A dense checkpoint: tensor parallel over every GPU of the group (--nnodes, --node-rank, --master-addr), set by
    the project's own settings (Slurm, HyperPod, docker run); group_form=tp does the same for a MoE checkpoint."""
    dense = _folder(tmp_path, "dense", DENSE)
    own = {"OPTION_GROUP_SIZE": "2", "OPTION_GROUP_LEADER_ADDRESS": "leader.example.internal", **EIGHT_GPUS}
    for rank in (0, 1):
        rc, out, err = launcher_main({**own, "OPTION_GROUP_RANK": str(rank), "OPTION_MODEL_ID": dense},
                                     ["--dry-run"], DROP)
        assert rc == 0, err
        f = _flags(_command(out))
        assert (f["--tensor-parallel-size"], f["--nnodes"], f["--node-rank"], f["--master-addr"]) == \
            ("16", "2", str(rank), "leader.example.internal")
        assert ("--headless" in f) == bool(rank) and ("--port" in f) == (not rank)
        assert "form tp (default for a dense checkpoint" in _role_line(out)
        assert "(from env OPTION_GROUP_SIZE, env OPTION_GROUP_RANK, env OPTION_GROUP_LEADER_ADDRESS)" in _role_line(out)
    model = _folder(tmp_path, "dsv3", DEEPSEEK_V3)
    rc, out, err = launcher_main({**LWS, **EIGHT_GPUS, "LWS_WORKER_INDEX": "1", "OPTION_MODEL_ID": model,
                                  "OPTION_GROUP_FORM": "tp"}, ["--dry-run"], DROP)
    assert rc == 0, err
    f = _flags(_command(out))
    assert f["--tensor-parallel-size"] == "16" and f["--node-rank"] == "1" and "--data-parallel-size" not in f
    assert "form tp (group_form from env OPTION_GROUP_FORM)" in _role_line(out)


def test_own_settings_beat_lws_and_a_group_of_one_is_a_single_host(tmp_path, launcher_main, gpu_build):
    dense = _folder(tmp_path, "dense", DENSE)
    rc, out, err = launcher_main({**LWS, "LWS_WORKER_INDEX": "1", "OPTION_GROUP_RANK": "0", "OPTION_MODEL_ID": dense,
                                  **EIGHT_GPUS}, ["--dry-run"], DROP)
    assert rc == 0, err
    assert _role_line(out).startswith("group: leader, rank 0 of 2 hosts")
    rc, out, err = launcher_main({"LWS_GROUP_SIZE": "1", "LWS_WORKER_INDEX": "0", "OPTION_MODEL_ID": dense,
                                  **EIGHT_GPUS}, ["--dry-run"], DROP)
    assert rc == 0, err
    assert "group: " not in out and "--nnodes" not in _flags(_command(out)) and "--headless" not in out


@pytest.mark.parametrize("env, key, words", [
    ({"LWS_GROUP_SIZE": "2", "LWS_LEADER_ADDRESS": "10.0.0.1"}, "group_rank", "needs this host's rank"),
    ({**LWS, "LWS_WORKER_INDEX": "2"}, "group_rank", "rank 2 is out of range for a group of 2 hosts"),
    ({"LWS_GROUP_SIZE": "2", "LWS_WORKER_INDEX": "1"}, "group_leader_address", "needs the leader's address"),
    ({**LWS, "LWS_LEADER_ADDRESS": "10.0.0.1:29500", "LWS_WORKER_INDEX": "1"}, "group_leader_address", "no port"),
    ({"OPTION_GROUP_RANK": "1"}, "group_size", "no group size is"),
    ({**LWS, "LWS_WORKER_INDEX": "0", "OPTION_GROUP_FORM": "tp", "OPTION_TENSOR_PARALLEL_SIZE": "3"},
     "tensor_parallel_size", "does not split evenly over a group of 2 hosts"),
    ({**LWS, "LWS_WORKER_INDEX": "0", "OPTION_DATA_PARALLEL_SIZE": "3"}, "data_parallel_size",
     "3 data-parallel ranks do not split evenly over a group of 2 hosts"),
    ({**LWS, "LWS_WORKER_INDEX": "1", "OPTION_NNODES": "4"}, "nnodes", "set by the group's roles"),
    ({**LWS, "LWS_WORKER_INDEX": "1", "OPTION_HEADLESS": "true"}, "headless", "set by the group's roles"),
    ({**LWS, "LWS_WORKER_INDEX": "0", "OPTION_GROUP_FORM": "pp"}, "group_form", "tp or dp_ep"),
    ({"LWS_GROUP_SIZE": "0"}, "group_size", "positive integer"),
])
def test_a_bad_group_exits_2_with_one_line_naming_it(launcher_main, env, key, words):
    rc, out, err = launcher_main(env, ["--dry-run"], DROP)
    lines = [line for line in err.splitlines() if line.startswith("configuration error")]
    assert rc == 2 and len(lines) == 1, (rc, err[-2000:])
    assert lines[0].startswith(f"configuration error: {key} from ") and words in lines[0], lines[0]


def _serving(tmp: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    """`python -m serving` as one host of a group of two, the embedded model (never started here: each run stops
    at the group's check)."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(DROP)}
    base |= {**LWS, "SERVING_MODEL_DIR": str(tmp / "none"), "HF_HUB_OFFLINE": "1", **env}
    return subprocess.run([sys.executable, "-m", "serving"], env=base, capture_output=True, text=True, timeout=120)


def test_a_worker_whose_leader_does_not_answer_exits_2_within_its_bound(tmp_path):
    """No leader listens on the group port: the worker gives up after group_join_timeout, before its engine."""
    port = free_port()
    started = time.monotonic()
    done = _serving(tmp_path, {"LWS_LEADER_ADDRESS": "127.0.0.1", "LWS_WORKER_INDEX": "1",
                               "OPTION_GROUP_PORT": str(port), "OPTION_GROUP_JOIN_TIMEOUT": "3"})
    assert done.returncode == 2, done.stderr[-3000:]
    last = done.stderr.strip().splitlines()[-1]
    assert last == (f"configuration error: group_leader_address: the leader's group link 127.0.0.1:{port} did not "
                    "answer within 3 s (group_join_timeout); is the leader started, and group_port the same on "
                    "every host?"), last
    assert "Launching" not in done.stderr and time.monotonic() - started < 90


def test_a_leader_whose_group_port_is_taken_exits_2(tmp_path):
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        done = _serving(tmp_path, {"LWS_LEADER_ADDRESS": "127.0.0.1", "LWS_WORKER_INDEX": "0",
                                   "OPTION_HOST": "127.0.0.1", "OPTION_GROUP_PORT": str(port)})
    assert done.returncode == 2, done.stderr[-3000:]
    last = done.stderr.strip().splitlines()[-1]
    assert last == (f"configuration error: group_port: the leader's group link cannot listen on 127.0.0.1:{port} "
                    "(Address already in use)"), last


# -- the group link between real processes -----------------------------------------------------------------------

LINK_BOUND_S = 20  # a link's reaction (a heartbeat, the silence bound's slack) plus a slow start of its process


def _link(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "serving.group_link", *args], cwd=Path(__file__).parent.parent,
                            stderr=subprocess.PIPE, text=True)


def _sleeper() -> subprocess.Popen:
    """The engine process a link watches: a process that only ends by a signal."""
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])


def _ping(port: int) -> int | None:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
    try:
        conn.request("GET", "/ping")
        return conn.getresponse().status
    except OSError:
        return None
    finally:
        conn.close()


def _until(check, bound: float) -> float:
    """Seconds until check() is true; fails past bound."""
    started = time.monotonic()
    while not check():
        assert time.monotonic() - started < bound, f"not within {bound} s"
        time.sleep(0.2)
    return time.monotonic() - started


class _LeaderPing:
    """The leader's /ping as its link polls it: 200 once `serving` is set."""

    def __init__(self):
        self.serving = threading.Event()
        outer = self

        class H(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802
                self.send_response(200 if outer.serving.is_set() else 503)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *a):
                pass

        self.srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.srv.server_address[1]}/ping"
        threading.Thread(target=self.srv.serve_forever, daemon=True).start()


@pytest.fixture
def procs():
    started: list[subprocess.Popen] = []
    yield started
    for p in started:
        if p.poll() is None:
            p.kill()
            p.wait(10)


def _pair(procs, join_timeout: int = 60):
    """A leader link and a worker link, each watching a process of its own; (leader engine, leader link, worker
    engine, worker link, worker's health port, leader's /ping)."""
    ping, port, health = _LeaderPing(), free_port(), free_port()
    lead_engine, work_engine = _sleeper(), _sleeper()
    lead = _link("leader", "--host", "127.0.0.1", "--port", str(port), "--workers", "1", "--watch",
                 str(lead_engine.pid), "--join-timeout", str(join_timeout), "--ping-url", ping.url)
    procs += [lead_engine, work_engine, lead]
    from serving.group_link import reachable
    assert reachable("127.0.0.1", port, LINK_BOUND_S)
    work = _link("worker", "--leader", "127.0.0.1", "--port", str(port), "--rank", "1", "--watch",
                 str(work_engine.pid), "--host", "127.0.0.1", "--health-port", str(health))
    procs.append(work)
    return lead_engine, lead, work_engine, work, health, ping


def test_a_workers_ping_is_200_only_once_the_leader_serves(procs):
    lead_engine, lead, work_engine, work, health, ping = _pair(procs)
    _until(lambda: _ping(health) == 503, LINK_BOUND_S)  # joined, the leader still loading
    time.sleep(2.5)
    assert _ping(health) == 503
    ping.serving.set()
    _until(lambda: _ping(health) == 200, LINK_BOUND_S)
    assert lead_engine.poll() is None and work_engine.poll() is None


def test_a_worker_that_leaves_ends_the_leaders_engine(procs):
    lead_engine, lead, work_engine, work, health, ping = _pair(procs)
    ping.serving.set()
    _until(lambda: _ping(health) == 200, LINK_BOUND_S)
    work.kill()  # the worker's host is gone: its connection closes
    _until(lambda: lead_engine.poll() is not None, LINK_BOUND_S)
    assert lead_engine.returncode == -signal.SIGTERM  # no engine core under it: the launcher itself is stopped
    assert "worker rank 1 left the group" in lead.communicate(timeout=LINK_BOUND_S)[1]


def test_a_leader_that_leaves_stops_the_worker(procs):
    lead_engine, lead, work_engine, work, health, ping = _pair(procs)
    _until(lambda: _ping(health) == 503, LINK_BOUND_S)
    lead.kill()
    _until(lambda: work_engine.poll() is not None, LINK_BOUND_S)
    assert work_engine.returncode == -signal.SIGTERM
    said = work.communicate(timeout=LINK_BOUND_S)[1]
    assert "the leader closed the group link; stopping this worker (rank 1)" in said


def test_a_group_whose_workers_do_not_join_ends_within_the_join_timeout(procs):
    engine = _sleeper()
    lead = _link("leader", "--host", "127.0.0.1", "--port", str(free_port()), "--workers", "1", "--watch",
                 str(engine.pid), "--join-timeout", "2", "--ping-url", "http://127.0.0.1:9/ping")
    procs += [engine, lead]
    took = _until(lambda: engine.poll() is not None, LINK_BOUND_S)
    assert engine.returncode == -signal.SIGTERM and took >= 1.5
    assert "1 of 1 worker(s) did not join" in lead.communicate(timeout=LINK_BOUND_S)[1]
