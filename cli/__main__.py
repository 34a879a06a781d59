"""`python -m cli`: the `model-placement` command run from a checkout (the tests and benchmarks do)."""

import sys

from cli.main import main

if __name__ == "__main__":  # not when a walk of the packages imports it (tests/image's probe does)
    sys.exit(main())
