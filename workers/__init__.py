"""Processes: the controller, the node agent, and the gpuheal command line."""
