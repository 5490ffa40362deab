"""python -m testbed.soak: the soak's command line (runner.main)."""

import sys

from testbed.soak import runner

sys.exit(runner.main(sys.argv[1:]))
