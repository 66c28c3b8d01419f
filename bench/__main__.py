"""`python -m bench ...` from the repository root: the same as `k26-deploy bench ...`."""

import sys

from k26_ddtree.cli.main import main

sys.exit(main(["bench", *sys.argv[1:]]))
