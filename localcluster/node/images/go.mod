// The tiny static programs the real node's images are made of (no registry here): `pause`, the pod sandbox's
// process (Kubernetes' own is C), `hello`, the e2e test's container, and `podcheck`, the e2e test's in-pod
// probe (DNS, Services, the API server with the pod's ServiceAccount). Standard library only.
module servlane.dev/localcluster/node/images

go 1.26.0
