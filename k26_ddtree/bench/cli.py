"""`k26-deploy bench [run|eval|report|sweep]`: benchmark a running server and report on it.

`k26-deploy bench` with no subcommand is `bench run`. Heavy modules (httpx,
matplotlib, yaml) are imported inside the handlers so `k26-deploy --help`
stays fast.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from datetime import datetime, timezone
from pathlib import Path

from k26_ddtree import paths
from k26_ddtree.bench.results import MAX_CONCURRENCY, MAX_REQUESTS
from k26_ddtree.cli import checks

DEFAULT_URL = "http://127.0.0.1:30000"
DEFAULT_CONTEXTS = "60,1024,4096,8192"
DEFAULT_CONCURRENCY = "1,8,32,64,128"
DEFAULT_RECONFIGURE = "{python} -m k26_ddtree reconfigure --budget {budget} --topk {topk}"

RESULTS_HELP = (
    "Results: one JSON file holds {'schema', 'runs': [...]}; each run records the server's "
    "/server_info args (secrets redacted), profile, budget/topk, git SHA, snapshot id, settings, "
    "one object per (context, concurrency) cell and the coding eval. --out appends to an existing "
    "file, and the file is rewritten atomically after every cell, so Ctrl-C keeps what finished. "
    "Schema: bench/results/README.md."
)


def int_list(text: str) -> tuple[int, ...]:
    """'1,8,32' -> (1, 8, 32); distinct positive integers only (an empty item or a repeat is a typo:
    it would drop a value silently, or measure one cell twice under one key)."""
    items = [part.strip() for part in text.split(",")]
    if "" in items:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r} (an empty item)")
    try:
        values = tuple(int(item) for item in items)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    repeated = sorted({v for v in values if values.count(v) > 1})
    if repeated:
        raise argparse.ArgumentTypeError(f"{', '.join(map(str, repeated))} given twice in {text!r}")
    return values


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"expected a finite number of seconds > 0, got {text!r}")
    return value


# A closed loop longer than a day is a typo (1e308 would never end, and overflows deadlines).
MAX_STEADY_S = 86400.0


def steady_seconds(text: str) -> float:
    value = positive_float(text)
    if value > MAX_STEADY_S:
        raise argparse.ArgumentTypeError(f"expected at most {MAX_STEADY_S:g} seconds (a day), got {text!r}")
    return value


def concurrency_list(text: str) -> tuple[int, ...]:
    values = int_list(text)
    if max(values) > MAX_CONCURRENCY:
        raise argparse.ArgumentTypeError(f"at most {MAX_CONCURRENCY} requests in flight (a cell builds its "
                                         f"max(8, 2*C) prompts before it starts), got {text!r}")
    return values


def request_count(text: str) -> int:
    value = positive_int(text)
    if value > MAX_REQUESTS:
        raise argparse.ArgumentTypeError(f"at most {MAX_REQUESTS} requests per cell (a cell builds all its "
                                         f"prompts before it starts), got {text!r}")
    return value


def default_out() -> Path:
    return Path(f"k26-bench-{datetime.now(timezone.utc).strftime('%Y%m%dT%H%M%SZ')}.json")


def _add_server_args(p: argparse.ArgumentParser, record_config: bool = True) -> None:
    g = p.add_argument_group("server and run record")
    g.add_argument("--url", default=DEFAULT_URL, help=f"server base URL (default {DEFAULT_URL})")
    g.add_argument("--api-key-file", type=checks.path_arg,
                   help="file holding the server's API key, sent as 'Authorization: Bearer'; "
                        "else $K26_API_KEY; never printed or stored")
    g.add_argument("--out", type=checks.path_arg,
                   help="results JSON to create or append to (default ./k26-bench-<UTC time>.json); "
                        "a symlink is followed: the file it names is the one appended to")
    g.add_argument("--label", help="name of this run in reports (default from the server: AR, DFLASH, DDTREE b8 k4)")
    g.add_argument("--profile", default=os.environ.get("K26_PROFILE"),
                   help="deploy profile name to record ($K26_PROFILE)")
    if record_config:
        g.add_argument("--budget", type=positive_int, help="DDTree budget to record (default: the server's own arg)")
        g.add_argument("--topk", type=positive_int, help="DDTree top-K to record (default: the server's own arg)")
    g.add_argument("--snapshot-id", default=os.environ.get("K26_SNAPSHOT_ID"),
                   help="environment snapshot id to record ($K26_SNAPSHOT_ID)")
    g.add_argument("--request-timeout", type=float, default=600.0, help="seconds per request (default 600)")
    g.add_argument("--ready-timeout", type=float, default=60.0,
                   help="seconds to wait for /health_generate before starting (default 60)")
    g.add_argument("--quiet", action="store_true", help="no progress on stderr")


def _add_matrix_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("matrix")
    g.add_argument("--contexts", type=int_list,
                   help=f"prompt lengths in tokens (default {DEFAULT_CONTEXTS}; with --prompt-set: the set's mean)")
    g.add_argument("--concurrency", type=concurrency_list, default=int_list(DEFAULT_CONCURRENCY),
                   help=f"concurrency levels, at most {MAX_CONCURRENCY} (default {DEFAULT_CONCURRENCY})")
    g.add_argument("--output-len", type=positive_int, default=256, help="tokens generated per request (default 256)")
    g.add_argument("--requests", type=request_count,
                   help=f"requests per cell, at most {MAX_REQUESTS} (default max(8, 2*C))")
    g.add_argument("--warmup", type=int, default=2,
                   help="warm-up requests before each cell, not measured (default 2)")
    g.add_argument("--temperature", type=float, default=0.0, help="sampling temperature (default 0: greedy)")
    g.add_argument("--no-ignore-eos", dest="ignore_eos", action="store_false",
                   help="stop at EOS (default: ignore_eos, every request generates --output-len tokens)")
    g.add_argument("--seed", type=int, default=0, help="prompt seed: same seed, same prompts (default 0)")
    g.add_argument("--id-range",
                   help="token ids of random-ids prompts, LOW:HIGH with 0 <= LOW < HIGH (default 1000:30000, cut to "
                        "the served model's vocabulary); special ids are always skipped, and a range past the "
                        "vocabulary is refused")
    g.add_argument("--vocab-size", type=positive_int, metavar="N",
                   help="token ids of the served model, when its config.json is not on this machine (the bench "
                        "reads it from the server's model_path and refuses to guess)")
    g.add_argument("--prompt-file", type=checks.path_arg,
                   help="take prompts from windows of this text file instead of random ids "
                        "(a word per token unless --tokenizer is given)")
    g.add_argument("--tokenizer", help="tokenizer (path or name) to cut --prompt-file windows of exact token length")
    g.add_argument("--prompt-set", type=checks.path_arg, metavar="FILE",
                   help='exact prompts, a JSON object a line: {"input_ids": [...]} or {"text": "..."}, sent as '
                        "given in file order and cycled; a cell's prompts are whole cycles of the set, enough for C in "
                        "flight (or --requests of them), its context the mean prompt length; not with "
                        "--prompt-file, --id-range, --contexts")
    g.add_argument("--steady", type=steady_seconds, metavar="SECONDS",
                   help="steady state: per cell, --repeats closed loops of plain (not streamed) requests, C in "
                        "flight, the cell's prompts cycled until a whole cycle ends after SECONDS; output_tok_s "
                        "is the median repeat. The step times `tune` reads from cells are a server's serving C "
                        "steadily, which a cell sent once (ramp-up, waves, tail) does not measure")
    g.add_argument("--repeats", type=positive_int, metavar="N", help="closed-loop repeats per --steady cell (default 5)")
    g.add_argument("--eval", action="store_true", help="also run the coding eval after the matrix")


def _add_eval_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("coding eval")
    g.add_argument("--eval-endpoints", default="chat,generate", help="chat, generate or both (default chat,generate)")
    g.add_argument("--eval-max-tokens", type=positive_int, default=4096,
                   help="max new tokens per answer, reasoning included (default 4096)")
    g.add_argument("--eval-temperature", type=float, default=0.0, help="temperature for the eval (default 0)")
    g.add_argument("--eval-concurrency", type=positive_int, default=4, help="eval requests in flight (default 4)")
    g.add_argument("--eval-test-timeout", type=float, default=10.0,
                   help="seconds per sandboxed test run (default 10)")
    g.add_argument("--eval-tokenizer",
                   help="chat template for /generate prompts (default: the server's tokenizer path if it is local)")
    g.add_argument("--tasks", type=checks.path_arg, help="task file (default: the built-in bench/coding_tasks.yaml)")
    g.add_argument("--task", action="append", help="run only this task id (repeatable)")
    g.add_argument("--eval-unsandboxed", action="store_true",
                   help="where bubblewrap (bwrap) does not work, still run the model's code: in a plain process "
                        "with rlimits, as uid nobody when run as root; without this flag the eval refuses")


def _add_run_args(p: argparse.ArgumentParser, record_config: bool = True) -> None:
    _add_server_args(p, record_config)
    _add_matrix_args(p)
    _add_eval_args(p)


def _eval_settings(args):
    from k26_ddtree.bench.coding_eval import EvalSettings
    from k26_ddtree.bench.tasks import load_tasks

    return EvalSettings(
        tasks=tuple(load_tasks(args.tasks, args.task)),
        endpoints=tuple(e.strip() for e in args.eval_endpoints.split(",") if e.strip()),
        max_tokens=args.eval_max_tokens,
        temperature=args.eval_temperature,
        concurrency=args.eval_concurrency,
        test_timeout_s=args.eval_test_timeout,
        tokenizer=args.eval_tokenizer,
        allow_unsandboxed=args.eval_unsandboxed,
    )


def _check_prompt_set(args) -> None:
    from k26_ddtree.errors import UserError

    if args.prompt_set is None:
        return
    for flag, given in (("--prompt-file", args.prompt_file), ("--id-range", args.id_range),
                        ("--contexts", args.contexts)):
        if given is not None:
            raise UserError(f"--prompt-set and {flag} exclude each other: the set's prompts are sent as given")
    if args.requests is not None and args.steady is not None:
        raise UserError("--requests with --steady and --prompt-set: the steady cycle is the whole set")


def _run_options(args, with_matrix: bool, with_eval: bool):
    from k26_ddtree.bench.client import read_api_key
    from k26_ddtree.bench.harness import MatrixSettings
    from k26_ddtree.bench.isolation import detect_isolation
    from k26_ddtree.bench.prompts import PromptSource, parse_id_range
    from k26_ddtree.bench.runner import RunOptions
    from k26_ddtree.errors import UserError

    checks.http_url(args.url, "--url", "http://127.0.0.1:30000")
    checks.seconds("--request-timeout", args.request_timeout, allow_zero=False)
    checks.seconds("--ready-timeout", args.ready_timeout, allow_zero=False)
    if with_eval:
        checks.seconds("--eval-test-timeout", args.eval_test_timeout, allow_zero=False)
    matrix = prompts = None
    if with_matrix:
        if not args.temperature >= 0:
            raise UserError(f"--temperature must be 0 or more, got {args.temperature}")
        if args.warmup < 0:
            raise UserError("--warmup must be 0 or more")
        if args.tokenizer and not args.prompt_file:
            raise UserError("--tokenizer only applies to --prompt-file (random-ids prompts need no tokenizer)")
        _check_prompt_set(args)
        if args.repeats is not None and args.steady is None:
            raise UserError("--repeats only applies to --steady (a cell sent once has no repeats)")
        matrix = MatrixSettings(
            contexts=() if args.prompt_set else args.contexts or int_list(DEFAULT_CONTEXTS),
            concurrencies=args.concurrency,
            output_len=args.output_len,
            requests_per_cell=args.requests,
            warmup=args.warmup,
            temperature=args.temperature,
            ignore_eos=args.ignore_eos,
            steady_seconds=args.steady,
            repeats=args.repeats or 5,
        )
        prompts = PromptSource(
            seed=args.seed,
            id_range=parse_id_range(args.id_range) if args.id_range is not None else None,
            vocab_size=args.vocab_size,
            text_file=args.prompt_file,
            tokenizer=args.tokenizer,
            prompt_set=args.prompt_set,
        )
    out = args.out or default_out()
    paths.output_target(out, "--out")  # before the server is asked anything
    options = RunOptions(
        url=args.url,
        api_key=read_api_key(args.api_key_file),
        out=out,
        label=args.label,
        profile=args.profile,
        budget=getattr(args, "budget", None),
        topk=getattr(args, "topk", None),
        snapshot_id=args.snapshot_id,
        request_timeout_s=args.request_timeout,
        ready_timeout_s=args.ready_timeout,
        quiet=args.quiet,
        matrix=matrix,
        prompts=prompts,
        coding_eval=_eval_settings(args) if with_eval else None,
    )
    if with_eval:
        detect_isolation(args.eval_unsandboxed)  # refuses before the server is asked, not after the matrix
    return options


def _outcome(run: dict, out: Path) -> int:
    """Exit 0 for a clean run, 1 when any request failed (the cells are marked in the file)."""
    bad_cells = [c for c in run["cells"] if c["has_errors"]]
    evaluation = run.get("coding_eval") or {}
    eval_errors = sum(e["request_errors"] for e in evaluation.get("endpoints", {}).values())
    print(f"bench: results in {out}", file=sys.stderr)
    if bad_cells or eval_errors:
        print(
            f"bench: {len(bad_cells)} cell(s) and {eval_errors} eval request(s) had failed requests "
            f"(marked has_errors / request_errors in {out})",
            file=sys.stderr,
        )
        return 1
    return 0


def _execute(options) -> int:
    from k26_ddtree.bench.runner import execute_run

    try:
        run = execute_run(options)
    except KeyboardInterrupt:
        where = (f"finished cells are in {options.out}" if Path(options.out).is_file()
                 else f"no cell finished, nothing was written to {options.out}")
        print(f"bench: interrupted; {where}", file=sys.stderr)
        return 130
    return _outcome(run, options.out)


def handle_run(args) -> int:
    return _execute(_run_options(args, with_matrix=True, with_eval=args.eval))


def handle_eval(args) -> int:
    return _execute(_run_options(args, with_matrix=False, with_eval=True))


def handle_report(args) -> int:
    from k26_ddtree.bench.report import render_report
    from k26_ddtree.bench.results import load_results

    runs = [run for path in args.results for run in load_results(path)["runs"]]
    written = render_report(runs, args.out)
    for path in written:
        print(path)
    return 0


def handle_sweep(args) -> int:
    from k26_ddtree.bench.sweep import SweepPlan, run_sweep

    checks.seconds("--reconfigure-timeout", args.reconfigure_timeout, allow_zero=False)
    plan = SweepPlan(
        budgets=args.budgets,
        topks=args.topks,
        reconfigure_cmd=args.reconfigure_cmd,
        reconfigure_timeout_s=args.reconfigure_timeout,
    )
    return run_sweep(plan, _run_options(args, with_matrix=True, with_eval=args.eval))


def register(sub) -> None:
    """Add `bench` and its subcommands to the k26-deploy parser."""
    bench = sub.add_parser(
        "bench",
        help="benchmark the running server (context x concurrency matrix, coding eval, report, sweep)",
        description=(
            "Benchmark a running SGLang server: for every (context, concurrency) cell, flush the cache, "
            "send N streamed /generate requests and record output tok/s, per-request tok/s, TTFT, ITL, TPOT "
            "and acceptance length (sum completion_tokens / sum spec_verify_ct beside the server's "
            "avg_spec_accept_length). --steady SECONDS measures each cell as --repeats closed loops of plain "
            "requests instead (C always in flight, the median repeat's tok/s): the steady-state step time "
            "`tune` wants; --prompt-set FILE sends exact prompts. With no subcommand this is `bench run`. "
            + RESULTS_HELP
        ),
    )
    _add_run_args(bench)
    bench.set_defaults(func=handle_run)
    actions = bench.add_subparsers(dest="bench_command", metavar="SUBCOMMAND")

    run = actions.add_parser("run", help="run the matrix (the default)", description=bench.description)
    _add_run_args(run)
    run.set_defaults(func=handle_run)

    evaluation = actions.add_parser(
        "eval",
        help="coding-correctness eval only",
        description=(
            "Send each built-in coding task through /v1/chat/completions and /generate, extract the code "
            "(the last fenced block after the last reasoning-end marker </think> or ◁/think▷; code inside "
            "the reasoning never counts; cut-off reasoning gives no code), run the hidden unit tests in "
            "bubblewrap (never as root; no network, read-only system dirs, private /tmp, seccomp, rlimits) "
            "and report pass@1 per task and tok/s. Without a working bwrap it refuses, unless "
            "--eval-unsandboxed is given. "
            + RESULTS_HELP
        ),
    )
    _add_server_args(evaluation)
    _add_eval_args(evaluation)
    evaluation.set_defaults(func=handle_eval)

    report = actions.add_parser(
        "report",
        help="markdown table and PNG plots from results files",
        description=(
            "Render report.md and PNG plots (tok/s vs concurrency per context, acceptance per cell, "
            "per-request tok/s at C=1) from one or more results files; several runs (AR, DFLASH, DDTREE "
            "b8/b16, ...) are shown side by side with the best config per concurrency."
        ),
    )
    report.add_argument("results", nargs="+", type=checks.path_arg, metavar="RUN.json",
                        help="results files from bench run/sweep")
    report.add_argument("--out", type=checks.path_arg, default=Path("bench-report"),
                        help="output folder (default ./bench-report)")
    report.set_defaults(func=handle_report)

    sweep = actions.add_parser(
        "sweep",
        help="reconfigure + bench for every (budget, topk), then the winner per concurrency",
        description=(
            "For every (budget, topk) pair run the reconfigure command (default: `k26-deploy reconfigure "
            "--budget B --topk K`, which restarts the service and rolls back on failure), wait for health, "
            "run the matrix, and append the run to --out. Ends with a table of the best config per "
            "concurrency (also written next to --out as .sweep.md). " + RESULTS_HELP
        ),
    )
    sweep.add_argument("--budget", dest="budgets", type=int_list, required=True, metavar="B,B,...",
                       help="DDTree budgets to try, e.g. 4,8,16")
    sweep.add_argument("--topk", dest="topks", type=int_list, required=True, metavar="K,K,...",
                       help="DDTree top-K values to try, e.g. 4,8")
    sweep.add_argument("--reconfigure-cmd", default=DEFAULT_RECONFIGURE,
                       help="command template run per config; {python}, {budget}, {topk} are filled in "
                            f"(default: {DEFAULT_RECONFIGURE!r})")
    sweep.add_argument("--reconfigure-timeout", type=float, default=1800.0,
                       help="seconds per reconfigure (default 1800)")
    _add_run_args(sweep, record_config=False)
    sweep.set_defaults(func=handle_sweep)
