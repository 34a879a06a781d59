package main

import (
	"flag"
	"fmt"
	"net"
	"os"
	"path"
	"strings"
	"time"

	"k8s.io/klog/v2"

	topology "sigs.k8s.io/node-feature-discovery/pkg/nfd-topology-updater"
	"sigs.k8s.io/node-feature-discovery/pkg/resourcemonitor"
	"sigs.k8s.io/node-feature-discovery/pkg/utils/hostpath"
	"sigs.k8s.io/node-feature-discovery/pkg/version"
)

// The rest of this file is node-feature-discovery v0.19.0's cmd/nfd-topology-updater/main.go (a main package,
// so it cannot be imported), with its flags, defaults and messages unchanged; only its exits became returns.
//
// Where it reads the host: hostpath's prefix is a link-time variable (the upstream image links "/host-" and its
// DaemonSet mounts the host's /sys at /host-sys); ours is "/proc/self/cwd/host/" (tests/peers/nrt/ldflags), so
// a process reads host/sys under its own working directory, and each virtual node's updater runs in a directory
// of its own holding that node's synthetic sysfs (tests/oracle/sysfs.py). Absolute, because ghw joins the
// "/sys" it is given onto its chroot ("/"): a relative prefix would read /host/sys. It reads only /sys there: ghw, which
// NFD asks for the NUMA topology with only "/sys" overridden, still opens the machine's own /proc/meminfo
// (hugepage size), whose values NFD does not use.

const (
	updaterProgramName = "nfd-topology-updater"
	kubeletSecurePort  = 10250
)

var defaultKubeletStateDir = path.Join(string(hostpath.VarDir), "lib", "kubelet")

func runTopologyUpdater() int {
	flags := flag.NewFlagSet(updaterProgramName, flag.ExitOnError)

	args, resourcemonitorArgs, code := parseUpdaterArgs(flags, os.Args[1:]...)
	if code >= 0 {
		return code
	}

	if version.Undefined() {
		klog.InfoS("version not set! Set -ldflags \"-X sigs.k8s.io/node-feature-discovery/pkg/version.version=`git describe --tags --dirty --always --match 'v*'`\" during build or run.")
	}

	instance, err := topology.NewTopologyUpdater(*args, *resourcemonitorArgs)
	if err != nil {
		klog.ErrorS(err, "failed to initialize topology updater instance")
		return 1
	}

	if err = instance.Run(); err != nil {
		klog.ErrorS(err, "error while running")
		return 1
	}
	return 0
}

// parseUpdaterArgs returns the exit code upstream's parseArgs would exit with, or -1 to go on.
func parseUpdaterArgs(flags *flag.FlagSet, osArgs ...string) (*topology.Args, *resourcemonitor.Args, int) {
	args, resourcemonitorArgs := initUpdaterFlags(flags)
	printVersion := flags.Bool("version", false, "Print version and exit.")

	_ = flags.Parse(osArgs)
	if len(flags.Args()) > 0 {
		_, _ = fmt.Fprintf(flags.Output(), "unknown command line argument: %s\n", flags.Args()[0])
		flags.Usage()
		return nil, nil, 2
	}

	if *printVersion {
		fmt.Println(updaterProgramName, version.Get())
		return nil, nil, 0
	}

	if len(resourcemonitorArgs.KubeletConfigURI) == 0 {
		nodeAddress := os.Getenv("NODE_ADDRESS")
		if len(nodeAddress) == 0 {
			_, _ = fmt.Fprintf(flags.Output(), "unable to determine the default kubelet config endpoint 'https://${NODE_ADDRESS}:%d/configz' due to empty NODE_ADDRESS environment, "+
				"please either define the NODE_ADDRESS environment variable or specify endpoint with the -kubelet-config-uri flag\n", kubeletSecurePort)
			return nil, nil, 1
		}
		if isIPv6(nodeAddress) {
			nodeAddress = "[" + nodeAddress + "]"
		}
		resourcemonitorArgs.KubeletConfigURI = fmt.Sprintf("https://%s:%d/configz", nodeAddress, kubeletSecurePort)
	}

	return args, resourcemonitorArgs, -1
}

func initUpdaterFlags(flagset *flag.FlagSet) (*topology.Args, *resourcemonitor.Args) {
	args := &topology.Args{}
	resourcemonitorArgs := &resourcemonitor.Args{}

	flagset.BoolVar(&args.Oneshot, "oneshot", false,
		"Update once and exit")
	flagset.BoolVar(&args.NoPublish, "no-publish", false,
		"Do not create or update NodeResourceTopology objects.")
	flagset.StringVar(&args.KubeConfigFile, "kubeconfig", "",
		"Kube config file.")
	flagset.IntVar(&args.Port, "port", 8080,
		"Port which metrics and healthz endpoints are served on")
	flagset.DurationVar(&resourcemonitorArgs.SleepInterval, "sleep-interval", time.Duration(60)*time.Second,
		"Time to sleep between CR updates. zero means no CR updates on interval basis. [Default: 60s]")
	flagset.StringVar(&resourcemonitorArgs.Namespace, "watch-namespace", "*",
		"Namespace to watch pods (for testing/debugging purpose). Use * for all namespaces.")
	flagset.StringVar(&resourcemonitorArgs.KubeletConfigURI, "kubelet-config-uri", "",
		"Kubelet config URI path. Default to kubelet configz endpoint.")
	flagset.StringVar(&resourcemonitorArgs.APIAuthTokenFile, "api-auth-token-file", "/var/run/secrets/kubernetes.io/serviceaccount/token",
		"API auth token file path. It is used to request kubelet configz endpoint, only takes effect when kubelet-config-uri is https. Default to /var/run/secrets/kubernetes.io/serviceaccount/token.")
	flagset.StringVar(&resourcemonitorArgs.PodResourceSocketPath, "podresources-socket", hostpath.VarDir.Path("lib/kubelet/pod-resources/kubelet.sock"),
		"Pod Resource Socket path to use.")
	flagset.StringVar(&args.ConfigFile, "config", "/etc/kubernetes/node-feature-discovery/nfd-topology-updater.conf",
		"Config file to use.")
	flagset.BoolVar(&resourcemonitorArgs.PodSetFingerprint, "pods-fingerprint", true, "Compute and report the pod set fingerprint")
	flagset.StringVar(&args.KubeletStateDir, "kubelet-state-dir", defaultKubeletStateDir, "Kubelet state directory path for watching state and checkpoint files")

	klog.InitFlags(flagset)

	return args, resourcemonitorArgs
}

func isIPv6(addr string) bool {
	ip := net.ParseIP(addr)
	return ip != nil && strings.Count(ip.String(), ":") >= 2
}
