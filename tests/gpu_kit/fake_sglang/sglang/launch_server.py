"""A fake `python -m sglang.launch_server` for the CPU tests of the GPU runner's mechanics.

Stdlib only. Answers /health_generate (200 after FAKE_READY_SECONDS), /generate with
input_ids (deterministic output_ids, top-2 log-probs, spec_* meta for speculative servers)
and /server_info; prints a graph-capture line like sglang's. FAKE_DIVERGE_AT=N makes
speculative servers part from AR at position N of every request (a reference gap of
FAKE_TIE_GAP there, default 3.0: a real failure unless set to <= eps).
"""

import argparse
import json
import os
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

START = time.monotonic()


def token(prompt, i):
    return (sum(prompt) * 31 + i * 7) % 2048


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--speculative-algorithm", default=None)
    args, _ = p.parse_known_args()
    spec = args.speculative_algorithm is not None
    diverge = int(os.environ.get("FAKE_DIVERGE_AT", "-1"))
    tie_gap = float(os.environ.get("FAKE_TIE_GAP", "3.0"))
    print("Capture cuda graph end. Time elapsed: 1.50 s. mem usage=0.1 GB.", flush=True)

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def reply(self, code, obj):
            body = json.dumps(obj).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):
            if self.path == "/health_generate":
                ready = time.monotonic() - START > float(os.environ.get("FAKE_READY_SECONDS", "0.5"))
                self.reply(200 if ready else 503, {})
            elif self.path == "/server_info":
                self.reply(200, {"internal_states": [{"avg_spec_accept_length": 3.0 if spec else None}]})
            else:
                self.reply(404, {})

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            time.sleep(float(os.environ.get("FAKE_DELAY_S", "0")))
            ids = body["input_ids"]
            n = body["sampling_params"]["max_new_tokens"]
            out = [token(ids, i) for i in range(n)]
            if spec and 0 <= diverge < n:
                out[diverge] = (out[diverge] + 1) % 2048
            meta = {"completion_tokens": n, "e2e_latency": 0.01}
            if spec:
                meta.update(spec_verify_ct=max(1, n // 3), spec_accept_length=n / max(1, n // 3))
            if body.get("return_logprob"):
                gaps = [tie_gap if i == diverge else 3.0 for i in range(n)]
                meta["output_top_logprobs"] = [[[-0.01, t, None], [-0.01 - g, (t + 1) % 2048, None]]
                                               for t, g in zip(out, gaps)]
            self.reply(200, {"text": "", "output_ids": out, "meta_info": meta})

    ThreadingHTTPServer.request_queue_size = 64  # 16 concurrent clients, as uvicorn's backlog allows
    ThreadingHTTPServer((args.host, args.port), Handler).serve_forever()


if __name__ == "__main__":
    main()
