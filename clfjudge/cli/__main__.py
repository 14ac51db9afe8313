"""``python -m clfjudge.cli``: the `clfjudge` command."""
import sys

from . import main

sys.exit(main())
