"""node_agent (see docs/development.md)."""
