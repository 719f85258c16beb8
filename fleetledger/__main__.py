"""`python -m fleetledger` is the `fleetledger` command."""

from fleetledger.cli import main

main()
