import gzip
import json

from proving_ground import profile


def _trace(path, events):
    with gzip.open(path, "wt") as fh:
        json.dump({"traceEvents": events}, fh)


def test_summary_counts_kernels_graphs_and_syncs_per_step(tmp_path):
    events = []
    for step in range(4):
        t = step * 1000.0
        events += [
            {"ph": "X", "cat": "cuda_runtime", "name": "cudaGraphLaunch", "ts": t, "dur": 5.0},
            {"ph": "X", "cat": "kernel", "name": "fused_moe_kernel", "ts": t + 10, "dur": 300.0},
            {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": t + 400, "dur": 4.0},
            {"ph": "X", "cat": "kernel", "name": "topk_kernel", "ts": t + 410, "dur": 20.0},
            {"ph": "X", "cat": "cuda_runtime", "name": "cudaMemcpyAsync", "ts": t + 500, "dur": 90.0},
            {"ph": "X", "cat": "cpu_op", "name": "aten::topk", "ts": t + 399, "dur": 15.0},
            {"ph": "i", "cat": "marker", "name": "ignored", "ts": t},
        ]
    path = tmp_path / "rank0.trace.json.gz"
    _trace(path, events)
    text = profile.summarize(path, steps=4)
    assert "GPU kernel time per step     320.0 us  (2.0 kernels per step)" in text
    assert "eager kernel launches          1.0 per step; CUDA graph launches 1.0 per step" in text
    assert "host syncs and memcpys         1.0 per step, 90.0 us per step blocked" in text
    assert text.index("fused_moe_kernel") < text.index("topk_kernel")
    assert profile.newest_trace(tmp_path) == path
