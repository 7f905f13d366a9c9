"""Entry point of the supervisor's zipapp: `python -I -S supervisor-<hash>.pyz serve` runs this
module of the zipped `tfctl_supervisor` package (see `bundle`)."""

import sys

from .serve import main

sys.exit(main(sys.argv))
