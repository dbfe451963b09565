"""The load-test battery: what a node must do under sustained work, not what it says when asked.

One module per test (compute, memory, bandwidth), the checkers they share (checks.py), what is
watched during the load (watch.py: clock-event reasons, Xid and ECC events), the external tools
parsed when installed (tools.py: dcgmi diag, nccl-tests, nvbandwidth), and the devices they run
on (device.py: the interface; cupy_device.py: real GPUs; sim_device.py: numpy-backed GPUs with
injectable faults). battery.py runs a tier on every GPU at once.
"""
