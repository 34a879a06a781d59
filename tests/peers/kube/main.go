// One multi-call binary for the Kubernetes control plane the e2e suite runs on loopback: the first argument
// (or the name the binary is invoked under) selects etcd, kube-apiserver, kube-controller-manager,
// kube-scheduler or kubectl. One binary because the 2-core CI machine then compiles and links the shared
// dependency graph once instead of five times.
package main

import (
	"flag"
	"fmt"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	_ "time/tzdata"

	"github.com/spf13/cobra"
	"go.etcd.io/etcd/server/v3/embed"
	_ "k8s.io/client-go/plugin/pkg/client/auth"
	"k8s.io/component-base/cli"
	"k8s.io/component-base/logs"
	_ "k8s.io/component-base/logs/json/register"
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version"
	kubectl "k8s.io/kubectl/pkg/cmd"
	kubectlutil "k8s.io/kubectl/pkg/cmd/util"
	apiserver "k8s.io/kubernetes/cmd/kube-apiserver/app"
	controllermanager "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	scheduler "k8s.io/kubernetes/cmd/kube-scheduler/app"
)

var commands = map[string]func() int{
	"etcd":                    runEtcd,
	"kube-apiserver":          func() int { return cli.Run(apiserver.NewAPIServerCommand()) },
	"kube-controller-manager": func() int { return cli.Run(controllermanager.NewControllerManagerCommand()) },
	"kube-scheduler":          func() int { return cli.Run(scheduler.NewSchedulerCommand()) },
	"kubectl":                 runKubectl,
	"kubelet":                 runKubelet,
}

func main() {
	name := filepath.Base(os.Args[0])
	if _, ok := commands[name]; !ok && len(os.Args) > 1 {
		// The commands read os.Args themselves (cobra, kubectl's plugin lookup), so they must see their own name.
		name = os.Args[1]
		os.Args = append([]string{name}, os.Args[2:]...)
	}
	run, ok := commands[name]
	if !ok {
		fmt.Fprintln(os.Stderr, "usage: kube etcd|kube-apiserver|kube-controller-manager|kube-scheduler|kubectl|kubelet [args]")
		os.Exit(2)
	}
	os.Exit(run())
}

func runKubectl() int {
	// As cmd/kubectl does: verbosity applies to what happens while the command is being built.
	logs.GlogSetter(kubectl.GetLogVerbosity(os.Args)) // nolint:errcheck
	var command *cobra.Command = kubectl.NewDefaultKubectlCommand()
	if err := cli.RunNoErrOutput(command); err != nil {
		kubectlutil.CheckErr(err)
	}
	return 0
}

// runEtcd serves a single-member etcd through the embed package, with only the flags the suite passes.
func runEtcd() int {
	flags := flag.NewFlagSet("etcd", flag.ContinueOnError)
	dataDir := flags.String("data-dir", "", "data directory")
	client := flags.String("listen-client-urls", "http://127.0.0.1:2379", "client URL")
	peer := flags.String("listen-peer-urls", "http://127.0.0.1:2380", "peer URL")
	noFsync := flags.Bool("unsafe-no-fsync", false, "skip fsync (test data only)")
	logLevel := flags.String("log-level", "info", "debug, info, warn or error")
	if err := flags.Parse(os.Args[1:]); err != nil {
		return 2
	}
	clientURL, err := url.Parse(*client)
	if err != nil {
		fmt.Fprintf(os.Stderr, "etcd: --listen-client-urls %q: %v\n", *client, err)
		return 2
	}
	peerURL, err := url.Parse(*peer)
	if err != nil {
		fmt.Fprintf(os.Stderr, "etcd: --listen-peer-urls %q: %v\n", *peer, err)
		return 2
	}
	cfg := embed.NewConfig()
	cfg.Dir = *dataDir
	cfg.UnsafeNoFsync = *noFsync
	cfg.LogLevel = *logLevel
	cfg.ListenClientUrls = []url.URL{*clientURL}
	cfg.AdvertiseClientUrls = []url.URL{*clientURL}
	cfg.ListenPeerUrls = []url.URL{*peerURL}
	cfg.AdvertisePeerUrls = []url.URL{*peerURL}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	server, err := embed.StartEtcd(cfg)
	if err != nil {
		fmt.Fprintf(os.Stderr, "etcd: %v\n", err)
		return 1
	}
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	select {
	case <-server.Server.ReadyNotify():
		fmt.Fprintf(os.Stderr, "etcd: ready on %s\n", clientURL)
	case <-stop:
		server.Close()
		return 1
	}
	select {
	case err := <-server.Err():
		fmt.Fprintf(os.Stderr, "etcd: %v\n", err)
		server.Close()
		return 1
	case <-stop:
		server.Close()
		return 0
	}
}
