"""Pool requests: validation, team limits, the pool's body, and the steps that create and check it."""
