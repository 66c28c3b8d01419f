"""The emulator's wait on a real GPU: captured in a CUDA graph, it spins for what the model says.

    python3 proving_ground/device/emulator_check.py [--box NAME ...]   (run from the checkout)

For each box (default: all) and each (tokens a request, batch, context) shape, one CUDA graph is
captured around proving_ground.emulator.wait (duration from the sequence-length tensor, then the
spin) with the lengths at 1; the lengths are then set to the shape's context and the graph replayed,
so a duration baked in at capture would show. Replays run under torch.cuda.set_sync_debug_mode
("error"): a host sync fails the check. Prints measured (CUDA events, median of 5 replays) against
calibrated µs; exit 1 if any is off by more than 5 %, 0 otherwise.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from proving_ground.emulator.calibration import OneLineParser, box_names, load  # noqa: E402
from proving_ground.emulator.wait import spin, wait_ns  # noqa: E402

SHAPES = ((1, 1, 2048), (8, 1, 2048), (9, 1, 2048), (33, 1, 8192), (1, 64, 2048), (9, 16, 4096), (9, 128, 2048))
TOLERANCE = 0.05
REPLAYS = 5


def check(box: str, tokens: int, batch: int, context: int) -> tuple[float, float]:
    """(calibrated µs, measured µs) of one shape's captured wait."""
    costs = load(box)
    mode = "decode" if tokens == 1 else "target_verify"
    seq_lens = torch.ones(batch, dtype=torch.int32, device="cuda")
    run = lambda: spin(wait_ns(costs, mode, tokens * batch, batch, seq_lens))  # noqa: E731
    run()  # compiles the Triton kernel outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run()
    seq_lens.fill_(context)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(REPLAYS):
        torch.cuda.set_sync_debug_mode("error")
        try:
            start.record()
            graph.replay()
            end.record()
        finally:
            torch.cuda.set_sync_debug_mode("default")
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000)
    return costs.step_us(mode, tokens * batch, batch, [context] * batch), statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="emulator_check.py", description=__doc__.split("\n")[0])
    parser.add_argument("--box", action="append", choices=box_names(), help="default: every box")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("emulator_check: error: no CUDA device", file=sys.stderr)
        return 2
    failed = 0
    for box in args.box or box_names():
        for tokens, batch, context in SHAPES:
            want, got = check(box, tokens, batch, context)
            err = got / want - 1
            ok = abs(err) <= TOLERANCE
            failed += not ok
            print(f"{'ok  ' if ok else 'FAIL'} {box:16s} T={tokens:<3d} B={batch:<4d} ctx={context:<5d}"
                  f" calibrated {want:9.1f} µs  measured {got:9.1f} µs  {err * 100:+6.2f} %", flush=True)
    print(f"emulator_check: {failed} of {len(SHAPES) * len(args.box or box_names())} shapes off by more than"
          f" {TOLERANCE:.0%}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
