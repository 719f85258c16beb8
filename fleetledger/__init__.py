"""fleetledger: the command line and the embedded local fleet."""

__version__ = "0.1.0"
