"""Fleet what-if: the real workflows against a month of modelled faults, in virtual time."""
