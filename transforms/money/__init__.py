"""Money on the workers: worst-case reservations, caps, the preflight's arithmetic,
apportioning, lineage, the journal of paid requests."""
