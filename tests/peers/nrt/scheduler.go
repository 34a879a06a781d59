package main

import (
	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/metrics/prometheus/clientgo" // rest client metrics, as upstream's cmd/scheduler
	_ "k8s.io/component-base/metrics/prometheus/version"  // version metric, as upstream's cmd/scheduler
	"k8s.io/kubernetes/cmd/kube-scheduler/app"

	// Registers NodeResourceTopologyMatchArgs in the kube-scheduler configuration scheme: without it the
	// plugin's pluginConfig args do not decode.
	_ "sigs.k8s.io/scheduler-plugins/apis/config/scheme"
	"sigs.k8s.io/scheduler-plugins/pkg/noderesourcetopology"
)

// runScheduler is scheduler-plugins' cmd/scheduler (v0.35.4-devel) with only the plugin the field uses for
// NUMA alignment; the others upstream registers are not enabled by any profile we run.
func runScheduler() int {
	return cli.Run(app.NewSchedulerCommand(app.WithPlugin(noderesourcetopology.Name, noderesourcetopology.New)))
}
