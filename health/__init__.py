"""Probes that run on a GPU node. Each returns findings; a check that cannot run is a finding too."""
