"""The execution wing: the execution state (stale premises, commands answered from the record)
and the claims cache with the provider a miss asks."""
