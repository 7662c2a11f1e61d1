"""The one free_port of tests, e2e and bench: a loopback port below the kernel's ephemeral range, as the local
cluster picks its own (localcluster/cluster.py says why a port from the ephemeral range is not safe)."""

from localcluster.cluster import free_port as free_port

__all__ = ["free_port"]
