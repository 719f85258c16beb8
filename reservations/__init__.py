"""reservations (see SPEC S3)."""
