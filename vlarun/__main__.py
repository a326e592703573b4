"""``python -m vlarun ...`` = the ``vlarun`` command, for a checkout on ``PYTHONPATH`` without an
installed entry point (a bare GPU machine: ``PYTHONPATH=. python3 -m vlarun bench gpu-check``)."""

import sys

from vlarun.cli import main

sys.exit(main())
