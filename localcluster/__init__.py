"""A real Kubernetes control plane built from Go modules and run as local processes, for the e2e tests
and for `make cluster-up`. See README.md beside this file."""
