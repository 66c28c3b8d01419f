"""Subcommands of the deploy family: detect, render, install, reconfigure, status, wait-ready, wait-gpu-free."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from k26_ddtree.cli import checks
from k26_ddtree.errors import UserError

UNIT_HELP = "systemd unit name (default: k26-ddtree)"


def register(sub) -> None:
    """Add this family's subcommands to the k26-deploy parser."""
    p = sub.add_parser(
        "detect",
        help="suggest a hardware profile from nvidia-smi",
        description="Suggest a shipped profile from the GPUs nvidia-smi reports (name, count, NVLink or "
        "PCIe from `nvidia-smi topo -m`). Prints the profile name on stdout, the reasoning on stderr. "
        "Without GPUs it says so and uses --profile when given.",
    )
    p.add_argument("--profile", help="the profile to use when no GPU is found (or to override the suggestion)")
    p.add_argument("--json", action="store_true", help="print the findings as JSON")
    p.set_defaults(func=_detect)

    p = sub.add_parser(
        "render",
        help="print the systemd unit for a profile",
        description="Render the k26-ddtree unit (or, with --router, the SGLang router unit) for a profile, "
        "validate it with systemd-analyze verify, and print it. Without systemd-analyze it is printed "
        "unchecked and stderr says so. A bind beyond loopback needs api_key: true or open_without_api_key: true.",
    )
    _profile_args(p, required=True)
    p.add_argument("--router", action="store_true",
                   help="render the SGLang router unit for replicas on several machines (router.worker_urls)")
    p.add_argument("--unit", default=None, help="unit name (default: k26-ddtree, or k26-ddtree-router)")
    p.add_argument("--no-verify", action="store_true",
                   help="skip systemd-analyze verify (e.g. rendering for another machine's paths)")
    p.set_defaults(func=_render)

    p = sub.add_parser(
        "install",
        help="write the unit to /etc/systemd/system and daemon-reload",
        description="Render, verify and write the unit atomically, then systemctl daemon-reload. "
        "Needs a running systemd (checked before anything is written); a failed daemon-reload puts the "
        "previous unit file back. `systemctl start k26-ddtree` then returns only when the server is ready.",
    )
    _profile_args(p, required=True)
    p.add_argument("--unit", default="k26-ddtree", help=UNIT_HELP)
    p.add_argument("--unit-dir", type=checks.path_arg, default="/etc/systemd/system",
                   help="directory for the unit file (default /etc/systemd/system; /run/systemd/system: until reboot)")
    p.add_argument("--root", help="write under this root directory instead (image building); no daemon-reload")
    p.add_argument("--enable", action="store_true", help="also enable the unit at boot")
    p.add_argument("--start", action="store_true",
                   help="also (re)start it and wait until the new process is ready and answers a smoke generate")
    _state_arg(p)
    p.set_defaults(func=_install)

    p = sub.add_parser(
        "reconfigure",
        help="retune budget/topk or the batch-size schedule: restart, prove ready, or roll back",
        description="Render the installed unit with a new DDTree budget/topk, batch-size schedule (--schedule, "
        "or --schedule-file from `k26-deploy tune`) or any --set, keep the unit "
        "that last served as last-good, restart, and wait until the NEW main PID answers "
        "/health_generate and a one-request smoke generate. On failure or timeout restore last-good, "
        "restart it, wait for it, and exit 1.",
    )
    p.add_argument("--budget", type=int, help="DDTree node budget (1 <= budget <= sum of topk^d, d < block)")
    p.add_argument("--topk", type=int, help="DDTree children per node (>= 1)")
    p.add_argument("--schedule", metavar="SCHEDULE",
                   help="DDTree tree per batch size, e.g. 1:32/8,4:16/4,16:8/4,64:0 (bs:budget/topk from that "
                   "batch size up; 0 = the DFlash chain); --budget/--topk instead clear it")
    p.add_argument("--schedule-file", type=checks.path_arg, metavar="PATH",
                   help="the JSON `k26-deploy tune` wrote: its schedule and the spine it was planned for "
                   "(a schedule of chains only serves DFLASH)")
    p.add_argument("--profile", help="start from this profile instead of the installed unit's")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a profile key")
    p.add_argument("--allow-missing-model", action="store_true", help="skip the model/drafter directory check")
    p.add_argument("--dry-run", action="store_true", help="print the new unit and its diff; change nothing")
    p.add_argument("--unit", default="k26-ddtree", help=UNIT_HELP)
    _state_arg(p)
    p.set_defaults(func=_reconfigure)

    p = sub.add_parser(
        "status",
        help="active config, MainPID, uptime, readiness, acceptance length",
        description="Show the installed profile, the unit state, MainPID and uptime, readiness of that very "
        "process, and the last acceptance length from /server_info. Exit 0 when ready, 1 otherwise, 2 "
        "without systemd or an installed unit (--json then prints {unit, ready, error}).",
    )
    p.add_argument("--unit", default="k26-ddtree", help=UNIT_HELP)
    p.add_argument("--json", action="store_true", help="print as JSON")
    _state_arg(p)
    p.set_defaults(func=_status)

    p = sub.add_parser(
        "wait-ready",
        help="(unit ExecStartPost) wait until the unit's main process serves /health_generate",
        description="Wait, bounded, until the unit's current main process (MainPID, or $MAINPID inside "
        "ExecStartPost) or one of its children owns the listening socket and /health_generate answers "
        "200. Exits 1 if that process dies or the timeout passes.",
    )
    p.add_argument("--unit", default="k26-ddtree", help=UNIT_HELP)
    p.add_argument("--url", required=True, help="server base URL, e.g. http://127.0.0.1:30000")
    p.add_argument("--timeout", type=float, default=2400, help="seconds to wait at most (default 2400)")
    p.add_argument("--pid", type=int, help="check this PID instead of the unit's main PID")
    p.set_defaults(func=_wait_ready)

    p = sub.add_parser(
        "wait-gpu-free",
        help="(unit ExecStartPre) wait until GPU memory of a previous instance is released",
        description="Wait, bounded, until every GPU uses at most --max-used-mib. Without nvidia-smi or GPUs "
        "there is nothing to wait for and it exits 0.",
    )
    p.add_argument("--timeout", type=float, default=180, help="seconds to wait at most (default 180)")
    p.add_argument("--max-used-mib", type=int, default=2048, help="per-GPU memory that counts as free")
    p.set_defaults(func=_wait_gpu_free)


def _profile_args(p: argparse.ArgumentParser, required: bool) -> None:
    p.add_argument("--profile", required=required,
                   help="a shipped profile (pcie-ep8, pcie-ep4-tp2, nvlink-tp8-nvls) or a path to a .yaml")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a profile key, e.g. --set speculative.budget=16 (repeatable)")
    p.add_argument("--allow-missing-model", action="store_true",
                   help="do not require the model and drafter directories (machines without the weights)")


def _state_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--state-dir", help="where the last-good unit is kept (default $K26_STATE_DIR or /var/lib/k26-ddtree)")


def _say(message: str) -> None:
    print(f"k26-deploy: {message}", flush=True)


def _detect(args) -> int:
    from k26_ddtree.deploy.detect import detect
    from k26_ddtree.deploy.profiles import load_profile, shipped_names

    found = detect()
    if args.json:
        print(json.dumps({"profile": args.profile or found.profile, "suggested": found.profile,
                          "reason": found.reason, "gpus": found.gpus, "nvlink": found.nvlink,
                          "notes": found.notes}, indent=2))
    if args.profile:
        load_profile(args.profile)
        if found.profile and found.profile != args.profile:
            print(f"k26-deploy: note: {found.reason} suggests {found.profile}; using --profile {args.profile}",
                  file=sys.stderr)
        elif not found.profile:
            print(f"k26-deploy: {found.reason}; using --profile {args.profile}", file=sys.stderr)
        if not args.json:
            print(args.profile)
        return 0
    if found.profile is None:
        raise UserError(f"{found.reason}; choose a profile with --profile ({', '.join(shipped_names())})")
    print(f"k26-deploy: {found.reason}: suggesting {found.profile}", file=sys.stderr)
    for note in found.notes:
        print(f"k26-deploy: note: {note}", file=sys.stderr)
    if not args.json:
        print(found.profile)
    return 0


def _installed_sglang(profile):
    """The profile written for the SGLang its python has (a note on stderr when the profile names another)."""
    from k26_ddtree.deploy.installed import for_installed_sglang

    profile, note = for_installed_sglang(profile)
    if note:
        print(f"k26-deploy: note: {note}", file=sys.stderr, flush=True)
    return profile


def _render(args) -> int:
    from k26_ddtree.deploy.profiles import load_profile
    from k26_ddtree.deploy.service import check_model_dirs
    from k26_ddtree.deploy.systemd import unit_file_name
    from k26_ddtree.deploy.units import ROUTER_UNIT, SERVICE_UNIT, render_router, render_service, validate

    if args.unit is not None:
        unit_file_name(args.unit)
    profile = load_profile(args.profile, args.set)
    if args.router:
        unit = args.unit or ROUTER_UNIT
        text = render_router(profile, unit)
    else:
        check_model_dirs(profile, args.allow_missing_model)
        profile = _installed_sglang(profile)
        unit = args.unit or SERVICE_UNIT
        text = render_service(profile, unit)
    if not args.no_verify:
        validate(text, unit)
    print(text, end="")
    return 0


def _install(args) -> int:
    from k26_ddtree.deploy.profiles import load_profile
    from k26_ddtree.deploy.service import check_model_dirs, install, state_dir
    from k26_ddtree.deploy.systemd import unit_file_name

    unit_file_name(args.unit)
    if args.root == "":
        # An empty --root would otherwise mean "no root": a write to this machine's /etc.
        raise UserError("--root is empty: give the directory to write under, or leave --root out")
    if args.root and (args.start or args.enable):
        raise UserError("--start and --enable act on this machine's systemd; with --root they would do nothing")
    if not args.unit_dir.is_absolute():
        raise UserError("--unit-dir must be an absolute path (it is also where systemd looks), "
                        f"got {str(args.unit_dir)!r}")
    profile = load_profile(args.profile, args.set)
    check_model_dirs(profile, args.allow_missing_model)
    profile = _installed_sglang(profile)
    root = Path(args.root).resolve() if args.root else None
    return install(profile, args.unit, args.unit_dir, root, args.start, args.enable,
                   state_dir(args.state_dir), _say)


def _reconfigure(args) -> int:
    from k26_ddtree.deploy.profiles import load_profile, with_sets
    from k26_ddtree.deploy.service import check_model_dirs, installed_unit, reconfigure, state_dir
    from k26_ddtree.deploy.units import profile_from_unit

    # Range errors first: the installed unit (and so systemd) is only read after them.
    for key, value in (("budget", args.budget), ("topk", args.topk)):
        if value is not None and value < 1:
            raise UserError(f"speculative.{key} must be >= 1, got {value}")
    tree_sets = _tree_sets(args)
    _refuse_overlap(args.set, tree_sets, args)
    sets = list(args.set) + tree_sets
    if not sets and not args.profile:
        raise UserError("nothing to change: give --budget, --topk, --schedule, --schedule-file, --set KEY=VALUE "
                        "or --profile")
    if args.profile:
        profile = load_profile(args.profile, sets)
    else:
        unit_path = installed_unit(args.unit)
        profile = with_sets(profile_from_unit(unit_path.read_text(encoding="utf-8"), str(unit_path)), sets)
    check_model_dirs(profile, args.allow_missing_model)
    return reconfigure(_installed_sglang(profile), args.unit, state_dir(args.state_dir), args.dry_run, _say)


def _refuse_overlap(explicit: list[str], implied: list[str], args) -> None:
    """An explicit --set of a key that --budget/--topk or a schedule also sets: refused, since
    either one silently losing deploys something the command line does not say."""
    implied_keys = {item.partition("=")[0] for item in implied}
    for item in explicit:
        key = item.partition("=")[0].strip()
        if key in implied_keys:
            source = ("--schedule-file" if args.schedule_file is not None else "--schedule" if args.schedule is not None
                      else "--budget/--topk")
            raise UserError(f"--set {item} conflicts with {source}, which sets {key} too: give one of them")


def _tree_sets(args) -> list[str]:
    """The --set items of --budget/--topk or of a schedule (one of the two)."""
    from k26_ddtree.core import schedule
    from k26_ddtree.tune import schedule_file

    if args.schedule is not None and args.schedule_file is not None:
        raise UserError("give --schedule or --schedule-file, not both")
    scheduled = args.schedule is not None or args.schedule_file is not None
    if scheduled and (args.budget is not None or args.topk is not None):
        raise UserError("a schedule replaces --budget/--topk: give one or the other")
    sets = []
    if args.budget is not None:
        sets.append(f"speculative.budget={args.budget}")
    if args.topk is not None:
        sets.append(f"speculative.topk={args.topk}")
    if sets:
        return sets + ["speculative.schedule=null"]
    # A schedule of trees serves DDTREE, as one of chains only serves DFLASH: the unit it replaces
    # may be DFLASH (tune's costs end on the DFLASH run, or an earlier file of chains only).
    if args.schedule is not None:
        try:
            schedule.parse(args.schedule)
        except schedule.ScheduleError as err:
            raise UserError(f"--schedule {args.schedule!r}: {err}") from None
        return ["speculative.algorithm=DDTREE", f"speculative.schedule={args.schedule}"]
    if args.schedule_file is not None:
        tuned = schedule_file.read(args.schedule_file)
        spine = f"speculative.spine={'true' if tuned.spine else 'false'}"
        if tuned.schedule is None:
            return ["speculative.algorithm=DFLASH", "speculative.schedule=null"]
        return ["speculative.algorithm=DDTREE", f"speculative.schedule={tuned.schedule}", spine]
    return []


def _status(args) -> int:
    from k26_ddtree.deploy.service import state_dir
    from k26_ddtree.deploy.status import collect, show

    try:
        report = collect(args.unit, state_dir(args.state_dir))
    except UserError as err:
        if args.json:
            # A script reading --json gets an answer in every case; the error line still goes to stderr.
            print(json.dumps({"unit": args.unit, "ready": False, "error": str(err)}, indent=2))
        raise
    print(show(report, args.json))
    return 0 if report["ready"] else 1


def _wait_ready(args) -> int:
    from k26_ddtree.deploy import readiness, systemd

    checks.seconds("--timeout", args.timeout, allow_zero=True)
    checks.http_url(args.url, "--url", "http://127.0.0.1:30000")
    if args.pid is not None and args.pid < 1:
        raise UserError(f"--pid must be a process id >= 1, got {args.pid}")
    # Inside ExecStartPost systemd names the process it just started in $MAINPID: never a stale one.
    env_pid = os.environ.get("MAINPID", "")
    fixed = args.pid if args.pid is not None else (int(env_pid) if env_pid.isdigit() else None)
    main_pid = (lambda: fixed) if fixed is not None else (lambda: systemd.main_pid(args.unit))

    _say(f"waiting up to {args.timeout:.0f} s for {args.unit} (pid {main_pid()}) at {args.url}")
    result = readiness.wait_ready(main_pid, args.url.rstrip("/"), args.timeout, _say)
    if result.ready:
        _say(f"ready: {result.detail}")
        return 0
    print(f"k26-deploy: error: {args.unit} not ready: {result.detail}", file=sys.stderr, flush=True)
    return 1


def _wait_gpu_free(args) -> int:
    from k26_ddtree.deploy.nvidia import wait_memory_released

    checks.seconds("--timeout", args.timeout, allow_zero=True)
    if args.max_used_mib < 0:
        raise UserError(f"--max-used-mib must be 0 or more, got {args.max_used_mib}")
    free, detail = wait_memory_released(args.max_used_mib, args.timeout, _say)
    if free:
        _say(detail)
        return 0
    print(f"k26-deploy: error: {detail}", file=sys.stderr, flush=True)
    return 1
