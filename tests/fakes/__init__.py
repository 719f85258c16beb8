"""In-memory transports for unit tests: each implements a service's Protocol (no servers)."""
