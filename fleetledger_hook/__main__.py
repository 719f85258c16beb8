"""``python -S <dir>/fleetledger_hook/__main__.py AGENT EVENT``: the hook, no site-packages."""

import os
import sys

if not __package__:  # run as a file: make the package importable from its parent
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

try:
    from fleetledger_hook.forward import main
except BaseException as exc:  # a hook that cannot even load refuses: exit 2
    sys.stderr.write(f"fleetledger-hook: cannot load ({type(exc).__name__}: {exc}); refused\n")
    sys.exit(2)

sys.exit(main())
