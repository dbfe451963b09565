"""The simulated fleet: fake Kubernetes API server, simulated GPUs, cloud emulator wiring."""
