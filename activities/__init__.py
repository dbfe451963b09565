"""Side effects, one module per external system. Each verifies its effect and is idempotent."""
