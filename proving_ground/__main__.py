"""`python -m proving_ground ARGS`: the end-to-end runner (proving_ground/device/README.md)."""

import sys

from proving_ground.e2e import main

sys.exit(main())
