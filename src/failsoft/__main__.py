"""``python -m failsoft``: the same as the ``failsoft`` console script."""

import sys

from failsoft.cli import main

sys.exit(main())
