"""The HTTP layer: the server, the upstream connection pool, the proxy relay, held streams, the metrics listener."""
