"""`python -m cli`: the `model-placement` command run from a checkout (the tests and benchmarks do)."""

import sys

from cli.main import main

sys.exit(main())
