"""The safety simulation (issue 22): seeded random schedules over the real NodeRemediation,
FleetGuard and NodeAdmission on the time-skipping server, with stand-in activities that record
every side effect, and the invariants checked over that record. `python -m sim.safety --help`."""
