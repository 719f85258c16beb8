"""The to-do wing: capture, completion checks, the auditor, the judge and the auto-ledger."""
