"""The proving-ground matrix: server names, what they mean, and the sglang command line of each.

Server names say everything: `ar`, `dflash`, `dflash-weak` or `dflash-mid`, and
`ddtree-b<budget>-k<topk>-<DRAFTER>`, or `ddtree-s<schedule>-<DRAFTER>` for a
batch-size schedule named in `matrix.json` "schedules" (or given to the runner with --schedule),
a DDTree name optionally suffixed `-spine`
(--speculative-ddtree-spine), any name optionally suffixed `-tp2` (tensor parallel over two
GPUs) or `-tp2-ep2` (and expert parallel, the PCIe profile's shape at small scale), and then
`-eager` (no CUDA graphs), then `-sglang<X.Y.Z>` (served from that SGLang version's site, which
the runner gets with --site-for; without it, --site's version), and last `-twin`: a second server
of the same config (an A/A pair shows what a table resolves).
The drafter: `real` is the trained drafter (near perfect), `weak` the field-like one (less
capacity, stopped where linear DFlash accepts about 3.6 of 8, as K2.6's drafter does on real
text), `weaker` the same stopped lower, `mid` the same trained on to about 5, `oracle` the trained
drafter with the test-only oracle rewriting its top-K (proving_ground.train).
The issue's matrix is BUDGETS x TOPKS; any other valid budget (1 <= budget <= sum of
topk^d) may be named too, e.g. b2 to show that small budgets start. `matrix.json`
(proving_ground/device/) lists which servers each device run starts.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from k26_ddtree.core import schedule
from k26_ddtree.core.budget import max_budget
from k26_ddtree.errors import UserError

BUDGETS = (4, 8, 16, 32, 64)
TOPKS = (1, 4, 8)
BLOCK_SIZE = 8
SCHEDULE_NAME = re.compile(r"[a-z][a-z0-9]*")
_NAME = re.compile(
    r"^(ar|dflash(?:-(?P<dflash_drafter>weak|weaker|mid))?"
    r"|ddtree-(?:b(?P<b>\d+)-k(?P<k>\d+)|s(?P<s>" + SCHEDULE_NAME.pattern + r"))"
    r"-(?P<drafter>real|weak|weaker|mid|oracle)(?P<spine>-spine)?)(?P<tp>-tp2(?P<ep>-ep2)?)?(?P<eager>-eager)?"
    r"(?P<sglang>-sglang(?P<sglang_version>\d+\.\d+\.\d+))?(?P<twin>-twin)?$"
)
# The drafter checkpoint folder of each drafter kind, under the models folder.
DRAFTER_DIRS = {"real": "drafter", "oracle": "drafter", "weak": "drafter-weak", "weaker": "drafter-weaker",
                "mid": "drafter-mid"}


def valid_pairs() -> list[tuple[int, int]]:
    return [(b, k) for k in TOPKS for b in BUDGETS if b <= max_budget(BLOCK_SIZE - 1, k)]


@dataclass(frozen=True)
class ServerSpec:
    name: str
    algo: str  # AR, DFLASH, DDTREE
    budget: int = 0
    topk: int = 0
    drafter: str = "real"  # a DRAFTER_DIRS key
    eager: bool = False
    spine: bool = False
    tp: int = 1
    ep: int = 1
    schedule: str | None = None  # --speculative-ddtree-budget-schedule, instead of budget/topk
    sglang: str | None = None  # served from that SGLang version's site (--site-for) instead of --site's

    @property
    def speculative(self) -> bool:
        return self.algo != "AR"

    @property
    def oracle(self) -> bool:
        return self.drafter == "oracle"


def parse_server(name: str, schedules: dict[str, str] | None = None) -> ServerSpec:
    """The server a name stands for; `schedules` names the batch-size schedules (matrix "schedules")."""
    m = _NAME.match(name)
    if not m:
        raise UserError(f"server name {name!r}: expected ar, dflash[-weak|-weaker|-mid] or "
                        "ddtree-<b<B>-k<K>|s<SCHEDULE>>-<real|weak|weaker|mid|oracle>[-spine], "
                        "optionally with -tp2 or -tp2-ep2, then -eager, then -sglang<X.Y.Z>, then -twin")
    shape = _variant(m)
    if name.startswith("ar"):
        return ServerSpec(name, "AR", **shape)
    if name.startswith("dflash"):
        return ServerSpec(name, "DFLASH", **shape)
    ddtree = dict(spine=bool(m.group("spine")), **shape)
    if m.group("s"):
        text = (schedules or {}).get(m.group("s"))
        if text is None:
            raise UserError(f"server {name}: no schedule named {m.group('s')!r} (matrix \"schedules\" or --schedule)")
        try:
            schedule.parse_checked(text, BLOCK_SIZE)
        except schedule.ScheduleError as err:
            raise UserError(f"server {name}: schedule {text!r}: {err}") from None
        return ServerSpec(name, "DDTREE", schedule=text, **ddtree)
    budget, topk = int(m.group("b")), int(m.group("k"))
    if not (1 <= budget <= max_budget(BLOCK_SIZE - 1, topk)) or topk < 1:
        raise UserError(f"server {name}: budget {budget} with topk {topk} is not valid "
                        f"(1 <= budget <= sum of topk^d for d=1..{BLOCK_SIZE - 1})")
    return ServerSpec(name, "DDTREE", budget, topk, **ddtree)


def _variant(m: re.Match) -> dict:
    """The drafter, parallelism and graphs a matched name asks for, whatever it serves."""
    return dict(drafter=m.group("drafter") or m.group("dflash_drafter") or "real", eager=bool(m.group("eager")),
                tp=2 if m.group("tp") else 1, ep=2 if m.group("ep") else 1, sglang=m.group("sglang_version"))


def variant(server: str) -> dict | None:
    """{drafter, eager, tp, ep, sglang} of a server name (a schedule server's too, its schedule unchecked);
    None for a name that is not one."""
    m = _NAME.match(server)
    return _variant(m) if m else None


def schedule_name(server: str) -> str | None:
    """The schedule a ddtree-s<NAME> server name refers to; None for any other name."""
    m = _NAME.match(server)
    return m.group("s") if m else None


def load(path: Path) -> dict:
    try:
        matrix = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise UserError(f"cannot read matrix {path}: {err}")
    for run, names in matrix.get("runs", {}).items():
        for name in names:
            # A schedule server is checked once the runner knows every schedule (--schedule too).
            if schedule_name(name) is None:
                parse_server(name)
        if "ar" not in names:
            raise UserError(f"matrix run {run} has no 'ar' server: every run needs its own AR reference")
    return matrix


def server_command(spec: ServerSpec, models: Path, port: int, settings: dict) -> list[str]:
    """`python -m sglang.launch_server ...` for one matrix server (the interpreter is prepended by the caller)."""
    cmd = ["-m", "sglang.launch_server",
           "--model-path", str(models / "target"), "--host", "127.0.0.1", "--port", str(port),
           "--attention-backend", "triton", "--grammar-backend", "none", "--dtype", "bfloat16",
           "--mem-fraction-static", str(settings["mem_fraction_static"]),
           "--context-length", str(settings["context_length"]),
           "--max-total-tokens", str(settings["max_total_tokens"]),
           "--max-running-requests", str(settings["max_running_requests"]),
           "--disable-piecewise-cuda-graph", "--skip-server-warmup", "--random-seed", "0",
           "--decode-log-interval", "40",
           # An idle SGLang scheduler otherwise spins a core at 100%: with many servers on one
           # box that steals the CPU the measured server's host-bound steps run on.
           "--sleep-on-idle"]
    if spec.tp > 1:
        cmd += ["--tp-size", str(spec.tp)]
    if spec.ep > 1:
        # The pcie-ep8 profile's MoE all-to-all backend (none: EP without DeepEP).
        cmd += ["--ep-size", str(spec.ep), "--moe-a2a-backend", "none"]
    if spec.eager:
        cmd.append("--disable-cuda-graph")
    else:
        bs = [int(b) for b in settings["cuda_graph_bs"]]
        cmd += ["--cuda-graph-max-bs", str(max(bs)), "--cuda-graph-bs", *[str(b) for b in bs]]
    if spec.speculative:
        cmd += ["--speculative-algorithm", spec.algo,
                "--speculative-draft-model-path", str(models / DRAFTER_DIRS[spec.drafter])]
    if spec.schedule is not None:
        cmd += ["--speculative-ddtree-budget-schedule", spec.schedule]
    elif spec.algo == "DDTREE":
        cmd += ["--speculative-ddtree-budget", str(spec.budget), "--speculative-ddtree-topk", str(spec.topk)]
    if spec.spine:
        cmd.append("--speculative-ddtree-spine")
    return cmd
