"""Where a request goes: the route table's sources and kube watch, pod picking, demand leases, the hold queue."""
