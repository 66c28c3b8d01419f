"""DDTree inside SGLang 0.5.17's overlap DFlash worker (DFlashWorkerV2), overlap scheduling on.

The algorithm is k26_ddtree.core; the version-free SGLang pieces (flags and schedule in
args.py, the drafter's top-K in draft.py, the step graphs, the trace, the mask and sampling
maths in verify_utils.py) are reused from k26_ddtree.sglang.common. This package holds what
0.5.17 changes, in SGLang's roles:

  args.py          the flags on 0.5.17's ServerArgs (field help), DDTREE -> DFLASH, validation,
                   the counts per role (target: a schedule width, the widest by default; draft: the
                   block; the spec bag's N: both), the verify-mask policy (a DDTree Triton graph
                   reads the mask) and the verify's static-memory reserve
  ddtree_utils.py  slot maths on the device: the nodes' slots in req_to_token, the commit
                   permutation, the path's rows (commit_kernel.py: the commit in one launch)
  verify_graphs.py the target's verify CUDA graphs: one runner per width of a schedule
  ddtree_info.py   one step's state: the verify input, the acceptance, the on-device commit
  worker.py        DDTreeV2: the drafters built at start-up and the decode step the patched
                   DFlashWorkerV2 hands over (worker.py's docstring walks through it)

Patched SGLang files: patches/sglang-0.5.17/ (README.md lists each hook).
"""
