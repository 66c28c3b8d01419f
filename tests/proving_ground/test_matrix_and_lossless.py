"""The proving-ground matrix (proving_ground/device/matrix.json) and the lossless criterion."""

import importlib.util
import json
import os
import threading
import time
import urllib.request
from http.server import ThreadingHTTPServer
from pathlib import Path
from unittest import mock

import pytest

from k26_ddtree.errors import UserError
from proving_ground import lossless, matrix, speed

MATRIX = Path(__file__).resolve().parents[2] / "proving_ground" / "device" / "matrix.json"


def test_valid_pairs_follow_the_tree_capacity_rule():
    pairs = matrix.valid_pairs()
    assert (4, 1) in pairs and (8, 1) not in pairs  # topk 1: at most 7 nodes below the root
    assert all((b, k) in pairs for b in matrix.BUDGETS for k in (4, 8))
    assert len(pairs) == 11


def test_three_runs_cover_every_pair_with_both_drafters_once():
    spec = matrix.load(MATRIX)
    graphed = [n for r in ("1", "2", "3") for n in spec["runs"][r] if n.startswith("ddtree") and "eager" not in n]
    expected = {f"ddtree-b{b}-k{k}-{d}" for b, k in matrix.valid_pairs() for d in ("real", "oracle")}
    assert sorted(graphed) == sorted(expected)
    names = [n for r in ("1", "2", "3") for n in spec["runs"][r]]
    assert {"dflash", "dflash-eager", "ar-eager"} <= set(names)
    assert sum(n.startswith("ddtree") and n.endswith("-eager") for n in names) >= 2
    for run in ("1", "2", "3"):
        assert len(spec["runs"][run]) <= 11  # one GPU, one start wave per run


def test_run_names_fit_device_output_file_names():
    # Output files are named with letters, digits, '.', '_' and '-' only, so that any copy tool carries them.
    import re
    for run in matrix.load(MATRIX)["runs"]:
        assert re.fullmatch(r"[A-Za-z0-9._-]+", f"e2e-run{run}.json")


def test_combined_run_is_runs_two_and_three():
    runs = matrix.load(MATRIX)["runs"]
    assert sorted(runs["23"]) == sorted(set(runs["2"]) | set(runs["3"]))


def test_every_run_needs_its_own_ar(tmp_path):
    bad = tmp_path / "m.json"
    bad.write_text('{"runs": {"1": ["dflash"]}}')
    with pytest.raises(UserError, match="AR reference"):
        matrix.load(bad)


def test_bad_server_names_are_user_errors():
    for name in ("ddtree-b8-k1-real", "ddtree-b8-k4-random", "eagle"):
        with pytest.raises(UserError):
            matrix.parse_server(name)


def test_server_commands():
    settings = {"mem_fraction_static": 0.05, "context_length": 1024, "max_total_tokens": 65536,
                "max_running_requests": 16, "cuda_graph_bs": [1, 2, 4, 8, 16]}
    ddtree = matrix.server_command(matrix.parse_server("ddtree-b64-k8-oracle"), Path("/m"), 31005, settings)
    joined = " ".join(ddtree)
    assert "--speculative-algorithm DDTREE" in joined
    assert "--speculative-ddtree-budget 64 --speculative-ddtree-topk 8" in joined
    assert "--speculative-draft-model-path /m/drafter" in joined
    assert "--attention-backend triton" in joined and "--grammar-backend none" in joined
    assert "--cuda-graph-max-bs 16 --cuda-graph-bs 1 2 4 8 16" in joined
    eager = matrix.server_command(matrix.parse_server("ar-eager"), Path("/m"), 31000, settings)
    assert "--disable-cuda-graph" in eager and "--speculative-algorithm" not in eager


RULE = lossless.TieRule(0.05)


def top2(gap):
    return [[-0.1, 5], [-0.1 - gap, 6]]


def test_exact_tie_and_failure():
    ref = [5, 5, 5, 5]
    ref_top2 = [top2(3.0), top2(3.0), top2(0.01), top2(3.0)]
    assert lossless.check_request(0, ref, ref_top2, [5, 5, 5, 5], RULE) is None
    tie = lossless.check_request(0, ref, ref_top2, [5, 5, 6, 1], RULE)
    assert tie.position == 2 and tie.tie and tie.got_token == 6
    fail = lossless.check_request(1, ref, ref_top2, [5, 6, 5, 5], RULE)
    assert fail.position == 1 and not fail.tie and fail.gap == pytest.approx(3.0)
    assert lossless.verdict([]) == "exact"
    assert lossless.verdict([tie]) == "lossless (ties only)"
    assert lossless.verdict([tie, fail]) == "FAIL"


def test_a_divergence_the_reference_calls_decisive_is_a_tie_where_the_exact_model_is_within_exact_eps():
    asked = []

    def exact(prompt, prefix, a, b):  # (how far a, then b, lie below the exact top-1)
        asked.append((prompt, list(prefix), a, b))
        return {6: (0.2, 0.0), 7: (0.0, 0.2), 8: (0.3, 0.2), 9: (0.0, 0.3)}[b]

    rule = lossless.TieRule(0.05, exact, exact_eps=0.25)
    ref, ref_top2 = [5, 5, 5], [top2(2.25)] * 3
    tie = lossless.check_request(3, ref, ref_top2, [5, 6], rule)
    assert tie.tie and tie.exact_below_top == (0.2, 0.0) and asked == [(3, [5], 5, 6)]
    assert lossless.check_request(3, ref, ref_top2, [5, 7], rule).tie  # the reference's token is the top-1
    # two tokens close to each other but both off the exact top-1, or one too far below it: no tie
    assert not lossless.check_request(3, ref, ref_top2, [5, 8], rule).tie
    fail = lossless.check_request(3, ref, ref_top2, [5, 9], rule)
    assert not fail.tie and fail.exact_below_top == (0.0, 0.3)
    # the reference's own tie needs no question; a short output has no token to ask about
    asked.clear()
    assert lossless.check_request(3, ref, [top2(3.0), top2(0.01), top2(3.0)], [5, 6], rule).tie
    short = lossless.check_request(3, ref, ref_top2, [5], rule)
    assert not short.tie and short.exact_below_top is None and asked == []
    # exact_eps 0 (a matrix without it) never asks
    assert not lossless.check_request(3, ref, ref_top2, [5, 6], lossless.TieRule(0.05, exact)).tie and asked == []


def test_short_output_is_a_divergence():
    d = lossless.check_request(0, [1, 2, 3], [top2(1.0)] * 3, [1, 2], RULE)
    assert d.position == 2 and not d.tie


def test_acceptance_and_gap_stats():
    metas = [{"completion_tokens": 256, "spec_verify_ct": 64}, {"completion_tokens": 256, "spec_verify_ct": 32}]
    assert lossless.acceptance(metas) == pytest.approx(512 / 96)
    assert lossless.acceptance([{"completion_tokens": 5}]) is None
    stats = lossless.gap_stats([[top2(1.0), top2(3.0)], [top2(2.0)]])
    assert stats["min"] == pytest.approx(1.0) and stats["count"] == 3


BOX_RUNS = [f"{box}-{part}" for box in ("pcie-ep8", "nvlink-tp8-nvls") for part in "abcde"]


def test_an_emulated_box_table_is_one_server_set_over_chained_runs_with_an_aa_pair():
    spec = matrix.load(MATRIX)
    for box in ("pcie-ep8", "nvlink-tp8-nvls"):
        runs = [run for run in BOX_RUNS if run.startswith(box + "-")]
        singles = spec["runs"][f"{box}-a"]
        assert spec["runs"][f"{box}-tune"] == singles, "the tune call reuses the started servers"
        assert all(spec["runs"][run] == singles + ["ddtree-stuned-weak"] for run in runs[1:]), \
            "each table call reuses the servers the previous one kept, and serves tune's schedule beside them"
        assert {"ar", "dflash-weak", "dflash-weak-twin"} <= set(singles)
        assert runs[0] not in spec["speed_runs"] and spec["run_cells"][runs[0]] == [], "the first call starts them"
        cells = [c for run in runs[1:] for c in spec["speed"]["run_cells"][run]]
        assert sorted(cells) == sorted(["greedy-c1", "greedy-c4", "greedy-c16", "greedy-c64", "greedy-c128",
                                        "sample-c16"])
        assert {spec["run_settings"][run]["prompts"] for run in runs} == {64}
        assert all(len(spec["speed"]["run_cells"][run]) <= 2 for run in runs[1:]), "at most two cells a call"
        big = {run for run in runs[1:] if {"greedy-c64", "greedy-c128"} & set(spec["speed"]["run_cells"][run])}
        assert all(len(spec["speed"]["run_cells"][run]) == 1 for run in big), "C=64 and C=128 a call each"
        assert {run: spec["run_settings"][run]["new_tokens"] for run in big} == dict.fromkeys(big, 64)


def test_a_box_tune_traces_the_prompts_its_tables_do_not_serve():
    spec = matrix.load(MATRIX)
    for box in ("pcie-ep8", "nvlink-tp8-nvls"):
        run = f"{box}-tune"
        settings = spec["run_settings"][run]
        assert settings["prompt_offset"] == settings["prompts"] == 64, "prompts 64-127: the tables serve 0-63"
        assert run not in spec["speed_runs"] and spec["run_cells"][run] == ["ddtree-b8-k4-weak"]
        (group,) = spec["tunes"][run].values()
        assert group["trace"] == "ddtree-b8-k4-weak" and "--spine=off" in group["args"]
        assert set(group["costs"]) <= set(spec["runs"][run]) and "dflash-weak" in group["costs"]
        assert "ddtree-stuned-weak" in spec["last_wave"], "the schedule server starts after the others"


def test_the_prove_run_starts_every_server_the_speed_tables_reuse():
    spec = matrix.load(MATRIX)
    runs = spec["runs"]
    assert set(spec["speed_runs"]) == {"speed-weak", "speed-real", "wide-speed", "wide-recheck", "tiny-speed-weak",
                                       "tiny-speed-real", "client-check", "wide-speed-mid", "chain-aa",
                                       "wide-speed-costed", "pcie-ep8-steps", "sglang-gap-b", "sglang-gap-c",
                                       "sglang-port-speed", "sglang-port-box-a", "sglang-port-box-b"} | {
                                           r for r in BOX_RUNS if not r.endswith("-a")}
    for run, source in (("speed-weak", "prove"), ("speed-real", "prove"), ("wide-speed", "wide-tune"),
                        ("wide-recheck", "wide-tune"), ("tiny-speed-weak", "tiny-tune"),
                        ("tiny-speed-real", "tiny-tune"), ("wide-speed-mid", "wide-tune-mid"),
                        ("chain-aa", "wide-tune-mid"), ("wide-speed-costed", "wide-tune")):
        tuned = {"ddtree-stuned-weak-spine", "ddtree-stunedweak-weak-spine", "ddtree-stunedreal-real-spine",
                 "ddtree-stunedmid-mid-spine"}
        assert set(runs[run]) - tuned <= set(runs[source])
        assert spec["run_settings"][run] == spec["run_settings"][source], "reuse needs the same settings"
        names = runs[run]
        assert sum(n.startswith("dflash") for n in names) == 1
    assert all(len(runs[run]) == 8 for run in ("speed-weak", "speed-real"))
    assert set(runs["sglang-port-speed"]) <= set(runs["sglang-port-prove"])
    assert spec["run_settings"]["sglang-port-speed"] == spec["run_settings"]["sglang-port-prove"]
    # The port's emulated-box table: -a starts the servers and measures C=1 and 16, -b reuses them.
    assert runs["sglang-port-box-b"] == runs["sglang-port-box-a"]
    assert spec["run_settings"]["sglang-port-box-b"] == spec["run_settings"]["sglang-port-box-a"]
    assert {"dflash-weak", "dflash-weak-twin", "ddtree-b7-k1-weak"} <= set(runs["sglang-port-box-a"])
    assert set(spec["first_wave"]) <= set(runs["prove"])
    weak = {matrix.parse_server(n).drafter for n in runs["speed-weak"] if n != "ar"}
    assert weak == {"weak"}
    mid = {matrix.parse_server(n, {"tunedmid": "1:8/4"}).drafter for n in runs["wide-speed-mid"] if n != "ar"}
    assert mid == {"mid"}
    cells = spec["speed"]["cells"]
    assert {c["concurrency"] for c in cells.values()} == {1, 4, 16, 64, 128}
    assert spec["speed"]["repeats"] >= 5 and spec["speed"]["min_seconds"] >= 3.0
    assert speed.SpeedSpec.from_matrix(spec, "chain-aa").repeats == 9
    assert speed.SpeedSpec.from_matrix(spec, "wide-speed-mid").repeats == spec["speed"]["repeats"]
    assert list(speed.SpeedSpec.from_matrix(spec, "chain-aa").cells) == ["greedy-c16"]
    assert max(spec["run_settings"]["prove"]["cuda_graph_bs"]) >= 64
    # The costs inside the table: the trace wide-tune's group tuned on, the same tune arguments.
    table = spec["tunes"]["wide-speed-costed"]["weak-table"]
    assert table["trace_from"] in spec["tunes"]["wide-tune"] and set(table["costs"]) <= set(runs["wide-speed-costed"])
    assert table["args"] == spec["tunes"]["wide-tune"][table["trace_from"]]["args"]


def test_drafter_kinds_pick_their_checkpoint_and_servers_sleep_when_idle():
    settings = {"mem_fraction_static": 0.05, "context_length": 1024, "max_total_tokens": 65536,
                "max_running_requests": 16, "cuda_graph_bs": [1, 16]}
    weak = " ".join(matrix.server_command(matrix.parse_server("ddtree-b64-k8-weak-spine"), Path("/m"), 1, settings))
    assert "--speculative-draft-model-path /m/drafter-weak" in weak and "--speculative-ddtree-spine" in weak
    dflash_weak = " ".join(matrix.server_command(matrix.parse_server("dflash-weak"), Path("/m"), 1, settings))
    assert "--speculative-algorithm DFLASH --speculative-draft-model-path /m/drafter-weak" in dflash_weak
    assert "--sleep-on-idle" in weak
    for name in ("dflash-mid", "ddtree-b16-k4-mid-spine"):
        mid = " ".join(matrix.server_command(matrix.parse_server(name), Path("/m"), 1, settings))
        assert "--speculative-draft-model-path /m/drafter-mid" in mid
    assert matrix.parse_server("ddtree-b8-k4-oracle").oracle and not matrix.parse_server("dflash-weak").oracle


def test_tp2_and_ep2_servers_shard_over_two_gpus_against_the_tp1_reference():
    settings = {"mem_fraction_static": 0.05, "context_length": 1024, "max_total_tokens": 65536,
                "max_running_requests": 16, "cuda_graph_bs": [1, 16]}
    tp = " ".join(matrix.server_command(matrix.parse_server("ddtree-b64-k8-weak-spine-tp2"), Path("/m"), 1, settings))
    ep = " ".join(matrix.server_command(matrix.parse_server("ddtree-b16-k4-weak-spine-tp2-ep2"), Path("/m"), 1,
                                        settings))
    assert "--tp-size 2" in tp and "--ep-size" not in tp
    assert "--tp-size 2 --ep-size 2 --moe-a2a-backend none" in ep
    run = matrix.load(MATRIX)["runs"]["tp2"]
    shapes = [matrix.parse_server(n) for n in run]
    assert shapes[0].name == "ar" and shapes[0].tp == 1, "the TP1 AR reference"
    assert all(s.tp == 2 for s in shapes[1:]) and any(s.ep == 2 for s in shapes) and any(s.eager for s in shapes)
    assert {(s.budget, s.topk) for s in shapes if s.algo == "DDTREE"} >= {(b, k) for b in (8, 16, 64) for k in (4, 8)}
    with pytest.raises(UserError):
        matrix.parse_server("ddtree-b8-k4-real-ep2")


def test_schedule_servers_name_a_schedule_and_ramps_ask_for_fewer_tokens():
    from proving_ground.e2e.workloads import ramp_tokens

    spec = matrix.parse_server("ddtree-smix-weak-spine", {"mix": "1:32/8,3:16/4,12:0"})
    assert (spec.algo, spec.schedule, spec.spine, spec.drafter) == ("DDTREE", "1:32/8,3:16/4,12:0", True, "weak")
    cmd = matrix.server_command(spec, Path("/m"), 31000, {"mem_fraction_static": 0.1, "context_length": 1024,
                                                            "max_total_tokens": 1, "max_running_requests": 16,
                                                            "cuda_graph_bs": [1, 2]})
    assert cmd[cmd.index("--speculative-ddtree-budget-schedule") + 1] == "1:32/8,3:16/4,12:0"
    assert "--speculative-ddtree-budget" not in cmd and "--speculative-ddtree-spine" in cmd
    with pytest.raises(UserError, match="no schedule named 'other'"):
        matrix.parse_server("ddtree-sother-weak", {})
    with pytest.raises(UserError, match="bucket 1:8/1: budget 8 is larger"):
        matrix.parse_server("ddtree-sbad-weak", {"bad": "1:8/1"})
    assert [ramp_tokens({"ramp": True}, 256, i, 16) for i in (0, 7, 15)] == [16, 128, 256]
    assert ramp_tokens({}, 256, 3, 16) == 256
    ref = {0: {"output_ids": [5, 6, 7, 8], "top2": []}}
    assert lossless.divergences([(0, [5, 6], 2), (0, [5, 6, 7, 8])], ref, RULE) == []
    assert lossless.divergences([(0, [5, 9], 2)], ref, RULE)[0].position == 1


def test_a_repeats_host_cpu_shares_come_from_the_difference_of_two_proc_stat_reads():
    # user nice system idle iowait irq softirq steal, in ticks
    before = (100, 0, 50, 1000, 0, 0, 0, 10)
    after = (400, 0, 150, 1400, 0, 10, 10, 30)
    share = speed.host_cpu(before, after)
    assert share == speed.HostCpu(busy=0.5, steal=round(20 / 840, 3))
    assert speed.host_cpu(None, after) is None and speed.host_cpu(before, before) is None
    backwards = speed.host_cpu(before, (400, 0, 150, 1400, -50, 10, 10, 30))  # iowait may go back (proc(5))
    assert backwards == share
    now = speed.cpu_times()
    assert now is None or (len(now) == 8 and all(t >= 0 for t in now))


def test_a_round_serves_every_server_the_same_whole_waves_long_enough_for_the_fastest():
    assert speed.repeat_order(64, 5, 0) == [0, 1, 2, 3, 4]
    assert speed.repeat_order(64, 5, 62) == [62, 63, 0, 1, 2], "cycling through the prompts"
    # 150 tok/s at 128 tokens a request: 3 s needs 3.5 requests, 3.9 with the plan's margin: so 4.
    count = speed.repeat_count(1, 150.0, 128, 3.0)
    assert count * 128 / 150.0 >= 3.0 and count == 4
    assert speed.repeat_count(16, 1500.0, 128, 3.0) == 16 * 3
    assert speed.repeat_count(4, 0.0, 128, 3.0) == 4, "no rate measured: one wave"
    # 2 waves of 16 lasted 2 s of the 3 s asked: 3.3 waves
    assert speed.regrown_count(32, 16, 3.0, 2.0) == 16 * 4


@pytest.fixture
def standin_url():
    """The proving ground's stand-in SGLang server (tests/standin), serving in this process on
    127.0.0.1: 400 tok/s per request, 4 tokens a step."""
    source = Path(__file__).resolve().parents[1] / "standin" / "sglang" / "launch_server.py"
    loader = importlib.util.spec_from_file_location("standin_launch_server", source)
    standin = importlib.util.module_from_spec(loader)
    loader.loader.exec_module(standin)
    with mock.patch.dict(os.environ, {"STANDIN_TOKENS_PER_S": "400", "STANDIN_ACCEPT": "4"}):
        state = standin.State(*standin.parse_args(["--port", "0"]), [])
    server = ThreadingHTTPServer(("127.0.0.1", 0), standin.make_handler(state))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def _post(url: str, payload: dict) -> bytes:
    request = urllib.request.Request(url, json.dumps(payload).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as reply:
        return reply.read()


def _send(delay_numbers: set[int] = frozenset()):
    def send(url, ids, params, rid):
        if int(rid.rsplit("-", 1)[1]) in delay_numbers:
            time.sleep(0.6)  # arrives after the first abort of it
        return json.loads(_post(url + "/generate", {"input_ids": ids, "sampling_params": params, "rid": rid}))
    return send


def _abort(url, rid):
    _post(url + "/abort_request", {"rid": rid})


def _send_lengths(lengths: dict[int, int], delay_numbers: set[int] = frozenset()):
    """Each prompt [i] asks for lengths.get(i, 4096) tokens."""
    inner = _send(delay_numbers)
    return lambda url, ids, params, rid: inner(url, ids, {**params, "max_new_tokens": lengths.get(ids[0], 4096)}, rid)


def test_a_repeat_keeps_its_slots_busy_with_fillers_until_its_set_is_done(standin_url):
    prompts = [[i] for i in range(10)]
    # at 400 tok/s: prompt 3 takes 0.6 s, the set's others 0.08 s, and a filler would take 10 s
    lengths = {2: 32, 3: 240, 4: 32, 5: 32}
    repeat, replies = speed.run_repeat(_send_lengths(lengths), _abort, standin_url, prompts, {}, 2, [2, 3, 4, 5])
    got = {index: reply for index, reply in replies}
    assert all(speed.finish_type(got[i]) == "length" and len(got[i]["output_ids"]) == lengths[i] for i in (2, 3, 4, 5))
    fillers = [index for index, _ in replies if index not in lengths]
    assert fillers and fillers == list(range(6, 6 + len(fillers))), "the prompts after the set, in order"
    assert all(speed.finish_type(got[i]) == "abort" and len(got[i]["output_ids"]) < 4096 for i in fillers)
    assert repeat.cut == len(fillers) and repeat.requests == 4 + len(fillers)
    assert repeat.errors == 0 and repeat.late == 0
    assert repeat.tokens == sum(len(r["output_ids"]) for _, r in replies)
    assert repeat.tok_per_s == repeat.tokens / repeat.wall_s
    with pytest.raises(ValueError, match="cannot keep 4 slots busy"):
        speed.run_repeat(_send_lengths(lengths), _abort, standin_url, prompts, {}, 4, [2, 3])


def test_one_slot_serves_its_set_alone(standin_url):
    prompts = [[i] for i in range(4)]
    repeat, replies = speed.run_repeat(_send_lengths({0: 32, 1: 32}), _abort, standin_url, prompts, {}, 1, [0, 1])
    assert [index for index, _ in replies] == [0, 1] and repeat.cut == 0 and repeat.tokens == 64


def test_an_abort_that_reaches_the_server_before_its_filler_is_sent_again(standin_url):
    prompts = [[i] for i in range(4)]
    # the set's one short request ends while the first filler (request 2) is still on its way
    lengths = {0: 8, 1: 120}
    repeat, replies = speed.run_repeat(_send_lengths(lengths, {2}), _abort, standin_url, prompts, {}, 2, [0, 1])
    fillers = [reply for index, reply in replies if index not in lengths]
    assert fillers and all(speed.finish_type(r) == "abort" and len(r["output_ids"]) < 4096 for r in fillers)
    assert repeat.errors == 0 and repeat.late == 0


def test_a_send_that_fails_unexpectedly_ends_the_repeat_and_is_raised(standin_url):
    def send(url, ids, params, rid):
        if ids == [1]:
            raise RuntimeError("the client broke")
        return _send_lengths({0: 32})(url, ids, params, rid)

    with pytest.raises(RuntimeError, match="the client broke"):
        speed.run_repeat(send, _abort, standin_url, [[i] for i in range(4)], {}, 2, [0, 1])

    def broken(url, ids, params, rid):
        raise RuntimeError("the client broke")

    raised = []
    # every slot's first send fails, the set's rest is never sent: the repeat must still end
    repeat = threading.Thread(target=lambda: raised.append(pytest.raises(RuntimeError, speed.run_repeat, broken, _abort,
                                                                         standin_url, [[i] for i in range(4)], {}, 2,
                                                                         [0, 1, 2, 3])))
    repeat.start()
    repeat.join(timeout=20)
    assert not repeat.is_alive() and raised, "a repeat whose every send failed hung"


def test_an_aborted_output_is_checked_up_to_where_it_stopped_and_never_past_the_tokens_asked():
    aborted = {"output_ids": [5, 6], "meta_info": {"finish_reason": {"type": "abort"}}}
    whole = {"output_ids": [5, 6], "meta_info": {"finish_reason": {"type": "length", "length": 4}}}
    # an abort in the step that crossed max_new_tokens: that step's tokens past it come back too
    overran = {"output_ids": [5, 6, 7, 8, 9, 9], "meta_info": {"finish_reason": {"type": "abort"}}}
    longer = {"output_ids": [5, 6, 7, 8, 9], "meta_info": {"finish_reason": {"type": "length", "length": 4}}}
    replies = [(0, aborted), (1, whole), (2, {"error": "HTTPError: 500"}), (3, overran), (4, longer)]
    got = list(speed.checked_outputs(replies, 4))
    assert got == [(0, [5, 6], 2), (1, [5, 6]), (3, [5, 6, 7, 8], 4), (4, [5, 6, 7, 8, 9])]
    reference = {i: {"output_ids": [5, 6, 7, 8], "top2": [[[-0.1, 5], [-5.0, 1]]] * 4} for i in range(5)}
    found = lossless.divergences(got, reference, lossless.TieRule(0.05))
    assert [(d.prompt, d.position) for d in found] == [(1, 2), (4, 4)], \
        "short and over-long finished replies diverge; aborted ones are judged up to the tokens asked"


def test_a_cell_keeps_every_failing_divergence_and_the_first_ties():
    ties = [lossless.Divergence(i, 3, 1, 2, 0.0, True) for i in range(30)]
    wrong = [lossless.Divergence(40 + i, 9, 1, 2, 4.0, False) for i in range(3)]
    cell = speed.CellResult("s", "greedy-c16", divergences=ties + wrong, checked=True)
    summary = cell.summary(True)
    assert summary["verdict"] == "FAIL" and summary["divergence_count"] == 33
    assert [d["prompt"] for d in summary["divergences"]] == [40, 41, 42] + list(range(20))


def test_a_ratio_interval_from_one_table_pairs_repeats_by_round():
    dflash = {"repeat_tok_s": [100.0, 102.0, 98.0, 101.0, 99.0]}
    assert speed.interval(dflash, dflash) == [1.0, 1.0]
    low, high = speed.interval({"repeat_tok_s": [150.0, 153.0, 147.0, 151.5, 148.5]}, dflash)
    assert low == pytest.approx(1.5) and high == pytest.approx(1.5)
    assert speed.interval({"repeat_tok_s": [1.0, 2.0]}, {"repeat_tok_s": [1.0, 2.0]}) is None, "too few rounds"


def test_a_twin_is_a_second_server_of_the_same_config():
    twin, one = matrix.parse_server("dflash-weak-twin"), matrix.parse_server("dflash-weak")
    assert (twin.algo, twin.drafter, twin.eager) == (one.algo, one.drafter, one.eager) and twin.name != one.name
    weaker = matrix.parse_server("ddtree-b8-k4-weaker-spine-eager-twin")
    assert (weaker.drafter, weaker.spine, weaker.eager, weaker.budget) == ("weaker", True, True, 8)
    assert matrix.DRAFTER_DIRS["weaker"] == "drafter-weaker"
    with pytest.raises(UserError, match="then -twin"):
        matrix.parse_server("dflash-twin-weak")


def test_a_server_of_another_sglang_is_its_config_on_that_version():
    other = matrix.parse_server("dflash-weak-sglang0.5.17-twin")
    assert (other.algo, other.drafter, other.sglang) == ("DFLASH", "weak", "0.5.17")
    assert matrix.parse_server("dflash-weak").sglang is None
    assert matrix.variant("dflash-weak-sglang0.5.17") != matrix.variant("dflash-weak")
    spec = matrix.load(MATRIX)
    gap = spec["runs"]["sglang-gap-b"]
    assert "dflash-weak-sglang0.5.17" in gap and {"dflash-weak", "dflash-weak-twin"} <= set(gap)
    assert set(spec["runs"]["sglang-gap-a"]) <= set(gap) == set(spec["runs"]["sglang-gap-c"])
