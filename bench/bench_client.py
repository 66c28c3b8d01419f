"""Benchmark: requests/s that bench's HTTP client sustains in a closed loop of C requests, against
a server on 127.0.0.1 (another process) that answers every /generate after a fixed delay.

  pools        k26_ddtree.bench.client.ServerClient: pools of up to 16 connections, first fit
  shared pool  the same client with every request through one httpx.AsyncClient of C connections
               (the client that caps a closed loop of 64 at about 100 requests/s)

The server alone would serve C / delay requests/s ("ideal"). Each cell: the median of 5 repeats
of >= 3 s (min-max).

    python3 bench/bench_client.py                   # C = 16, 64; 50 ms per request
    python3 bench/bench_client.py --delay-ms 20 --concurrency 64,128
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import multiprocessing
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx  # noqa: E402

from k26_ddtree.bench.client import ServerClient  # noqa: E402

ANSWER = (b'{"text": "x", "meta_info": {"completion_tokens": 128, "prompt_tokens": 55, "spec_verify_ct": 16}}')
RESPONSE = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(ANSWER), ANSWER)
PAYLOAD = {"input_ids": list(range(55)), "sampling_params": {"max_new_tokens": 128}}
REPEATS, MIN_SECONDS = 5, 3.0


def serve(delay_s: float, port_queue) -> None:
    async def handle(reader, writer):
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                               if line.lower().startswith(b"content-length:")), 0)
                await reader.readexactly(length)
                await asyncio.sleep(delay_s)
                writer.write(RESPONSE)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    async def main():
        server = await asyncio.start_server(handle, "127.0.0.1", 0, backlog=1024)
        port_queue.put(server.sockets[0].getsockname()[1])
        await server.serve_forever()

    asyncio.run(main())


async def closed_loop(post, concurrency: int) -> float:
    """Requests/s of one repeat: `concurrency` slots, each sending the next as its last returns."""
    start, done = time.perf_counter(), 0

    async def slot():
        nonlocal done
        while time.perf_counter() - start < MIN_SECONDS:
            await post()
            done += 1

    await asyncio.gather(*(slot() for _ in range(concurrency)))
    return done / (time.perf_counter() - start)


class SharedPool(ServerClient):
    """ServerClient with every request through one pool of C connections, for comparison."""

    def __init__(self, url: str, concurrency: int):
        super().__init__(url, None, 60.0, concurrency + 4)
        limits = httpx.Limits(max_connections=concurrency + 4, max_keepalive_connections=concurrency + 4)
        self._shared = httpx.AsyncClient(base_url=url, limits=limits, timeout=60.0)

    async def __aexit__(self, *exc) -> None:
        await self._shared.aclose()

    @contextlib.asynccontextmanager
    async def _pool(self):
        yield self._shared


async def rates(client: ServerClient, concurrency: int) -> list[float]:
    async with client:
        async def post():
            record = await client.generate_unstreamed(PAYLOAD)
            assert record.ok, record.error
        return [await closed_loop(post, concurrency) for _ in range(REPEATS)]


def cell(rates: list[float]) -> str:
    return f"{statistics.median(rates):.0f} ({min(rates):.0f}-{max(rates):.0f})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--delay-ms", type=float, default=50.0, help="the server's time per request (default 50)")
    parser.add_argument("--concurrency", default="16,64", help="closed-loop sizes, comma-separated (default 16,64)")
    args = parser.parse_args(argv)
    try:
        levels = [int(c) for c in args.concurrency.split(",")]
        if args.delay_ms <= 0 or any(c < 1 for c in levels):
            raise ValueError
    except ValueError:
        parser.error("--delay-ms must be > 0 and --concurrency positive integers, e.g. 16,64")
    ports = multiprocessing.Queue()
    server = multiprocessing.Process(target=serve, args=(args.delay_ms / 1000, ports), daemon=True)
    server.start()
    try:
        url = f"http://127.0.0.1:{ports.get(timeout=30)}"
        print(f"requests/s, median of {REPEATS} repeats of >= {MIN_SECONDS:g} s (min-max); server {args.delay_ms:g} ms "
              "per request\n\n| C | ideal | pools | shared pool | pools / shared |\n|---|---|---|---|---|")
        for c in levels:
            mine = asyncio.run(rates(ServerClient(url, None, 60.0, c + 4), c))
            theirs = asyncio.run(rates(SharedPool(url, c), c))
            print(f"| {c} | {c * 1000 / args.delay_ms:.0f} | {cell(mine)} | {cell(theirs)} | "
                  f"{statistics.median(mine) / statistics.median(theirs):.2f} |", flush=True)
    finally:
        server.terminate()
    return 0


if __name__ == "__main__":
    sys.exit(main())
