"""The node's local API: the routes the hooks, the CLI and the agents call."""
