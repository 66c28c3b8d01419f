"""Entry point of the GPU proving ground; the runner lives in k26_ddtree.gpu.e2e (also `k26-deploy selftest --gpu`).

See tests/gpu/README.md for how to run the proving-ground matrix runs on a GPU box.
"""

import sys

from k26_ddtree.gpu.e2e import main

if __name__ == "__main__":
    sys.exit(main())
