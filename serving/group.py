"""One model over several hosts: each host's role in the group, and the engine command of that role.

A group is `group_size` hosts that serve one model on vLLM's own multi-node engine. Three facts place a host in it:
the group's size, the host's rank (0 is the leader) and the leader's address. Kubernetes LeaderWorkerSet gives every
pod these as LWS_GROUP_SIZE, LWS_WORKER_INDEX and LWS_LEADER_ADDRESS; elsewhere (Slurm, HyperPod, `docker run` on
several hosts) the settings group_size, group_rank and group_leader_address (OPTION_GROUP_SIZE, ...) say the same.

The leader serves the HTTP contract on its port with the whole group's parallelism; each worker runs vLLM headless
(no API server: none of vLLM's HTTP server flags) with its rank and the leader's address. Two forms, as vLLM
documents them (docs/serving/parallelism_scaling.md, data_parallel_deployment.md, expert_parallel_deployment.md):

- `tp`: tensor parallel across the hosts: --tensor-parallel-size (every GPU of the group) --nnodes --node-rank
  --master-addr, the workers --headless;
- `dp_ep`: data parallel with expert parallelism, one data-parallel rank a GPU: --data-parallel-size (every GPU of
  the group) --data-parallel-size-local (the host's GPUs) --data-parallel-address --enable-expert-parallel, the
  workers --headless --data-parallel-start-rank.

Unless group_form names one, a Mixture-of-Experts checkpoint gets `dp_ep` (vLLM's two-host recipe for DeepSeek-V3)
and any other `tp`. The launchers of a group watch each other over the group link (serving/group_link.py).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from .resolve import ConfigError

SIZE, RANK, LEADER, FORM, PORT, JOIN_TIMEOUT = (
    "group_size", "group_rank", "group_leader_address", "group_form", "group_port", "group_join_timeout")
TP, DP_EP = "tp", "dp_ep"
FORMS = (TP, DP_EP)

# Set by the group's roles: a user value of one of these beside a group is refused, naming it.
ROLE_KEYS = ("nnodes", "node_rank", "master_addr", "headless", "data_parallel_address", "data_parallel_size_local",
             "data_parallel_start_rank", "data_parallel_rank", "data_parallel_hybrid_lb", "data_parallel_external_lb")
# The engine's parallelism as the group sets it (the user's value is read, checked against the group and replaced).
PARALLEL_KEYS = ("tensor_parallel_size", "data_parallel_size")
# A headless worker keeps what the engine reads and drops what only vLLM's API server reads (its FrontendArgs, the API
# server count and the container's middleware), whose flags vLLM refuses or ignores there. tokens_only is read by the
# engine's configuration too.
WORKER_KEEPS = {"tokens_only"}


@dataclass(frozen=True)
class Group:
    """This host's place in a group, and how the group splits the model."""

    size: int
    rank: int
    leader: str          # the leader's address, as every host reaches it
    form: str            # TP or DP_EP
    form_why: str        # why this form: the user's group_form, or the checkpoint's kind
    port: int            # the group link's port on the leader (serving/group_link.py)
    join_timeout: int    # seconds a host waits for the others to join the link
    sources: str         # where the three facts came from, for the role line

    @property
    def is_leader(self) -> bool:
        return self.rank == 0

    @property
    def role(self) -> str:
        return "leader" if self.is_leader else "worker"


def _entry(entries: Mapping, key: str):
    r = entries.get(key)
    return None if r is None or r.value is None or r.value == "" else r


def user_set(r) -> bool:
    """Whether a resolved entry is the user's (not a default of the table or of the context)."""
    return r is not None and not r.source.startswith("default")


def from_settings(entries: Mapping, config: dict | None, no_config: str) -> Group | None:
    """The host's group from the resolved settings and the checkpoint's config.json (parallel_layout.read_config's
    answer: the config, or None and why not), or None for a single host; ConfigError naming what is wrong."""
    size, rank, leader = _entry(entries, SIZE), _entry(entries, RANK), _entry(entries, LEADER)
    if size is None or size.value == 1:
        if rank is not None and rank.value != 0 and size is not None:
            raise ConfigError(RANK, rank.source, f"rank {rank.value} is out of range for a group of 1 host (0)")
        if size is None and rank is not None and user_set(rank):
            raise ConfigError(SIZE, "(not set)", f"{RANK} is set from {rank.source} but no group size is: set "
                              f"{SIZE} (LWS_GROUP_SIZE or OPTION_GROUP_SIZE) to the number of hosts")
        return None
    n = int(size.value)
    if rank is None:
        raise ConfigError(RANK, "(not set)", f"a group of {n} hosts (from {size.source}) needs this host's rank, "
                          "0 for the leader (LWS_WORKER_INDEX or OPTION_GROUP_RANK)")
    if not 0 <= int(rank.value) < n:
        raise ConfigError(RANK, rank.source, f"rank {rank.value} is out of range for a group of {n} hosts "
                          f"(0 to {n - 1}; {SIZE} from {size.source})")
    if leader is None:
        raise ConfigError(LEADER, "(not set)", f"a group of {n} hosts needs the leader's address, which every host "
                          "reaches it at (LWS_LEADER_ADDRESS or OPTION_GROUP_LEADER_ADDRESS)")
    addr = str(leader.value)
    if any(c.isspace() for c in addr) or "/" in addr or addr.count(":") == 1:
        raise ConfigError(LEADER, leader.source, f"{addr!r} is not a host name or IP address (no port: the "
                          "leader's ports are master_port, data_parallel_rpc_port and group_port)")
    form_entry = _entry(entries, FORM)
    if form_entry is not None:
        form, why = str(form_entry.value).lower(), f"{FORM} from {form_entry.source}"
    else:
        form, why = default_form(config, no_config)
    sources = ", ".join(dict.fromkeys(r.source for r in (size, rank, leader)))
    return Group(n, int(rank.value), addr, form, why, int(entries[PORT].value), int(entries[JOIN_TIMEOUT].value),
                 sources)


def default_form(config: dict | None, why: str) -> tuple[str, str]:
    """(form, why) from the checkpoint's config.json (None: not read, `why` says why): `dp_ep` for a
    Mixture-of-Experts model, `tp` otherwise."""
    from .parallel_layout import Checkpoint

    try:
        experts = Checkpoint.from_config(config).experts if config is not None else None
    except (ValueError, TypeError, KeyError) as e:
        experts, why = None, f"config.json lacks a field ({type(e).__name__})"
    if experts is None:
        return TP, f"default where config.json is not read ({why}): tensor parallel across the hosts"
    if experts > 1:
        return DP_EP, (f"default for a Mixture-of-Experts checkpoint ({experts} experts): vLLM's multi-host recipe "
                       "for DeepSeek-V3, data parallel attention with expert parallel MoE layers")
    return TP, "default for a dense checkpoint: tensor parallel across the hosts"


@dataclass(frozen=True)
class Layout:
    """The group's parallelism and this host's engine flags for it."""

    flags: dict[str, str | bool]   # vLLM dest -> value (True: a switch)
    summary: str                   # e.g. "tensor parallel 16 over 2 hosts, 8 GPUs each"


def layout(g: Group, entries: Mapping, per_host: int) -> Layout:
    """The engine flags of this host's role: ConfigError where the user's parallelism does not split over the
    group or the user set a flag the roles set."""
    for key in ROLE_KEYS:
        r = entries.get(key)
        if user_set(r):
            raise ConfigError(key, r.source, f"set by the group's roles ({SIZE}, {RANK}, {LEADER}) in a group of "
                              f"{g.size} hosts; unset it")
    tp_r, dp_r, pp_r = (entries.get(k) for k in ("tensor_parallel_size", "data_parallel_size",
                                                 "pipeline_parallel_size"))
    tp = int(tp_r.value) if user_set(tp_r) else None
    dp = int(dp_r.value) if user_set(dp_r) else None
    pp = int(pp_r.value) if user_set(pp_r) else 1
    common: dict[str, str | bool] = {}
    if g.form == TP:
        tp = tp if tp is not None else per_host * g.size
        world = tp * (dp or 1) * pp
        if world % g.size:
            r = tp_r if dp is None else dp_r
            raise ConfigError(r.key, r.source, f"a world of {world} GPUs (tensor x data x pipeline parallel) does "
                              f"not split evenly over a group of {g.size} hosts")
        common |= {"tensor_parallel_size": str(tp), "nnodes": str(g.size), "node_rank": str(g.rank),
                   "master_addr": g.leader}
        if dp is not None:
            common["data_parallel_size"] = str(dp)
        summary = f"tensor parallel {tp} over {g.size} hosts, {world // g.size} GPU(s) each"
        if g.rank:
            common["headless"] = True
        return Layout(common, summary)
    tp = tp or 1
    if dp is None:
        if per_host % tp:
            raise ConfigError("tensor_parallel_size", tp_r.source, f"{tp} does not divide the {per_host} GPU(s) "
                              "of a host (dp_ep form: one data-parallel rank every tensor_parallel_size GPUs)")
        dp = per_host // tp * g.size
    if dp % g.size:
        raise ConfigError("data_parallel_size", dp_r.source, f"{dp} data-parallel ranks do not split evenly over a "
                          f"group of {g.size} hosts")
    local = dp // g.size
    common |= {"tensor_parallel_size": str(tp), "data_parallel_size": str(dp), "data_parallel_size_local": str(local),
               "data_parallel_address": g.leader}
    if "enable_expert_parallel" not in entries:
        common["enable_expert_parallel"] = True
    if g.rank:
        common |= {"headless": True, "data_parallel_start_rank": str(g.rank * local)}
    summary = (f"data parallel {dp} (tensor parallel {tp} each) over {g.size} hosts, {local} rank(s) each, "
               f"ranks {g.rank * local} to {(g.rank + 1) * local - 1} here")
    return Layout(common, summary)


def frontend_keys() -> set[str]:
    """The destinations of vLLM's API-server-only flags, which a headless worker drops."""
    import dataclasses

    from vllm.entrypoints.launchers.cli_args import FrontendArgs
    return {f.name for f in dataclasses.fields(FrontendArgs)} - WORKER_KEEPS | {"api_server_count"}


def drop_flags(argv: list[str], dests: set[str], vllm_args) -> list[str]:
    """argv without the flags (and their values) whose vLLM destination is in dests."""
    out, i = [], 0
    while i < len(argv):
        tok = argv[i]
        action = vllm_args._action(tok[2:]) if tok.startswith("--") else None
        if action is None and tok.startswith("--no-"):
            action = vllm_args._action(tok[5:])
        n = 1
        if action is not None:
            if action.nargs == 0 or tok.startswith("--no-"):
                pass
            elif action.nargs in ("+", "*"):
                while i + n < len(argv) and not argv[i + n].startswith("--"):
                    n += 1
            else:
                n += action.nargs if isinstance(action.nargs, int) else 1
        if action is None or action.dest not in dests:
            out += argv[i:i + n]
        i += n
    return out


def arrange(argv: list[str], entries: Mapping, g: Group, per_host: int, vllm_args) -> tuple[list[str], str]:
    """The engine command of this host's role (from the single-host command argv) and the role's log line."""
    lay = layout(g, entries, per_host)
    drop = set(lay.flags) | set(PARALLEL_KEYS)
    if not g.is_leader:
        drop |= frontend_keys()
    head = drop_flags(argv, drop, vllm_args)
    for dest, value in lay.flags.items():
        flag = vllm_args.flag_for(dest)
        head += [flag] if value is True else [flag, value]
    ports = f"group link {g.leader}:{g.port}"
    role = (f"group: {g.role}, rank {g.rank} of {g.size} hosts (from {g.sources}), leader {g.leader}; form {g.form} "
            f"({g.form_why}): {lay.summary}; {ports}")
    if not g.is_leader:
        role += f"; this worker answers /ping on port {entries['port'].value} (200 once the group serves)"
    return head, role



RESTART_IN_PLACE = "engine_auto_recovery"


def engine_env(entries: Mapping) -> dict[str, str]:
    """The engine's environment in a group: no restart of the engine in place (engine_auto_recovery), where that
    setting exists. A group restarts as a whole: a leader's engine started again alone has no workers to rejoin it."""
    from .settings import TABLE

    s = TABLE.get(RESTART_IN_PLACE)
    if s is None or not s.engine_env:
        return {}
    r = entries.get(RESTART_IN_PLACE)
    if user_set(r) and r.value:
        raise ConfigError(RESTART_IN_PLACE, r.source, "a group of hosts restarts as a whole (a leader's engine "
                          "started again alone has no workers to rejoin it); unset it or set it to false")
    return {s.engine_env: "0"}
