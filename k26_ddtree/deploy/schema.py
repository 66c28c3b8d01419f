"""The profile schema: every key, its type, its default and its one-line doc, as frozen dataclasses.

This is the one place the keys are defined. Validation and `--set` parsing
(k26_ddtree.deploy.values), rendering (flags, units) and the key documentation
in deploy/profiles/base.yaml (k26_ddtree.deploy.basegen) all read these
classes; a field is a profile key when it was declared with `key()` or
`section()`. A new key, or a new section, is one field here; a type not yet in KINDS also
needs its row there and its checks in values.py. Units rendered before a key
existed read back with its default.
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import NewType

from k26_ddtree.repro.sglang_versions import DEFAULT as DEFAULT_SGLANG

# An absolute path, spelled as a string: it is written into the unit as it is.
AbsPath = NewType("AbsPath", str)

_DOC = "k26-doc"


def key(default, doc: str):
    """A profile key with its default (the value base.yaml gives it) and its one-line doc."""
    if isinstance(default, dict):
        frozen = types.MappingProxyType(dict(default))
        return field(default_factory=lambda: frozen, metadata={_DOC: doc})
    return field(default=default, metadata={_DOC: doc})


def section(cls: type, doc: str):
    """A nested mapping of keys, itself a frozen dataclass."""
    return field(default_factory=cls, metadata={_DOC: doc})


@dataclass(frozen=True, kw_only=True)
class Parallel:
    tp_size: int = key(8, "tensor-parallel ranks (--tp-size)")
    ep_size: int | None = key(None, "expert-parallel ranks, a divisor of tp_size; null: off")
    moe_a2a_backend: str | None = key(None, "MoE all-to-all backend, one of SGLang's (--moe-a2a-backend); "
                                            "null: its default")
    enable_nccl_nvls: bool = key(False, "NCCL NVLS all-reduce (NVLink boxes)")
    nnodes: int = key(1, "machines one server spans (SGLang multi-node)")
    node_rank: int = key(0, "this machine's rank, 0..nnodes-1; only rank 0 serves generates")
    dist_init_addr: str | None = key(None, "HOST:PORT (or [IPv6]:PORT) of node 0; required when nnodes > 1")


@dataclass(frozen=True, kw_only=True)
class Speculative:
    algorithm: str = key("DDTREE", "DDTREE (tree verify, our patch) or DFLASH (linear baseline)")
    block_size: int = key(8, "DFlash block, >= 2; the K2.6 DFlash drafter is trained for block 8")
    draft_window_size: int = key(2048, "drafter attention window, >= block_size")
    budget: int = key(8, "DDTree nodes per step, 1 <= budget <= sum(topk^d for d in 1..block_size-1); "
                         "8 won the sweep at C=1 (PCIe and B300)")
    topk: int = key(4, "DDTree children per node, >= 1")
    schedule: str | None = key(None, "DDTREE only: bs:budget/topk per batch-size bucket, replacing budget/topk, "
                                     "e.g. \"1:32/8,4:16/4,64:0\" (0: the DFlash chain); from `k26-deploy tune`")
    spine: bool = key(True, "keep the drafter's top-1 chain in the tree, so a step accepts at least what "
                            "linear DFlash's chain would")
    trace: AbsPath | None = key(None, "DDTREE only: append the drafter's top-8 and the committed tokens per "
                                      "decode step to this file, for `k26-deploy tune` "
                                      "(--speculative-ddtree-trace); null: off")
    # The server's own default (k26_ddtree.sglang.common.args, which imports torch: too slow for rendering a unit).
    trace_max_mb: int = key(1024, "DDTREE only: tracing stops before the file passes this many MB, >= 1 "
                                  "(--speculative-ddtree-trace-max-mb)")


@dataclass(frozen=True, kw_only=True)
class Service:
    gpu_free_timeout_sec: int = key(180, "ExecStartPre: seconds to wait for a previous instance's GPU memory")
    gpu_free_max_used_mib: int = key(2048, "MiB in use per GPU above which it counts as still in use")
    ready_timeout_sec: int = key(2400, "seconds for weight load (~590 GB) + CUDA graph capture until ready")
    timeout_stop_sec: int = key(180, "TimeoutStopSec=: SGLang drains on SIGTERM without a deadline of its own")
    restart_sec: int = key(30, "RestartSec=")
    start_limit_burst: int = key(3, "StartLimitBurst=")
    start_limit_interval_sec: int = key(10800, "StartLimitIntervalSec=")
    limit_nofile: int = key(1048576, "LimitNOFILE=")
    fabric_manager: bool = key(False, "start after nvidia-fabricmanager.service (NVLink boxes)")


@dataclass(frozen=True, kw_only=True)
class Router:
    host: str = key("127.0.0.1", "bind address, an IP address or host name; loopback (this machine only) unless "
                                 "api_key: true (or open_without_api_key) opens it, e.g. to 0.0.0.0")
    port: int = key(30080, "the router's port, 1..65535")
    policy: str = key("cache_aware", "random, round_robin, cache_aware, power_of_two or manual")
    worker_urls: tuple[str, ...] = key((), "the replicas' base URLs, http(s)://HOST[:PORT], e.g. http://node1:30000")


@dataclass(frozen=True, kw_only=True)
class Profile:
    """A resolved, validated profile: its name, the files it came from, and every key's value."""

    name: str
    sources: tuple[str, ...]

    description: str = key("Kimi K2.6, DFlash drafter, DDTree verify",
                           "the unit's Description= (with the profile name), shown by systemctl status")
    python: AbsPath | None = key(None, "the venv python with the patched sglang and k26-ddtree; "
                                       "null: the python running k26-deploy")
    sglang_version: str = key(DEFAULT_SGLANG, "the SGLang version this box runs, one k26-ddtree installs "
                                              "(`--sglang`); render writes the flags of the version python has, "
                                              "else of this one")
    model: AbsPath = key("/models/Kimi-K2.6", "Kimi K2.6 (from `k26-deploy fetch-model`)")
    drafter: AbsPath = key("/models/Kimi-K2.6-DFlash", "its DFlash drafter (from `k26-deploy fetch-model`)")
    served_model_name: str = key("kimi-k2.6", "the name /v1/models reports")
    host: str = key("127.0.0.1", "bind address, an IP address or host name; beyond loopback it needs "
                                 "api_key: true (or open_without_api_key)")
    port: int = key(30000, "the server's port, 1..65535")
    api_key: bool = key(False, "true: --api-key ${K26_API_KEY} from env_file (mode 0600) on the server "
                               "and the router; clients send it as a Bearer token")
    open_without_api_key: bool = key(False, "true: host or router.host may listen beyond loopback without an "
                                            "API key (anyone who reaches the port uses the model); the unit says so")
    env_file: AbsPath = key("/etc/k26-ddtree/k26-ddtree.env",
                            "systemd EnvironmentFile= (optional unless api_key is true)")
    environment: Mapping[str, str] = key({}, "extra Environment= entries, NAME: \"value\"")
    parallel: Parallel = section(Parallel, "how one server spreads over GPUs and machines")
    speculative: Speculative = section(Speculative, "DFlash drafting and DDTree tree verification")
    attention_backend: str = key("triton", "target attention kernels, one of SGLang's; DDTREE verifies with "
                                           "triton only")
    cuda_graph: bool = key(True, "false adds --disable-cuda-graph (debugging only)")
    cuda_graph_max_bs: int = key(32, "largest batch captured in a CUDA graph")
    mem_fraction_static: float | None = key(None, "GPU memory fraction for weights and KV cache, in (0, 1); "
                                                  "null: SGLang's default")
    context_length: int | None = key(None, "longest context served; null: SGLang's default")
    max_running_requests: int | None = key(None, "requests decoded at once; null: SGLang's default")
    trust_remote_code: bool = key(True, "--trust-remote-code: K2.6 ships its own model code")
    tool_call_parser: str | None = key("kimi_k2", "--tool-call-parser, one of SGLang's; null: none")
    reasoning_parser: str | None = key("kimi_k2", "--reasoning-parser, one of SGLang's; null: none")
    skip_server_warmup: bool = key(True, "text-only start: the vision warm-up needs a kernel these boxes lack")
    enable_metrics: bool = key(True, "Prometheus /metrics")
    extra_args: tuple[str, ...] = key((), "further flags of that SGLang version, verbatim; none a key here sets "
                                          "(in any spelling or abbreviation), no secret, no --config")
    service: Service = section(Service, "the systemd unit: bounded waits, restarts, limits")
    router: Router = section(Router, "`render --router`: SGLang's router in front of replicas on several machines")

    def summary(self) -> str:
        spec = self.speculative
        if spec.algorithm == "DDTREE":
            spine = "on" if spec.spine else "off"
            tree = (f"budget {spec.budget}, topk {spec.topk}" if spec.schedule is None else f"schedule {spec.schedule}")
            tree += f", block {spec.block_size}, spine {spine}"
        else:
            tree = f"linear DFlash, block {spec.block_size}"
        return f"{self.name} ({tree}, SGLang {self.sglang_version})"


@dataclass(frozen=True)
class Kind:
    """What one key holds, as the validation, `--set` and the docs see it."""

    name: str  # str, path, int, float, bool, list (of str), map (str -> str), section
    nullable: bool = False
    section: type | None = None

    def describe(self) -> str:
        text = {"list": "list of str", "map": "map NAME: str"}.get(self.name, self.name)
        return f"{text} or null" if self.nullable else text


# The one table from Python types to kinds: a key of a new type adds its row here.
KINDS: dict[object, str] = {
    str: "str",
    AbsPath: "path",
    int: "int",
    float: "float",
    bool: "bool",
    tuple[str, ...]: "list",
    Mapping[str, str]: "map",
}


@functools.cache
def keys(cls: type) -> dict[str, Kind]:
    """The profile keys of a schema class, in declaration order, with their kinds."""
    hints = typing.get_type_hints(cls)
    return {f.name: _kind(hints[f.name]) for f in dataclasses.fields(cls) if _DOC in f.metadata}


def doc(cls: type, name: str) -> str:
    return next(f.metadata[_DOC] for f in dataclasses.fields(cls) if f.name == name)


def default(cls: type, name: str):
    found = next(f for f in dataclasses.fields(cls) if f.name == name)
    return found.default_factory() if found.default is dataclasses.MISSING else found.default


def _kind(hint) -> Kind:
    args = typing.get_args(hint)
    if typing.get_origin(hint) in (typing.Union, types.UnionType) and type(None) in args:
        (inner,) = [a for a in args if a is not type(None)]
        return dataclasses.replace(_kind(inner), nullable=True)
    if dataclasses.is_dataclass(hint):
        return Kind("section", section=hint)
    return Kind(KINDS[hint])
