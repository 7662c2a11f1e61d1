//go:build tools

// Package tools pins the node commands this module builds, so `go mod tidy` keeps their dependencies
// in go.sum.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-proxy"
	_ "k8s.io/kubernetes/cmd/kubelet"
)
