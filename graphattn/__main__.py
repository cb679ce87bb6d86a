"""``python -m graphattn``: the same as the ``graphattn`` console script."""

import sys

from .cli import main

sys.exit(main())
