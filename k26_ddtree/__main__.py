import sys

from k26_ddtree.cli.main import main

sys.exit(main())
