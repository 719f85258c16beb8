"""coordinator (see docs/development.md)."""
