"""``python -m lens``: the ``lens`` command line, so that launchers which run a module (``torchrun -m lens
capture ...``) start it as they start any other.

This is the one module of ``lens`` that imports ``app``: it is the entry point, not library code, and
nothing imports it (tests/test_layering.py lists it as the one exception and checks that).
"""

import sys

from app.commands.cli import main

sys.exit(main())
