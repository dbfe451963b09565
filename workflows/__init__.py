"""Deterministic workflows: NodeRemediation, FleetGuard, NodeAdmission."""
