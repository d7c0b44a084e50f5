"""`python -m nopeinterp ...` (what `torchrun -m nopeinterp train ...` runs)."""

import sys

from nopeinterp.cli import main

sys.exit(main())
