"""One run's settings: the command line, parsed once (cli), read by every part of the run."""
from __future__ import annotations

import argparse
import dataclasses
import sys
from dataclasses import dataclass
from pathlib import Path

from .models import DEFAULT_ARMS, DEFAULT_LAYERS, MODELS, Model
from .workload import Shape, shapes

# The KV pool modes: "fixed", every arm's pool the same --kv-bytes (vLLM's --kv-cache-memory-bytes, SGLang's token
# cap); "sized", each arm's pool sized by its engine from --gpu-mem and the context length, as a deployment's is.
KV_POOLS = ("fixed", "sized")
# A deployment's context length, the sized pools' --max-model-len unless given (a longer workload's sets it longer)
DEPLOYMENT_MODEL_LEN = 16384
# What Config.max_model_len keeps beyond the longest request of the run's workloads
CONTEXT_SPARE = 64


# Each peer arm's runtime: the Config field (and command-line option) naming its Python, and what that Python is.
PEER_RUNTIMES = {
    "sglang": ("sglang_python", "SGLang 0.5.21's runtime (tools/peer_runtimes.py sglang: the image's torch 2.13 "
                                "and a site of SGLang's own pins)"),
    "vllm-latest": ("vllm_latest_python", "stock vLLM 0.34.0's runtime (tools/peer_runtimes.py vllm-latest: torch "
                                          "2.14 and vLLM 0.34.0)"),
    "sglang-latest": ("sglang_latest_python", "SGLang 0.5.23's runtime (tools/peer_runtimes.py sglang-latest: "
                                              "torch 2.14.1 and SGLang 0.5.23)"),
}


@dataclass(frozen=True, kw_only=True)
class Config:
    """The options of `python -m bench.e2e`, one field each, in the command line's order (e2e.json records them
    in this order); the defaults are the command line's."""
    stock_site: str  # folder holding the pristine vllm package (the stock arms)
    image_python: str = sys.executable
    sglang_python: str | None = None  # the Python of SGLang 0.5.21's runtime (the sglang arm); None: not given
    vllm_latest_python: str | None = None  # the Python of vLLM 0.34.0's runtime (the vllm-latest arm)
    sglang_latest_python: str | None = None  # the Python of SGLang 0.5.23's runtime (the sglang-latest arm)
    models_dir: Path
    out: Path
    work: Path = Path("/tmp/e2e-work")
    models: tuple[str, ...] = tuple(m.name for m in MODELS)
    arms: tuple[str, ...] = DEFAULT_ARMS
    layers: tuple[str, ...] = (str(DEFAULT_LAYERS),)  # --layers as given: N, MODEL=N (models.parse_layers)
    drop_models: bool = False
    reps: int = 3
    waves: int = 6
    in_tokens: int = 128
    out_tokens: int = 128
    gpu_mem: float = 0.08
    kv_bytes: int = 3 << 29
    kv_pool: str = "fixed"  # KV_POOLS; "sized" starts the arms alone (from_args)
    model_len: int | None = None  # --max-model-len; None: Config.max_model_len's rule
    workloads: tuple[str, ...] = ("default",)  # workload.shapes' names, measured in this order
    ready_timeout: float = 900
    start_alone: bool = False  # the arms start one at a time, each ready before the next (run.Run.start)
    one_at_a_time: bool = False  # each arm served alone: started, measured and stopped before the next starts
    profile: bool = False
    profile_clients: tuple[int, ...] = (1, 32)  # a profile window at each of these concurrencies (--profile)
    profile_tokens: int | None = None  # output tokens of a profile window's requests; None: out_tokens
    profile_arms: tuple[str, ...] | None = None  # the arms profiled (--profile); None: every measured arm
    clients: tuple[int, ...] | None = None  # None: every concurrency
    cross_check: int = 0  # repetitions of the cross-check with vLLM's own client (crosscheck); 0: none
    candidate_configs: Path | None = None  # config files laid over configs/ for the image-candidates arm
    image_no_nvcc: bool = False  # every image arm without nvcc, as the container runs (servers._without_nvcc)
    models_only: bool = False  # make the chosen models' folders in models_dir and stop: no server starts

    @classmethod
    def from_args(cls, ns: argparse.Namespace) -> "Config":
        fields = {k: tuple(v) if isinstance(v, list) else v for k, v in vars(ns).items()}
        if fields.get("kv_pool") == "sized":  # each engine sizes its pool without the others' start in the way
            fields["start_alone"] = True
        return cls(**fields)

    @staticmethod
    def default(name: str) -> object:
        return Config.__dataclass_fields__[name].default

    def record(self) -> dict[str, str]:
        """The settings as e2e.json's "args" holds them: each as text, a list as Python writes one; then the context
        length every arm was given (max_model_len)."""
        return {**{f.name: str(list(v) if isinstance(v := getattr(self, f.name), tuple) else v)
                   for f in dataclasses.fields(self)}, "max_model_len": str(self.max_model_len)}

    @property
    def shapes(self) -> list[Shape]:
        """The workload shapes of --workload, in its order."""
        every = shapes(self.in_tokens, self.out_tokens)
        return [every[name] for name in dict.fromkeys(self.workloads)]

    @property
    def longest_request(self) -> int:
        """The longest sequence a request of the run's workloads has (prompt and output)."""
        return max(s.longest for s in self.shapes)

    @property
    def max_model_len(self) -> int:
        """Every arm's context length: --max-model-len where given; else the longest request of the run's workloads
        and CONTEXT_SPARE tokens, with sized pools at least a deployment's DEPLOYMENT_MODEL_LEN."""
        if self.model_len:
            return self.model_len
        need = self.longest_request + CONTEXT_SPARE
        return max(need, DEPLOYMENT_MODEL_LEN) if self.kv_pool == "sized" else need

    def started_arms(self, model: Model) -> list[str]:
        """The arms of `model` this run starts: those --arms names, or every arm of the embedded model."""
        return [arm for arm in model.arms if arm in self.arms or not model.preset]

    def serving_groups(self, model: Model) -> list[list[str]]:
        """The arms of `model` served at once, group after group: all together, or with --one-at-a-time each
        alone."""
        arms = self.started_arms(model)
        return [[arm] for arm in arms] if self.one_at_a_time else ([arms] if arms else [])

    def most_at_once(self, model: Model) -> list[str]:
        """The largest group of `model`'s arms up on the GPU at once (serving_groups): what its memory must hold."""
        return max(self.serving_groups(model), key=len, default=[])

    def peer_python(self, arm: str) -> str | None:
        """The Python a peer arm runs from (PEER_RUNTIMES), None when the run was not given it."""
        return getattr(self, PEER_RUNTIMES[arm][0])

    def home(self, server: str) -> Path:
        return self.work / "homes" / server

    def log_path(self, server: str) -> Path:
        return self.work / "logs" / f"{server}.log"

    def profile_dir(self, server: str) -> Path:
        return self.work / "profiles" / server
