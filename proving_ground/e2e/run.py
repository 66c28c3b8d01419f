"""One proving-ground run, phase by phase."""

from __future__ import annotations

import json
import os
import shutil
import signal
import threading
import time

from k26_ddtree import atomic
from k26_ddtree.errors import UserError
from k26_ddtree.processes import descendants
from k26_ddtree.sglang.common.args import TOPK_HOOK_ENV, TRACE_ENV
from proving_ground import lossless, matrix, speed, tuning
from proving_ground.exact import exact_model
from proving_ground.e2e.extras import named_schedules, profile_server, run_bench_harness
from proving_ground.e2e.report import capture_seconds, fatal_lines, gpu_name, overall, write_outputs
from proving_ground.e2e.reuse import fingerprint, oracle_agreement, patched_site, read_state, site_bundle, write_oracle
from proving_ground.e2e.servers import (
    get_json, in_parallel, LOAD_LINES_BYTES, log_head, log_tail, MemorySampler, NO_MEMORY, post, post_json, SAFE_ENV,
    say, Server, Stagger, stop, wait_ready, warm_sampling,
)
from proving_ground.e2e.workloads import cell_record, MIN_WORKLOAD_S, run_workload
from proving_ground.emulator.folder import EMULATOR_LOG_MARK, emulation, EXTERNAL_PACKAGE, EXTERNAL_PACKAGE_ENV
from proving_ground.oracle import ENV_VAR as ORACLE_ENV
from proving_ground.oracle import HOOK as ORACLE_HOOK


class MatrixRun:
    """One proving-ground run, phase by phase: start, reference, cells or speed, extras, report."""

    def __init__(self, args):
        for name in ("matrix", "site", "models", "out", "work", "jit_dir", "patched_site", "oracle_file"):
            if getattr(args, name) is not None:
                setattr(args, name, getattr(args, name).resolve())
        self.args = args
        self.t0 = time.time()
        self.deadline = self.t0 + args.deadline_s
        self.spec = matrix.load(args.matrix)
        names = self.spec["runs"].get(str(args.run))
        if names is None:
            raise UserError(f"matrix {args.matrix} has no run {args.run!r} (runs: {', '.join(self.spec['runs'])})")
        if args.only:
            names = [n for n in names if n in args.only or n == "ar"]
        self.is_speed = str(args.run) in self.spec.get("speed_runs", [])
        self.settings = dict(self.spec["server"], **self.spec.get("run_settings", {}).get(str(args.run), {}))
        # A run may generate fewer tokens per request (its speed repeats then end sooner).
        self.spec["new_tokens"] = int(self.settings.get("new_tokens", self.spec["new_tokens"]))
        # A run may serve another slice of the prompts (tune's traced ones) or more of them.
        first = int(self.settings.get("prompt_offset", 0))
        count = int(self.settings.get("prompts", self.spec["prompts"]))
        try:
            prompts_doc = json.loads((args.models / "prompts.json").read_text())
            self.prompts = [p["input_ids"] for p in prompts_doc["prompts"]][first:first + count]
            self.emulated = emulation(args.models)
        except (OSError, ValueError, KeyError, TypeError) as err:
            raise UserError(f"{args.models}/prompts.json is missing or not the model pair's prompts ({err}); "
                            "make the pair with `python -m proving_ground.train --out DIR`") from None
        self.tie_rule = lossless.TieRule(float(self.spec["eps"]), exact_model(args.models, self.prompts),
                                         float(self.spec.get("exact_eps", 0.0)))
        unknown = [run for run in args.keep_for if run not in self.spec["runs"]]
        if unknown:
            raise UserError(f"--keep-for {unknown[0]}: no such run in {args.matrix} (runs: {', '.join(self.spec['runs'])})")
        if args.oracle_file is not None and not args.oracle_file.is_file():
            raise UserError(f"--oracle-file {args.oracle_file}: no such file")
        self.logs = args.work / "logs"
        # Every name and schedule checked before OUT and WORK are made: a mistake leaves nothing behind.
        given, chains = named_schedules(args.schedule)
        self.schedules = dict(self.spec.get("schedules", {}), **given)
        self.not_started = {n: f"the tune file of schedule {matrix.schedule_name(n)!r} chose the plain chain at every "
                               "concurrency: the run's DFLASH server serves that" for n in names
                            if matrix.schedule_name(n) in chains}
        names = [n for n in names if n not in self.not_started]
        self.servers = [Server(matrix.parse_server(n, self.schedules), 0, self.logs / f"{n}.log") for n in names]
        self.tunes, self.tune_notes = tuning.groups(self.spec, str(args.run), names)
        self.tunes, kept_notes = tuning.with_kept_traces(self.tunes, args.work, time.time())
        self.tune_notes += kept_notes
        args.out.mkdir(parents=True, exist_ok=True)
        self.logs.mkdir(parents=True, exist_ok=True)
        self.state = args.work / "servers.json"
        self.oracle_path = args.work / "oracle.json"
        self.carried_oracle = args.oracle_file
        self.envs: dict[str, dict] = {}
        self.previous: dict[str, dict] = {}  # servers earlier runs kept for other runs
        self.reference: dict | None = None
        self.ref_rows: list = []
        self.cells: dict[str, list] = {s.spec.name: [] for s in self.servers}
        self.speed: list[dict] = []
        self.stagger = Stagger(float(self.settings.get("launch_stagger_s", 0)))
        self.sampler = MemorySampler(self.servers)
        self.fingerprint = fingerprint(args.site, args.models, self.settings)

    def time_left(self) -> float:
        return self.deadline - time.time()

    def ready_timeout(self) -> float:
        return max(1.0, min(float(self.settings["ready_timeout_s"]), self.time_left() - MIN_WORKLOAD_S))

    def run(self) -> dict:
        for name, why in self.not_started.items():
            say(f"{name}: not started; {why}")
        for note in self.tune_notes:
            say(note)
        self.sampler.start()
        try:
            self.start_servers()
            self.take_reference()
            if not self.is_speed:
                self.serve_cells()
            self.stop_sampling()
            if self.is_speed:
                self.measure_speed()
            self.run_extras()
        finally:
            report = self.finish()
        return report

    # start --------------------------------------------------------------------------------------
    def start_servers(self) -> None:
        """Reuse what an earlier run kept, launch the rest (first wave, then the others; -oracle
        servers wait for the reference), and wait until every launched server is ready."""
        kept = read_state(self.state, self.fingerprint, {v: site_bundle(site) for v, site in self.args.site_for.items()})
        self.previous = {n: e for n, e in kept.items() if n not in {s.spec.name for s in self.servers}}
        used_ports = {int(k["port"]) for k in kept.values()}
        port = self.args.base_port
        to_launch = []
        tracing = [group for group in self.tunes if group.trace]
        traced = {group.trace for group in tracing}
        for group in tracing:
            # Whatever this run's trace server does not write is no trace of this run.
            group.trace_file(self.args.work).unlink(missing_ok=True)
        for server in self.servers:
            old = kept.get(server.spec.name)
            if old and (server.spec.name in traced or old.get("traced")):
                # A kept server writes no trace, or an earlier run's: start it anew, tracing. One
                # that an earlier run traced and this one does not is started anew too: its trace
                # writes are host work in every step the other servers do not do.
                why = ("traced in this run" if server.spec.name in traced else
                       "traced by the run that kept it and not by this one")
                say(f"{server.spec.name}: {why}, so the kept one is stopped and started anew")
                server.port, server.pid = int(old["port"]), int(old["pid"])
                stop(server)
                server.pid = None
            elif old and self.reuse(server, old):
                continue
            while port in used_ports:
                port += 1
            server.port, port = port, port + 1
            to_launch.append(server)
        self.prepare_envs(to_launch)
        to_launch = [s for s in to_launch if s.spec.name in self.envs]
        if self.carried_oracle:
            shutil.copyfile(self.carried_oracle, self.oracle_path)
        else:
            self.oracle_path.unlink(missing_ok=True)
        first = set(self.spec.get("first_wave", []))
        now = [s for s in to_launch if not self.waits_for_reference(s)]
        wave1 = [s for s in now if s.spec.name in first]
        self.record_state()
        self.launch_and_wait(wave1)
        # The first sampling request of a process compiles flashinfer's sampling kernels
        # (about 100 s): the first wave pays it once, into the shared cache, while the rest start.
        warmers = [threading.Thread(target=warm_sampling, args=(s,), daemon=True) for s in wave1 if s.status == "ready"]
        for t in warmers:
            t.start()
        last = set(self.spec.get("last_wave", []))
        self.launch_and_wait([s for s in now if s.spec.name not in first | last])
        # SGLang sizes a server's pool from the memory free while it starts: one started beside
        # several others of a 12 GB model can find too little (bench/results/2026-12-01-wide-weak-schedule-steady-costs).
        self.launch_and_wait([s for s in now if s.spec.name in last - first])
        for t in warmers:
            t.join(timeout=max(1.0, self.time_left() - MIN_WORKLOAD_S))
        if self.emulated:
            for server in self.servers:
                if server.status == "ready" and EMULATOR_LOG_MARK not in log_head(server.log, LOAD_LINES_BYTES):
                    server.status = f"failed: serves the plain target (no {EMULATOR_LOG_MARK!r} line in its log)"
        reused = [s.spec.name for s in self.servers if s.reused]
        say(f"servers ready: {sum(s.status == 'ready' for s in self.servers)}; reused from an earlier run: "
            f"{', '.join(reused) or 'none'}")

    def reuse(self, server: Server, old: dict) -> bool:
        server.port, server.pid = int(old["port"]), int(old["pid"])
        if server.alive() and get_json(server.url + "/server_info", timeout=10) is not None:
            server.reused, server.status = True, "ready"
            server.launched_at, server.ready_s = float(old.get("launched_at", 0)), 0.0
            server.pids = {server.pid} | descendants(server.pid)
            return True
        say(f"{server.spec.name}: the kept server (pid {server.pid}) does not answer; stopping it, starting anew")
        stop(server)
        server.pid = None
        return False

    def record_state(self, keep: set[str] | None = None) -> None:
        """WORK/servers.json: every live server of this run and what earlier runs kept, so that a
        later run reuses the kept ones and stops the rest, even when this run is killed before its
        end. keep: the servers kept at the end; None while the run goes on, when a server reused
        from a keeping run stays kept and one launched by this run is not yet."""
        mine = {s.spec.name: {"port": s.port, "pid": s.pid, "launched_at": s.launched_at, "traced": s.traced,
                              "keep": s.reused if keep is None else s.spec.name in keep, **self.site_record(s)}
                for s in self.servers if s.pid is not None and s.alive()}
        atomic.write_text(self.state, json.dumps({"fingerprint": self.fingerprint,
                                                  "servers": {**self.previous, **mine}}, indent=1) + "\n")

    def site_record(self, server: Server) -> dict:
        """What a kept server of another SGLang version must find again: the bundle it runs."""
        version = server.spec.sglang
        if version is None or version not in self.args.site_for:
            return {}
        return {"sglang": version, "site_bundle": site_bundle(self.args.site_for[version])}

    def waits_for_reference(self, server: Server) -> bool:
        return server.spec.oracle and self.carried_oracle is None

    def prepare_envs(self, to_launch: list[Server]) -> None:
        args = self.args
        base_env = dict(os.environ, **SAFE_ENV, PYTHONUNBUFFERED="1",
                        TRITON_CACHE_DIR=str(args.jit_dir / "triton"), TVM_FFI_CACHE_DIR=str(args.jit_dir / "tvm-ffi"),
                        FLASHINFER_WORKSPACE_BASE=str(args.jit_dir / "flashinfer"),
                        TORCHINDUCTOR_CACHE_DIR=str(args.jit_dir / "inductor"))
        base_env.pop(ORACLE_ENV, None)
        base_env.pop(TOPK_HOOK_ENV, None)
        base_env.pop(EXTERNAL_PACKAGE_ENV, None)
        if self.emulated:
            base_env[EXTERNAL_PACKAGE_ENV] = EXTERNAL_PACKAGE
        ddtree_sites: dict[str | None, tuple] = {}  # SGLang version (None: --site's) -> (site or None, why)
        for server in to_launch:
            version = server.spec.sglang
            site = args.site if version is None else args.site_for.get(version)
            if site is None:
                server.status = (f"skipped: no site for sglang {version} (the runner's --site-for; run.sh installs "
                                 "one from a bundle carried with K26_SITE_SGLANG)")
                continue
            if server.spec.algo == "DDTREE":
                if version not in ddtree_sites:
                    ddtree_sites[version] = self.ddtree_site(version, site)
                site, why = ddtree_sites[version]
                if site is None:
                    server.status = f"skipped: {why}"
                    continue
            self.envs[server.spec.name] = dict(base_env, PYTHONPATH=str(site))
            for group in self.tunes:
                if server.spec.name == group.trace:
                    self.envs[server.spec.name][TRACE_ENV] = str(group.trace_file(args.work))
                    server.traced = True
            if server.spec.oracle:
                self.envs[server.spec.name].update({ORACLE_ENV: str(self.oracle_path), TOPK_HOOK_ENV: ORACLE_HOOK})

    def ddtree_site(self, version: str | None, site) -> tuple:
        """(the patched copy of `site` the DDTREE servers of that SGLang version run from, or None; why)."""
        args = self.args
        if version is None and args.patched_site:
            return args.patched_site, "given with --patched-site"
        previous = args.work / ("site-ddtree" if version is None else f"site-ddtree-sglang{version}")
        if previous.is_dir() and any(s.reused and s.spec.algo == "DDTREE" and s.spec.sglang == version
                                     for s in self.servers):
            # Reused servers run from it: copying it anew would pull the files from under them.
            return previous, "the one the reused servers run from"
        say(f"applying the DDTree patch set to a copy of {site}")
        patched, why = patched_site(site, previous, args.python, self.logs / f"{previous.name}-apply.log")
        say(f"patch set: {why}")
        return patched, why

    def launch_and_wait(self, wave: list[Server]) -> None:
        if not wave:
            return
        for server in wave:
            self.stagger.launch(server, self.args.python, self.args.models, self.settings, self.envs[server.spec.name])
        self.record_state()
        say(f"launched {', '.join(s.spec.name for s in wave)}")
        timeout = self.ready_timeout()
        in_parallel(lambda s=s: wait_ready(s, timeout) for s in wave)
        if len(wave) > 1:
            crowded = [s for s in wave if s.status.startswith("failed") and NO_MEMORY in log_tail(s.log, 60)]
            # A start takes about as long as its wave's slowest did.
            start_s = max(s.ready_s or 0.0 for s in wave)
            for server in crowded:
                self.start_alone(server, start_s)

    def start_alone(self, server: Server, start_s: float) -> None:
        """Once more, now that its wave has settled: SGLang sizes a server's pool from the memory free
        around its own weight load, so neighbours loading beside it can leave it none
        (bench/results/2026-12-01-wide-weak-schedule-cost-rounds). The first start's log is kept beside."""
        if self.time_left() < start_s + MIN_WORKLOAD_S:
            say(f"{server.spec.name}: too little time left to start it again alone (a start took {start_s:.0f} s)")
            return
        # A dead leader can leave children that hold the port and GPU memory.
        try:
            os.killpg(server.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        server.log.replace(server.log.with_name(server.log.stem + ".crowded.log"))
        say(f"{server.spec.name} found too little free GPU memory, possibly because others of its wave loaded "
            "meanwhile: starting it again, alone")
        server.retried_alone = True
        self.stagger.launch(server, self.args.python, self.args.models, self.settings, self.envs[server.spec.name])
        self.record_state()
        wait_ready(server, self.ready_timeout())

    # reference ----------------------------------------------------------------------------------
    def take_reference(self) -> None:
        """AR greedy-c1 with top-2 log-probs: the reference of every greedy cell and the oracle file;
        then the -oracle servers start."""
        ar = next(s for s in self.servers if s.spec.name == "ar")
        if ar.status == "ready":
            # At C > 1 an emulated box's reference costs a fraction of the device time. AR at
            # another batch size can part from AR at a near-tie: the verdicts show those gaps.
            workload = dict(self.spec["workloads"]["greedy-c1"],
                            concurrency=int(self.settings.get("reference_concurrency", 1)))
            results, wall = run_workload(ar, workload, self.prompts, self.spec["new_tokens"], True, self.deadline)
            rows = [r for r in results if "error" not in r]
            cell = cell_record(ar, "greedy-c1", workload, results, wall, None, self.tie_rule)
            if len(rows) == len(self.prompts):
                self.reference = {r["prompt"]: r for r in rows}
                self.ref_rows = rows
                cell["verdict"] = "reference"
                path = self.args.out / f"oracle-run{self.args.run}.json"
                write_oracle(path, self.prompts, self.reference, self.args.seed, self.args.rank_policy)
                if self.carried_oracle is None:
                    shutil.copyfile(path, self.oracle_path)
            else:
                say("AR reference incomplete: greedy cells cannot be judged")
            self.cells["ar"].append(cell)
        waiting = [s for s in self.servers if s.spec.name in self.envs and self.waits_for_reference(s)]
        if self.reference is None:
            for server in waiting:
                server.status = "skipped: no AR reference for the oracle file"
            return
        self.launch_and_wait(waiting)

    # cells --------------------------------------------------------------------------------------
    def serve_cells(self) -> None:
        """Each server's matrix workloads, one workload on the GPU at a time; greedy cells are judged
        against the reference (the AR server's own c16 against its c1)."""
        only = self.spec.get("run_cells", {}).get(str(self.args.run))
        for server in self.servers:
            if only is not None and server.spec.name not in only:
                continue
            names = self.spec.get("run_workloads", {}).get(str(self.args.run), {}).get(server.spec.name) or (
                self.spec["spec_workloads"] if server.spec.speculative else self.spec["ar_workloads"])
            for wname in names:
                if server.spec.name == "ar" and wname == "greedy-c1":
                    continue
                if server.status != "ready":
                    break
                if self.time_left() < MIN_WORKLOAD_S:
                    server.status = f"cut off at the run deadline before {wname}"
                    break
                workload = self.spec["workloads"][wname]
                results, wall = run_workload(server, workload, self.prompts, self.spec["new_tokens"], False,
                                             self.deadline)
                cell = cell_record(server, wname, workload, results, wall, self.reference, self.tie_rule)
                self.cells[server.spec.name].append(cell)
                say(f"{server.spec.name} {wname}: {cell['verdict']} tok/s {cell['tok_per_s']} "
                    f"accept {cell['accept_length']}")
                if not server.alive():
                    server.status = f"crashed during {wname} (exit {server.exit_code()})"

    def stop_sampling(self) -> None:
        # Every measurement (the speed table, tune's costs, bench, profiles) runs without the memory
        # sampler: two nvidia-smi starts every two seconds are noise in host-bound steps, the peaks
        # are known once the cells have run, and costs must be measured as the table they predict.
        # Joined, so that no nvidia-smi still running overlaps the first measurement.
        self.sampler.stop_event.set()
        self.sampler.join(timeout=45)
        if self.sampler.is_alive():
            say("the memory sampler's nvidia-smi still runs after 45 s")

    def measure_speed(self) -> None:
        skip = set(self.spec["speed"].get("skip", {}).get(str(self.args.run), []))
        ready = [s for s in self.servers if s.status == "ready" and s.spec.name not in skip]
        spec = speed.SpeedSpec.from_matrix(self.spec, self.args.run)
        if any(float(cell["temperature"]) > 0 for cell in spec.cells.values()):
            # The sampling kernels load once per process: not inside a cell's latency pass.
            in_parallel(lambda s=s: warm_sampling(s) for s in ready)
        table_groups = [group for group in self.tunes if group.trace_from]
        # What the report still needs: stopping kept servers is not needed, the rest is quick; and
        # a table group's costs are worth nothing unless its tune still runs after the table.
        table_end = self.deadline - 12 - tuning.TABLE_TUNE_S * len(table_groups)
        table_costs = tuning.TableCosts(self.servers, table_groups, self.args, self.prompts, self.spec["new_tokens"],
                                        table_end, say) if table_groups else None
        self.speed = speed.measure(ready, spec, self.prompts, self.reference, self.tie_rule,
                                   lambda url, ids, params, rid: post_json(
                                       url + "/generate", {"input_ids": ids, "sampling_params": params, "rid": rid},
                                       timeout=max(5.0, self.time_left())),
                                   lambda url, rid: post(url + "/abort_request", {"rid": rid}, timeout=5.0),
                                   table_end, say, table_costs.after_round if table_costs else None)
        for server in ready:
            if not server.alive():
                server.status = f"crashed during the speed cells (exit {server.exit_code()})"

    def run_extras(self) -> None:
        if self.tunes:
            tuning.costs_and_tune(self.servers, self.tunes, self.args, self.prompts, self.spec["new_tokens"],
                                  self.deadline, say)
        if self.args.bench_server:
            run_bench_harness(self.servers, self.args, self.deadline)
        for name in self.args.profile_server:
            profile_server(self.servers, name, self.prompts, self.spec["new_tokens"], self.args, self.deadline)

    # report -------------------------------------------------------------------------------------
    def finish(self) -> dict:
        """Server info, stop what no later run needs (or keep it, recorded in WORK/servers.json),
        and write the report."""
        keep = {n for run in self.args.keep_for for n in self.spec["runs"][run]}
        accept = {}
        for s in self.servers:
            if s.status == "ready" and not s.alive():
                s.status = f"exited early (code {s.exit_code()})"

        def server_info(s: Server) -> None:
            info = get_json(s.url + "/server_info", timeout=5)
            if info:
                accept[s.spec.name] = (info.get("internal_states") or [{}])[0].get("avg_spec_accept_length")

        in_parallel(lambda s=s: server_info(s) for s in self.servers if s.status == "ready")
        self.stop_sampling()
        in_parallel(lambda s=s: stop(s) for s in self.servers if not (s.spec.name in keep and s.status == "ready"))
        for s in self.servers:
            if s.status == "ready":
                s.status = "kept running" if s.spec.name in keep and s.alive() else "stopped"
        self.record_state(keep)
        report = self.report(accept)
        write_outputs(self.args.out, report, self.logs)
        if self.is_speed:
            spec = speed.SpeedSpec.from_matrix(self.spec, self.args.run)
            baseline = next((s.spec.name for s in self.servers if s.spec.algo == "DFLASH"), "ar")
            atomic.write_text(self.args.out / f"speed-run{self.args.run}.md", speed.markdown(
                str(self.args.run), self.speed, baseline, spec, report["device"], len(self.prompts)))
        say(f"run {self.args.run}: {report['overall']} ({report['wall_s']} s)")
        return report

    def report(self, accept: dict) -> dict:
        servers_out = []
        for s in self.servers:
            servers_out.append({"name": s.spec.name, "algo": s.spec.algo, "budget": s.spec.budget, "topk": s.spec.topk,
                                "drafter": s.spec.drafter, "eager": s.spec.eager, "spine": s.spec.spine,
                                "tp": s.spec.tp, "ep": s.spec.ep,
                                "status": s.status, "reused": s.reused, "retried_alone": s.retried_alone,
                                "port": s.port, "ready_s": s.ready_s,
                                "capture_s": capture_seconds(s.log), "peak_mem_mib": s.peak_mem_mib,
                                "fatal_log_lines": fatal_lines(s.log),
                                "avg_spec_accept_length": accept.get(s.spec.name),
                                "cells": self.cells.get(s.spec.name, [])})
        report = {"run": str(self.args.run), "device": gpu_name(), "prompts": len(self.prompts),
                  "new_tokens": self.spec["new_tokens"], "eps": self.spec["eps"],
                  "exact_eps": self.tie_rule.exact_eps if self.tie_rule.exact else None,
                  "wall_s": round(time.time() - self.t0, 1), "gpu_peak_mib": self.sampler.total_peak_mib,
                  "reference_gaps": lossless.gap_stats([r["top2"] for r in self.ref_rows]) if self.ref_rows else None,
                  "oracle_file": "carried" if self.carried_oracle else "this run's AR",
                  "servers": servers_out, "not_started": self.not_started, "emulated": self.emulated,
                  "prompt_offset": int(self.settings.get("prompt_offset", 0))}
        if self.is_speed:
            report["speed"] = self.speed
        for name in ("train_report", "acceptance"):
            path = self.args.models / f"{name}.json"
            if path.is_file():
                report[name] = json.loads(path.read_text())
        if self.carried_oracle and self.reference:
            report["carried_oracle_vs_this_ar"] = oracle_agreement(self.carried_oracle, self.reference)
        cells_here = self.spec.get("run_cells", {}).get(str(self.args.run))
        idle = set() if cells_here is None else {s.spec.name for s in self.servers} - set(cells_here)
        report["overall"] = overall(servers_out, self.speed, idle)
        return report
