"""Pure policy data and validation: the Xid catalog, classification, the ladder and guard limits."""
