"""``python -S <dir>/fleetledger_hook/__main__.py AGENT EVENT``: the hook, no site-packages."""

import os
import sys

if not __package__:  # run as a file: make the package importable from its parent
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from fleetledger_hook.forward import main

sys.exit(main())
