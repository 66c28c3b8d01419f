"""A stand-in for `python -m sglang.launch_server`, for CPU tests only.

The real server needs a GPU. This module takes its place on PYTHONPATH
(tests/standin; the GPU runner's tests pass this folder as its --site) so that
the same systemd unit, readiness gate, benchmark client and proving-ground
runner run against a real HTTP server on 127.0.0.1. It imitates what the
tooling relies on:

- the port refuses connections while "loading" (STANDIN_LOAD_SECONDS, default 2),
  then a graph-capture line like sglang's is printed;
- /health and /health_generate answer 503 for STANDIN_WARMUP_SECONDS after bind, then 200;
- native /generate returns meta_info with completion_tokens, spec_verify_ct,
  spec_accept_length (acceptance STANDIN_ACCEPT, default 4.0) and streams SSE;
  output_ids are a fixed function of the prompt's input_ids, so AR and speculative
  servers agree token for token; return_logprob adds top-2 output_top_logprobs;
- /server_info carries the parsed server args, the pid and avg_spec_accept_length;
- /flush_cache (counted in /server_info standin_flush_count), /v1/models, /v1/chat/completions.

Lossless-check tests: STANDIN_DIVERGE_AT=N makes speculative servers (those given
--speculative-algorithm) part from AR at output position N of every request; every
server reports a top-2 log-prob gap of STANDIN_TIE_GAP there (default 3.0: a real
failure unless set to a tie, <= the runner's eps).

Benchmark tests: STANDIN_ERROR_EVERY=N answers HTTP 500 to every Nth /generate
(counted over the server's life, warm-ups included). STANDIN_REPLIES_FILE names a
JSON object {"substring": "reply text", ...}: a chat message or /generate text
prompt containing a substring gets that reply (first match in file order), for
both /v1/chat/completions and /generate (a token is a word of the reply; streamed
chunks carry the text so far, or only the new words with --incremental-streaming-output).
Since the last /flush_cache, /server_info counts /generate calls streamed and not
(standin_streamed, standin_unstreamed) and the most in flight at once
(standin_generate_peak); STANDIN_PROMPT_LOG names a file that gets one JSON line per
/generate: {"input_ids" or "text", "stream"}, in arrival order.
A non-streamed /generate that names a `rid` ends early on POST /abort_request {"rid": ...},
as SGLang's does: its reply holds the tokens made so far and finish_reason {"type": "abort"};
an abort for a rid the server does not hold (not arrived yet, or done) is dropped.
STANDIN_REASONING_PARSER=1 imitates --reasoning-parser: chat replies are split
at the last </think> into reasoning_content and content (no </think>: all reasoning).

An emulated target folder (config.json with a `k26_emulator` block) served with
SGLANG_EXTERNAL_MODEL_PACKAGE set logs the emulator's load line, as the real model class
does; STANDIN_NO_EMULATOR_LINE=1 leaves it out (a server that would serve the plain target).

Failure modes for rollback tests: STANDIN_FAIL=start exits 1 after loading;
STANDIN_FAIL=health serves but never becomes healthy. STANDIN_FAIL_BUDGET=N
applies STANDIN_FAIL only when --speculative-ddtree-budget equals N.
Only the standard library is used: it runs under any python3.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

VOCAB = 2048
DECISIVE_GAP = 3.0


def token(prompt: list[int], position: int) -> int:
    """The greedy output at `position` for `prompt`: the same on every server, AR or speculative."""
    return (sum(prompt) * 31 + position * 7) % VOCAB


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    p = argparse.ArgumentParser(prog="sglang.launch_server (stand-in)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--model-path", default="stand-in-model")
    p.add_argument("--served-model-name", default=None)
    p.add_argument("--api-key", default=None)
    p.add_argument("--speculative-algorithm", default=None)
    p.add_argument("--speculative-ddtree-budget", type=int, default=None)
    p.add_argument("--speculative-ddtree-topk", type=int, default=None)
    p.add_argument("--speculative-ddtree-budget-schedule", default=None)
    p.add_argument("--incremental-streaming-output", action="store_true")
    return p.parse_known_args(argv)


class State:
    def __init__(self, args: argparse.Namespace, extra: list[str], argv: list[str]):
        self.args = args
        self.extra = extra
        self.argv = argv
        self.accept = float(os.environ.get("STANDIN_ACCEPT", "4.0"))
        self.tokens_per_s = float(os.environ.get("STANDIN_TOKENS_PER_S", "2000"))
        self.warmup = float(os.environ.get("STANDIN_WARMUP_SECONDS", "0.5"))
        self.never_healthy = False
        self.bound_at = time.monotonic()
        self.lock = threading.Lock()
        self.sum_tokens = 0
        self.sum_verify = 0
        self.flushes = 0
        self.error_every = int(os.environ.get("STANDIN_ERROR_EVERY", "0"))
        self.generate_calls = 0
        self.in_flight = 0
        self.peak = 0
        self.streamed = 0
        self.unstreamed = 0
        self.prompt_log = os.environ.get("STANDIN_PROMPT_LOG")
        replies_file = os.environ.get("STANDIN_REPLIES_FILE")
        self.replies = json.loads(open(replies_file).read()) if replies_file else {}
        self.reasoning_parser = os.environ.get("STANDIN_REASONING_PARSER") == "1"
        self.chat_reply = os.environ.get(
            "STANDIN_CHAT_REPLY",
            "<think>Reasoning about the task.</think>Here is the code:\n```python\nprint('ok')\n```\n",
        )
        self.speculative = args.speculative_algorithm is not None
        self.diverge_at = int(os.environ.get("STANDIN_DIVERGE_AT", "-1"))
        self.live: dict[str, threading.Event] = {}  # rid -> set once aborted
        self.tie_gap = float(os.environ.get("STANDIN_TIE_GAP", str(DECISIVE_GAP)))

    def output_ids(self, prompt: list[int], count: int) -> list[int]:
        out = [token(prompt, i) for i in range(count)]
        if self.speculative and 0 <= self.diverge_at < count:
            out[self.diverge_at] = (out[self.diverge_at] + 1) % VOCAB
        return out

    def top_logprobs(self, out: list[int]) -> list[list]:
        """Top-2 [logprob, token id, text] per position, on every server: the AR reference's gap at
        STANDIN_DIVERGE_AT is what decides whether a speculative server's divergence there is a tie."""
        gaps = [self.tie_gap if i == self.diverge_at else DECISIVE_GAP for i in range(len(out))]
        return [[[-0.01, t, None], [-0.01 - g, (t + 1) % VOCAB, None]] for t, g in zip(out, gaps)]

    def reply_for(self, prompt: str) -> str | None:
        for key, reply in self.replies.items():
            if key in prompt:
                return reply
        return None

    def inject_error(self) -> bool:
        with self.lock:
            self.generate_calls += 1
            return bool(self.error_every) and self.generate_calls % self.error_every == 0

    def arrive(self, body: dict) -> None:
        with self.lock:
            self.in_flight += 1
            self.peak = max(self.peak, self.in_flight)
            if body.get("stream"):
                self.streamed += 1
            else:
                self.unstreamed += 1
            if self.prompt_log:
                prompt = {k: body[k] for k in ("input_ids", "text") if k in body}
                with open(self.prompt_log, "a") as log:
                    log.write(json.dumps({**prompt, "stream": bool(body.get("stream"))}) + "\n")

    def abort(self, rid: str) -> None:
        with self.lock:
            if rid in self.live:
                self.live[rid].set()

    def leave(self) -> None:
        with self.lock:
            self.in_flight -= 1

    def model_name(self) -> str:
        return self.args.served_model_name or self.args.model_path

    def healthy(self) -> bool:
        return not self.never_healthy and time.monotonic() - self.bound_at >= self.warmup

    def record(self, tokens: int, verify: int) -> None:
        with self.lock:
            self.sum_tokens += tokens
            self.sum_verify += verify

    def avg_accept(self) -> float:
        with self.lock:
            return self.sum_tokens / self.sum_verify if self.sum_verify else 0.0


def make_handler(state: State):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, fmt, *a):  # keep the journal quiet
            pass

        def _json(self, code: int, body) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _authorized(self) -> bool:
            if not state.args.api_key or self.path.startswith("/health"):
                return True
            if self.headers.get("Authorization") == f"Bearer {state.args.api_key}":
                return True
            self._json(401, {"error": "Unauthorized"})
            return False

        def _body(self) -> dict:
            n = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(n) if n else b"{}"
            try:
                return json.loads(raw or b"{}")
            except json.JSONDecodeError:
                return {}

        def do_GET(self):
            if not self._authorized():
                return
            path = self.path.split("?")[0]
            if path in ("/health", "/health_generate"):
                if state.healthy():
                    self._json(200, {})
                else:
                    self._json(503, {"error": "starting"})
            elif path == "/v1/models":
                self._json(200, {"object": "list", "data": [{"id": state.model_name(), "object": "model"}]})
            elif path in ("/server_info", "/get_server_info"):
                info = {k: v for k, v in vars(state.args).items()}
                info.update(
                    {
                        "argv": state.argv,
                        "unparsed_args": state.extra,
                        "pid": os.getpid(),
                        "version": "stand-in",
                        "internal_states": [{"avg_spec_accept_length": state.avg_accept()}],
                        "standin_flush_count": state.flushes,
                        "standin_generate_peak": state.peak,
                        "standin_streamed": state.streamed,
                        "standin_unstreamed": state.unstreamed,
                    }
                )
                self._json(200, info)
            else:
                self._json(404, {"error": "not found"})

        def do_POST(self):
            if not self._authorized():
                return
            path = self.path.split("?")[0]
            body = self._body()
            if path == "/flush_cache":
                with state.lock:
                    state.sum_tokens = state.sum_verify = 0
                    state.peak = state.in_flight
                    state.streamed = state.unstreamed = 0
                    state.flushes += 1
                self._json(200, {"success": True})
            elif path == "/generate":
                state.arrive(body)
                try:
                    self._generate(body)
                finally:
                    state.leave()
            elif path == "/abort_request":
                state.abort(str(body.get("rid", "")))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()
            elif path == "/v1/chat/completions":
                self._chat(body)
            else:
                self._json(404, {"error": "not found"})

        def _generate(self, body: dict) -> None:
            if state.inject_error():
                self._json(500, {"error": {"message": "injected error (STANDIN_ERROR_EVERY)"}})
                return
            sp = body.get("sampling_params") or {}
            n_out = int(sp.get("max_new_tokens", 16))
            reply = state.reply_for(str(body.get("text", "")))
            # A token is a word of the reply (whitespace kept), or " tok".
            pieces = re.findall(r"\s*\S+\s*", reply) if reply is not None else None
            if pieces is not None:
                n_out = max(1, len(pieces))
            incremental = state.args.incremental_streaming_output
            prompt_ids = list(body.get("input_ids") or [])
            prompt_tokens = len(prompt_ids) if "input_ids" in body else len(str(body.get("text", "")).split())
            output_ids = state.output_ids(prompt_ids, n_out)
            steps = max(1, math.ceil(n_out / state.accept)) if n_out else 0
            step_s = state.accept / state.tokens_per_s
            rid = f"standin-{time.monotonic_ns()}"
            start = time.monotonic()

            def text(first: int, last: int) -> str:
                return "".join(pieces[first:last]) if pieces is not None else " tok" * (last - first)

            def chunk(done: int, verify: int, final: bool, sent: int = 0, aborted: bool = False) -> dict:
                finish = {"type": "abort", "message": "Aborted"} if aborted else {"type": "length", "length": n_out}
                meta = {
                    "id": rid,
                    "prompt_tokens": prompt_tokens,
                    "completion_tokens": done,
                    "spec_verify_ct": verify,
                    "spec_accept_length": (done / verify) if verify else 0.0,
                    "finish_reason": finish if final else None,
                    "e2e_latency": time.monotonic() - start,
                }
                if body.get("return_logprob"):
                    meta["output_top_logprobs"] = state.top_logprobs(output_ids[:done])
                return {"text": text(sent if incremental else 0, done), "output_ids": output_ids[:done],
                        "meta_info": meta}

            if not body.get("stream"):
                named = body.get("rid")
                if named is None:
                    time.sleep(steps * step_s)
                    state.record(n_out, steps)
                    self._json(200, chunk(n_out, steps, True))
                    return
                aborted = threading.Event()
                with state.lock:
                    state.live[named] = aborted
                try:
                    verify = 0
                    while verify < steps and not aborted.wait(step_s):
                        verify += 1
                finally:
                    with state.lock:
                        state.live.pop(named, None)
                done = min(n_out, math.ceil(verify * state.accept)) if verify < steps else n_out
                state.record(done, verify)
                self._json(200, chunk(done, verify, True, aborted=verify < steps))
                return
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Connection", "close")
            self.end_headers()
            done = 0
            for verify in range(1, steps + 1):
                time.sleep(step_s)
                sent, done = done, min(n_out, done + math.ceil(state.accept))
                self.wfile.write(f"data: {json.dumps(chunk(done, verify, verify == steps, sent))}\n\n".encode())
                self.wfile.flush()
            self.wfile.write(b"data: [DONE]\n\n")
            self.wfile.flush()
            state.record(n_out, steps)
            self.close_connection = True

        def _chat(self, body: dict) -> None:
            messages = body.get("messages") or [{}]
            reply = state.reply_for(str(messages[-1].get("content", "")))
            reply = state.chat_reply if reply is None else reply
            n_out = max(1, len(reply.split()))
            message = {"role": "assistant", "content": reply}
            if state.reasoning_parser:
                reasoning, marker, answer = reply.rpartition("</think>")
                if marker:
                    message = {"role": "assistant", "reasoning_content": reasoning.replace("<think>", ""), "content": answer}
                else:
                    message = {"role": "assistant", "reasoning_content": reply.replace("<think>", ""), "content": None}
            self._json(
                200,
                {
                    "id": f"chatcmpl-{time.monotonic_ns()}",
                    "object": "chat.completion",
                    "model": state.model_name(),
                    "choices": [
                        {"index": 0, "message": message, "finish_reason": "stop"}
                    ],
                    "usage": {"prompt_tokens": 1, "completion_tokens": n_out, "total_tokens": n_out + 1},
                },
            )

    return Handler


class _Server(ThreadingHTTPServer):
    # The default listen backlog (5) drops connections when a benchmark opens 128 at once.
    request_queue_size = 256


def _emulator_block(model_path) -> dict | None:
    try:
        with open(os.path.join(str(model_path), "config.json")) as f:
            return json.load(f).get("k26_emulator")
    except (OSError, ValueError, AttributeError):
        return None


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args, extra = parse_args(argv)
    fail = os.environ.get("STANDIN_FAIL", "")
    fail_budget = os.environ.get("STANDIN_FAIL_BUDGET")
    if fail_budget is not None and str(args.speculative_ddtree_budget) != fail_budget:
        fail = ""
    print(f"stand-in sglang: loading (pid {os.getpid()}) from {os.path.dirname(os.path.abspath(__file__))}", flush=True)
    time.sleep(float(os.environ.get("STANDIN_LOAD_SECONDS", "2")))
    if fail == "start":
        print("stand-in sglang: failing at start as asked (STANDIN_FAIL=start)", flush=True)
        return 1
    if fail.startswith("memory-once:"):
        # The first server to claim the marker fails as SGLang's pool check does when neighbours
        # allocated during its memory profile; every later start (a retry too) serves.
        try:
            os.close(os.open(fail.split(":", 1)[1], os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            pass
        else:
            print("RuntimeError: Not enough memory. Please try to increase --mem-fraction-static.", flush=True)
            return 1
    emulated = _emulator_block(args.model_path)
    if emulated is not None and os.environ.get("SGLANG_EXTERNAL_MODEL_PACKAGE") and not os.environ.get(
            "STANDIN_NO_EMULATOR_LINE"):
        # What proving_ground/emulator/model.py logs when SGLang loads the emulated class.
        print(f"k26 emulator: box {emulated.get('box')}", flush=True)
    print("Capture cuda graph end. Time elapsed: 1.50 s. mem usage=0.1 GB.", flush=True)
    state = State(args, extra, argv)
    state.never_healthy = fail == "health"
    server = _Server((args.host, args.port), make_handler(state))
    server.daemon_threads = True
    state.bound_at = time.monotonic()
    print(f"stand-in sglang: serving on {args.host}:{args.port}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
