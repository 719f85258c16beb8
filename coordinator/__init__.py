"""coordinator (see SPEC S3)."""
