"""``python -S <dir>/fleetledger_hook AGENT EVENT``: run the hook without site-packages."""

import os
import sys

if not __package__:  # run as a directory: make the package importable from its parent
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from fleetledger_hook.core import main

sys.exit(main())
