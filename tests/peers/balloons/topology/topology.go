// Package topology stands in for nri-plugins' nested module pkg/topology, which the Go module proxy does not
// serve at any version (nri-plugins itself builds it from its own tree through a replace). It is ours, written
// to the API the balloons policy and resmgr compile against, and does only what the oracle's nodes need:
// a preferCloseToDevices path such as /sys/devices/system/node/nodeN resolves to the CPUs sysfs lists for it.
// The oracle's containers carry no device mounts, so device-node lookups find nothing.
package topology

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// ProviderKubelet names hints that come from the kubelet's CRI requests.
const ProviderKubelet = "kubelet"

// Hint is the locality sysfs gives for one device.
type Hint struct {
	Provider string
	CPUs     string
	NUMAs    string
	Sockets  string
}

// Hints are keyed by the device (provider) they came from.
type Hints map[string]Hint

// Logger is the debug logger resmgr installs.
type Logger interface {
	Debugf(format string, v ...interface{})
}

var (
	sysRoot        = ""
	log     Logger = quiet{}
)

type quiet struct{}

func (quiet) Debugf(string, ...interface{}) {}

// SetSysRoot makes every sysfs path relative to root (resmgr's --host-root).
func SetSysRoot(root string) {
	root = filepath.Clean(root)
	if root == "/" || root == "." {
		root = ""
	}
	if root != "" && !filepath.IsAbs(root) {
		abs, err := filepath.Abs(root)
		if err != nil {
			panic(fmt.Errorf("failed to resolve %q to absolute path: %v", root, err))
		}
		root = abs
	}
	sysRoot = root
}

// SetLogger installs l and returns the previous logger.
func SetLogger(l Logger) Logger {
	old := log
	log = l
	return old
}

func readTrimmed(path string) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(data))
}

// hintAt reads the locality files sysfs puts in a device directory (a NUMA node's cpulist, a PCI device's
// local_cpulist and numa_node).
func hintAt(dir string) Hint {
	hint := Hint{Provider: "/" + strings.TrimPrefix(strings.TrimPrefix(dir, sysRoot), "/")}
	for _, name := range []string{"cpulist", "local_cpulist", "cpulistaffinity"} {
		if cpus := readTrimmed(filepath.Join(dir, name)); cpus != "" {
			hint.CPUs = cpus
			break
		}
	}
	if numa := readTrimmed(filepath.Join(dir, "numa_node")); numa != "" && numa != "-1" {
		hint.NUMAs = numa
	}
	return hint
}

// NewTopologyHints gives the locality of devPath: the nearest directory, from the device up to
// /sys/devices, that sysfs gives a CPU list or NUMA node for.
func NewTopologyHints(devPath string) (Hints, error) {
	host := filepath.Join(sysRoot, devPath)
	real, err := filepath.EvalSymlinks(host)
	if err != nil {
		return nil, fmt.Errorf("failed to get realpath for %s: %w", host, err)
	}
	hints := Hints{}
	for dir := real; strings.HasPrefix(dir, sysRoot+"/sys/devices/"); dir = filepath.Dir(dir) {
		if hint := hintAt(dir); hint.CPUs != "" || hint.NUMAs != "" {
			log.Debugf("topology hint for %s: CPUs %q NUMAs %q", devPath, hint.CPUs, hint.NUMAs)
			hints[hint.Provider] = hint
			break
		}
	}
	return hints, nil
}

// MergeTopologyHints adds to org the hints of providers it does not have yet.
func MergeTopologyHints(org, hints Hints) Hints {
	if org == nil {
		org = Hints{}
	}
	for provider, hint := range hints {
		if _, ok := org[provider]; !ok {
			org[provider] = hint
		}
	}
	return org
}

// FindSysFsDevice maps a device node to its sysfs directory; the oracle's containers mount none.
func FindSysFsDevice(dev string) (string, error) {
	return "", nil
}

// FindGivenSysFsDevice maps a device number to its sysfs directory; the oracle's containers have none.
func FindGivenSysFsDevice(devType string, major, minor int64) (string, error) {
	return "", nil
}
