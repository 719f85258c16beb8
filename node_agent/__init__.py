"""node_agent (see SPEC S3)."""
