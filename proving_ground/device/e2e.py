"""The end-to-end runner as a script, for a machine where the checkout is not installed:
python3 proving_ground/device/e2e.py ARGS (the same as python -m proving_ground ARGS)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from proving_ground.e2e import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
