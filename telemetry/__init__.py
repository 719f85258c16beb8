"""telemetry (see SPEC S3)."""
