-- Raise the mission's partition epoch (the prologue does it): a takeover, before serving.
return 1
