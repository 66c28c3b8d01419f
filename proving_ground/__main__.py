"""`python -m proving_ground ARGS`: the end-to-end runner (docs/proving-ground.md)."""

import sys

from proving_ground.e2e import main

sys.exit(main())
