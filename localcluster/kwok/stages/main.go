// Command kwok-stages prints the default KWOK stages of the pinned release as one YAML stream
// (what kwokctl writes for a cluster): nodes become Ready and keep a lease, pods become Ready,
// complete and are deleted.
package main

import (
	"fmt"
	"strings"

	nodefast "sigs.k8s.io/kwok/kustomize/stage/node/fast"
	nodelease "sigs.k8s.io/kwok/kustomize/stage/node/heartbeat-with-lease"
	podfast "sigs.k8s.io/kwok/kustomize/stage/pod/fast"
)

func main() {
	stages := []string{
		nodefast.DefaultNodeInit,
		nodelease.DefaultNodeHeartbeatWithLease,
		podfast.DefaultPodReady,
		podfast.DefaultPodComplete,
		podfast.DefaultPodDelete,
	}
	for _, s := range stages {
		fmt.Println("---")
		fmt.Println(strings.TrimSpace(s))
	}
}
