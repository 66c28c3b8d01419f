"""k26-ddtree: Kimi K2.6 on SGLang 0.5.11 with DFlash drafting and DDTree verification.

Three layers, one direction of dependency:
  core     tree.py, retrieve.py, verify.py       pure torch, no SGLang
  wiring   k26_ddtree.sglang                     imported by the patched SGLang files: common/, and one
                                                 folder per SGLang version (v0_5_11/, v0_5_17/)
  tools    k26_ddtree.cli and the subcommand packages; never import torch at start-up
"""

__version__ = "0.1.0"
