"""The fleet wing: the outbox publisher, what the node follows of the fleet (risks, grants,
resources), the consequential-action gate and the people who may act in person."""
