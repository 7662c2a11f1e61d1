"""End-to-end tests against a real Kubernetes control plane (built and run by `localcluster/`)."""
