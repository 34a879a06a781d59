// One multi-call binary for the NodeResourceTopology pipeline of a kubelet-static node, as the field runs it:
//
//	kube-scheduler        kube-scheduler v1.35.4 with scheduler-plugins' NodeResourceTopologyMatch (v0.35.4-devel)
//	nfd-topology-updater  node-feature-discovery's topology-updater (v0.19.0), which writes the node's NRT
//	podresources          the kubelet's podresources v1 gRPC API, served from a state told on stdin
//
// The first argument (or the name the binary is invoked under) selects the command. One binary because both
// upstream programs sit on the same k8s.io/kubernetes v1.35.4 graph: the 2-core CI machine compiles it once.
package main

import (
	"fmt"
	"os"
	"path/filepath"
)

var commands = map[string]func() int{
	"kube-scheduler":       runScheduler,
	"nfd-topology-updater": runTopologyUpdater,
	"podresources":         runPodResources,
}

func main() {
	name := filepath.Base(os.Args[0])
	if _, ok := commands[name]; !ok && len(os.Args) > 1 {
		// The commands read os.Args themselves (cobra, the flag sets, client-go's user agent), so they must
		// see their own name.
		name = os.Args[1]
		os.Args = append([]string{name}, os.Args[2:]...)
	}
	run, ok := commands[name]
	if !ok {
		fmt.Fprintln(os.Stderr, "usage: nrt kube-scheduler|nfd-topology-updater|podresources [args]")
		os.Exit(2)
	}
	os.Exit(run())
}
