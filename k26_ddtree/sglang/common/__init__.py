"""The DDTree logic both SGLang versions share: flags, config and schedule (args.py), the drafter
(draft.py), its step graphs (step_graphs.py), the verify's maths and fused kernels
(verify_utils.py, verify_kernels.py), the server trace (trace.py) and the triton backend's
CUDA-graph buffer sizes for DFlash runners (buffers.py).

Only verify_utils.py imports sglang at import time: the patched server_args.py imports args.py,
and k26-deploy tune reads traces where sglang is not installed.
"""
