"""``python -m failsoft``: the ``failsoft`` command, for environments without the console script."""

import sys

from failsoft.cli import main

sys.exit(main())
