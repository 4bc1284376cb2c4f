"""``python -m api.cli``: the ``fleet`` command line (how the local runners start workers)."""

import sys

from api.cli import main

sys.exit(main())
