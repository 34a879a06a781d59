// The helm command line from the helm.sh/helm/v4 module, for `helm lint` and `helm template` of our chart
// (charts/model-placement) in tests and .ci/run; nothing here talks to a cluster.
package main

import (
	"errors"
	"os"

	helmcmd "helm.sh/helm/v4/pkg/cmd"
)

func main() {
	cmd, err := helmcmd.NewRootCmd(os.Stdout, os.Args[1:], helmcmd.SetupLogging)
	if err == nil {
		err = cmd.Execute()
	}
	if err != nil {
		var exit helmcmd.CommandError
		if errors.As(err, &exit) {
			os.Exit(exit.ExitCode)
		}
		os.Exit(1)
	}
}
