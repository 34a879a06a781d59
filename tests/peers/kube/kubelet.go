// kubelet: the pinned release's CPU Manager (static policy), Topology Manager and Memory Manager, driven on a
// synthetic machine as the judge of kubelet-static placement (tests/oracle/kubeletpeer.py). No cgroups, runtime or
// API server: the managers' policies are what decide where a pod's containers run and whether it is admitted.
//
// JSON lines on stdin, one answer line each on stdout, in order:
//
//	{"machine": {"numa": [{"id", "socket", "memory", "cores": [[cpu, sibling...], ...]}], "distances": [[...]] | null},
//	 "kubelet": {"reservedSystemCPUs", "reservedCPUs", "cpuManagerPolicyOptions", "topologyManagerPolicy",
//	             "topologyManagerScope", "topologyManagerPolicyOptions", "memoryManagerPolicy", "reservedMemory",
//	             "memoryReservation", "maxPods", "featureGates"}}
//	  → {"started": true, "reserved": "<cpuset>", "allocatable": "<cpuset>"} | {"started": false, "error": "..."} (then exit 0)
//	{"op": "add", "pod": <v1.Pod>}
//	  → {"admit": true, "containers": {"<name>": {"cpus", "memory_numa"}}, "free": [...]}
//	  | {"admit": false, "reason", "message": "Pod was rejected: ...", "free": [...]}
//	{"op": "remove", "uid": "..."} → {"removed": true|false, "free": [...]}
//	{"op": "podresources"} → {"allocatable": {"cpu_ids", "memory"}, "pods": [{"namespace", "name", "containers"}]}
//
// A line that is not a request answers {"error": "..."} and the driver reads on. "free" is per NUMA node, in the
// machine's order: the CPUs of the default (shared) set minus the reserved ones, where exclusive CPUs come from.
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/go-logr/logr"
	cadvisorapi "github.com/google/cadvisor/info/v1"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	"k8s.io/klog/v2"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"
	apiv1pod "k8s.io/kubernetes/pkg/api/v1/pod"
	corev1defaults "k8s.io/kubernetes/pkg/apis/core/v1"
	"k8s.io/kubernetes/pkg/apis/core/v1/helper/qos"
	"k8s.io/kubernetes/pkg/features"
	"k8s.io/kubernetes/pkg/kubelet/apis/config"
	"k8s.io/kubernetes/pkg/kubelet/apis/podresources"
	"k8s.io/kubernetes/pkg/kubelet/cm/cpumanager"
	cpustate "k8s.io/kubernetes/pkg/kubelet/cm/cpumanager/state"
	"k8s.io/kubernetes/pkg/kubelet/cm/cpumanager/topology"
	"k8s.io/kubernetes/pkg/kubelet/cm/memorymanager"
	memstate "k8s.io/kubernetes/pkg/kubelet/cm/memorymanager/state"
	"k8s.io/kubernetes/pkg/kubelet/cm/topologymanager"
	"k8s.io/kubernetes/pkg/kubelet/lifecycle"
	schedulerframework "k8s.io/kubernetes/pkg/scheduler/framework"
	"k8s.io/utils/cpuset"
)

type numaNode struct {
	ID     int     `json:"id"`
	Socket int     `json:"socket"`
	Memory uint64  `json:"memory"`
	Cores  [][]int `json:"cores"`
}

type machine struct {
	NUMA      []numaNode `json:"numa"`
	Distances [][]uint64 `json:"distances"`
}

// kubeletSettings are the KubeletConfiguration fields (same names) that decide placement and admission, plus
// what a configuration spreads over several fields: reservedCPUs is systemReserved.cpu + kubeReserved.cpu (used
// when reservedSystemCPUs is empty), memoryReservation is systemReserved + kubeReserved + evictionHard memory
// (bytes; by default the sum of reservedMemory, which the Static Memory Manager requires it to equal).
type kubeletSettings struct {
	ReservedSystemCPUs           string            `json:"reservedSystemCPUs"`
	ReservedCPUs                 resource.Quantity `json:"reservedCPUs"`
	CPUManagerPolicyOptions      map[string]string `json:"cpuManagerPolicyOptions"`
	TopologyManagerPolicy        string            `json:"topologyManagerPolicy"`
	TopologyManagerScope         string            `json:"topologyManagerScope"`
	TopologyManagerPolicyOptions map[string]string `json:"topologyManagerPolicyOptions"`
	MemoryManagerPolicy          string            `json:"memoryManagerPolicy"`
	ReservedMemory               map[string]uint64 `json:"reservedMemory"`
	MemoryReservation            *uint64           `json:"memoryReservation"`
	MaxPods                      int64             `json:"maxPods"`
	// When absent, CPUManagerPolicyAlphaOptions is turned on exactly when an option needs it, as an operator
	// who configures an alpha option does; given, the gates are set as listed and nothing else.
	FeatureGates map[string]bool `json:"featureGates"`
}

type nodeLine struct {
	Machine machine         `json:"machine"`
	Kubelet kubeletSettings `json:"kubelet"`
}

type request struct {
	Op  string          `json:"op"`
	Pod json.RawMessage `json:"pod"`
	UID string          `json:"uid"`
}

type placed struct {
	CPUs       string `json:"cpus"`
	MemoryNUMA []int  `json:"memory_numa"`
}

type verdict struct {
	Admit      bool              `json:"admit"`
	Reason     string            `json:"reason,omitempty"`
	Message    string            `json:"message,omitempty"`
	Containers map[string]placed `json:"containers,omitempty"`
	Free       []string          `json:"free"`
}

type memoryWire struct {
	Type string  `json:"type"`
	Size uint64  `json:"size"`
	NUMA []int64 `json:"numa"`
}

type containerWire struct {
	Name   string       `json:"name"`
	CPUIDs []int64      `json:"cpu_ids"`
	Memory []memoryWire `json:"memory"`
}

type podWire struct {
	Namespace  string          `json:"namespace"`
	Name       string          `json:"name"`
	Containers []containerWire `json:"containers"`
}

// The one node this kubelet runs: the real policies, their in-memory state, and the pods it admitted.
type node struct {
	logger    klog.Logger
	numaIDs   []int
	topo      *topology.CPUTopology
	tm        topologymanager.Manager
	cpu       cpumanager.Policy
	cpuState  cpustate.State
	mem       memorymanager.Policy // nil under the None policy, whose hints and allocations are empty
	memState  memstate.State
	predicate lifecycle.PodAdmitHandler
	resources podresourcesv1.PodResourcesListerServer
	pods      []*v1.Pod // admitted and not removed, in admission order (the kubelet's active pods)
	self      *v1.Node
}

// cpuProvider is cpumanager.manager's HintProvider half without its lock and removeStaleState: a rejected pod's
// allocations are released right after its rejection (release), which is what removeStaleState does on the next call.
type cpuProvider struct{ n *node }

func (p cpuProvider) GetTopologyHints(pod *v1.Pod, c *v1.Container) map[string][]topologymanager.TopologyHint {
	return p.n.cpu.GetTopologyHints(p.n.logger, p.n.cpuState, pod, c)
}

func (p cpuProvider) GetPodTopologyHints(pod *v1.Pod) map[string][]topologymanager.TopologyHint {
	return p.n.cpu.GetPodTopologyHints(p.n.logger, p.n.cpuState, pod)
}

func (p cpuProvider) Allocate(pod *v1.Pod, c *v1.Container) error {
	return p.n.cpu.Allocate(p.n.logger, p.n.cpuState, pod, c)
}

// memoryProvider is memorymanager.manager's, likewise.
type memoryProvider struct{ n *node }

func (p memoryProvider) GetTopologyHints(pod *v1.Pod, c *v1.Container) map[string][]topologymanager.TopologyHint {
	return p.n.mem.GetTopologyHints(p.n.logger, p.n.memState, pod, c)
}

func (p memoryProvider) GetPodTopologyHints(pod *v1.Pod) map[string][]topologymanager.TopologyHint {
	return p.n.mem.GetPodTopologyHints(p.n.logger, p.n.memState, pod)
}

func (p memoryProvider) Allocate(pod *v1.Pod, c *v1.Container) error {
	return p.n.mem.Allocate(p.n.logger, p.n.memState, pod, c)
}

func runKubelet() int {
	flags := flag.NewFlagSet("kubelet", flag.ContinueOnError)
	verbosity := flags.Int("v", -1, "log the managers to stderr at this klog verbosity (default: no log)")
	if err := flags.Parse(os.Args[1:]); err != nil {
		return 2
	}
	if *verbosity < 0 {
		klog.SetLogger(logr.Discard())
	} else {
		klogFlags := flag.NewFlagSet("klog", flag.ContinueOnError)
		klog.InitFlags(klogFlags)
		_ = klogFlags.Set("v", strconv.Itoa(*verbosity))
	}

	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 64<<20)
	out := bufio.NewWriter(os.Stdout)
	enc := json.NewEncoder(out)
	enc.SetEscapeHTML(false)
	answer := func(v any) {
		_ = enc.Encode(v)
		_ = out.Flush()
	}
	fail := func(err error) { answer(map[string]string{"error": err.Error()}) }

	var n *node
	for in.Scan() {
		line := bytes.TrimSpace(in.Bytes())
		if len(line) == 0 {
			continue
		}
		if n == nil {
			var cfg nodeLine
			if err := strictJSON(line, &cfg); err != nil {
				fail(fmt.Errorf("the first line describes the node ({\"machine\": ..., \"kubelet\": ...}): %w", err))
				continue
			}
			if err := cfg.Machine.validate(); err != nil {
				fail(err)
				continue
			}
			started, err := start(cfg)
			if err != nil {
				answer(map[string]any{"started": false, "error": err.Error()})
				return 0
			}
			n = started
			allocatable := n.cpu.GetAllocatableCPUs(n.cpuState)
			answer(map[string]any{"started": true, "reserved": n.topo.CPUDetails.CPUs().Difference(allocatable).String(),
				"allocatable": allocatable.String()})
			continue
		}
		var req request
		if err := strictJSON(line, &req); err != nil {
			fail(err)
			continue
		}
		switch req.Op {
		case "add":
			pod, err := decodePod(req.Pod)
			if err != nil {
				fail(err)
				continue
			}
			if n.active(string(pod.UID)) >= 0 {
				fail(fmt.Errorf("pod uid %q is already admitted on this node", pod.UID))
				continue
			}
			answer(n.add(pod))
		case "remove":
			if req.UID == "" {
				fail(errors.New("remove needs the pod's uid"))
				continue
			}
			answer(map[string]any{"removed": n.remove(req.UID), "free": n.free()})
		case "podresources":
			answer(n.podResources())
		default:
			fail(fmt.Errorf("unknown op %q (add, remove, podresources)", req.Op))
		}
	}
	if err := in.Err(); err != nil {
		fmt.Fprintln(os.Stderr, "kubelet: reading stdin:", err)
		return 1
	}
	return 0
}

func strictJSON(line []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(line))
	dec.DisallowUnknownFields()
	return dec.Decode(v)
}

func (m machine) validate() error {
	if len(m.NUMA) == 0 {
		return errors.New("machine.numa is empty: a node has at least one NUMA node")
	}
	seen := map[int]bool{}
	for _, nn := range m.NUMA {
		if seen[nn.ID] {
			return fmt.Errorf("machine.numa: NUMA node id %d appears twice", nn.ID)
		}
		seen[nn.ID] = true
		if len(nn.Cores) == 0 {
			return fmt.Errorf("machine.numa: NUMA node %d has no cores", nn.ID)
		}
	}
	if m.Distances != nil && len(m.Distances) != len(m.NUMA) {
		return fmt.Errorf("machine.distances has %d rows for %d NUMA nodes", len(m.Distances), len(m.NUMA))
	}
	return nil
}

// machineInfo is what cAdvisor would report for the machine: each core is its list of logical CPUs, numbered as
// given (the caller and the driver then agree on every CPU id).
func (m machine) machineInfo() *cadvisorapi.MachineInfo {
	mi := &cadvisorapi.MachineInfo{}
	sockets := map[int]bool{}
	for i, nn := range m.NUMA {
		cn := cadvisorapi.Node{Id: nn.ID, Memory: nn.Memory}
		if m.Distances != nil {
			cn.Distances = m.Distances[i]
		}
		for _, threads := range nn.Cores {
			cn.Cores = append(cn.Cores, cadvisorapi.Core{Id: mi.NumPhysicalCores, Threads: threads, SocketID: nn.Socket})
			mi.NumPhysicalCores++
			mi.NumCores += len(threads)
		}
		sockets[nn.Socket] = true
		mi.MemoryCapacity += nn.Memory
		mi.Topology = append(mi.Topology, cn)
	}
	mi.NumSockets = len(sockets)
	return mi
}

// start builds the node's managers as NewContainerManager does, in its order; an error is the one the kubelet
// exits with ("failed to run Kubelet: ..."). The kubelet configuration's own validation, which runs before and
// words some of these differently, is not run.
func start(cfg nodeLine) (*node, error) {
	k := cfg.Kubelet
	startErr := func(err error) error { return fmt.Errorf("failed to run Kubelet: %w", err) }
	if err := setFeatureGates(k); err != nil {
		return nil, err
	}
	defaults(&k)
	logger := klog.Background()
	mi := cfg.Machine.machineInfo()

	// cmd/kubelet/app/server.go getReservedCPUs, then the reservation it implies.
	reservedSet := cpuset.New()
	if k.ReservedSystemCPUs != "" {
		set, err := cpuset.Parse(k.ReservedSystemCPUs)
		if err != nil {
			return nil, startErr(fmt.Errorf("unable to parse reserved-cpus list: %s", err))
		}
		topo, err := topology.Discover(logger, mi)
		if err != nil {
			return nil, startErr(fmt.Errorf("unable to discover CPU topology info: %s", err))
		}
		if !set.IsSubsetOf(topo.CPUDetails.CPUs()) {
			return nil, startErr(fmt.Errorf("reserved-cpus: %s is not a subset of online-cpus: %s", k.ReservedSystemCPUs, topo.CPUDetails.CPUs().String()))
		}
		reservedSet = set
		k.ReservedCPUs = *resource.NewQuantity(int64(set.Size()), resource.DecimalSI)
	}
	memoryReservation := uint64(0)
	reservedMemory := []config.MemoryReservation{}
	for id, bytes := range k.ReservedMemory {
		numa, err := strconv.Atoi(id)
		if err != nil {
			return nil, fmt.Errorf("kubelet.reservedMemory: %q is not a NUMA node id", id)
		}
		memoryReservation += bytes
		reservedMemory = append(reservedMemory, config.MemoryReservation{NumaNode: int32(numa),
			Limits: v1.ResourceList{v1.ResourceMemory: *resource.NewQuantity(int64(bytes), resource.BinarySI)}})
	}
	if k.MemoryReservation != nil {
		memoryReservation = *k.MemoryReservation
	}
	// GetNodeAllocatableReservation leaves a resource out when its reservation is zero.
	reservation := v1.ResourceList{}
	if !k.ReservedCPUs.IsZero() {
		reservation[v1.ResourceCPU] = k.ReservedCPUs
	}
	if memoryReservation > 0 {
		reservation[v1.ResourceMemory] = *resource.NewQuantity(int64(memoryReservation), resource.BinarySI)
	}

	tm, err := topologymanager.NewManager(mi.Topology, k.TopologyManagerPolicy, k.TopologyManagerScope, k.TopologyManagerPolicyOptions)
	if err != nil {
		return nil, startErr(err)
	}
	// The device manager is the first hint provider; with no device plugins its hints are empty ("don't care").
	// The Manager constructors give the kubelet's start errors; the policies they wrap are then built alone,
	// since the managers only work once started against a runtime and a checkpoint directory.
	if _, err := cpumanager.NewManager(logger, "static", k.CPUManagerPolicyOptions, 10*time.Second, mi, reservedSet,
		reservation, "", tm); err != nil {
		return nil, startErr(err)
	}
	if _, err := memorymanager.NewManager(logger, k.MemoryManagerPolicy, mi, reservation, reservedMemory, "", tm); err != nil {
		return nil, startErr(err)
	}

	n := &node{logger: logger, tm: tm, cpuState: cpustate.NewMemoryState(logger)}
	for _, nn := range cfg.Machine.NUMA {
		n.numaIDs = append(n.numaIDs, nn.ID)
	}
	if n.topo, err = topology.Discover(logger, mi); err != nil {
		return nil, startErr(err)
	}
	numReserved := int(math.Ceil(float64(k.ReservedCPUs.MilliValue()) / 1000)) // as cpumanager.NewManager rounds it
	if n.cpu, err = cpumanager.NewStaticPolicy(logger, n.topo, numReserved, reservedSet, tm, k.CPUManagerPolicyOptions); err != nil {
		return nil, startErr(err)
	}
	if err := n.cpu.Start(logger, n.cpuState); err != nil {
		return nil, startErr(err)
	}
	tm.AddHintProvider(logger, cpuProvider{n})
	if k.MemoryManagerPolicy == string(memorymanager.PolicyTypeStatic) {
		// memorymanager.NewManager's conversion: every NUMA node present, reserved bytes where configured.
		reserved := map[int]map[v1.ResourceName]uint64{}
		for _, cn := range mi.Topology {
			reserved[cn.Id] = map[v1.ResourceName]uint64{}
		}
		for _, r := range reservedMemory {
			reserved[int(r.NumaNode)][v1.ResourceMemory] = uint64(r.Limits.Memory().Value())
		}
		if n.mem, err = memorymanager.NewPolicyStatic(logger, mi, reserved, tm); err != nil {
			return nil, startErr(err)
		}
		n.memState = memstate.NewMemoryState(logger)
		if err := n.mem.Start(logger, n.memState); err != nil {
			return nil, startErr(err)
		}
		tm.AddHintProvider(logger, memoryProvider{n})
	}

	// The node object the predicate handler judges by: allocatable = capacity - reservation, as the kubelet
	// reports it. Ephemeral storage is left unbounded: storage is not what this judge is about.
	allocatableCPU := int64(mi.NumCores)*1000 - k.ReservedCPUs.MilliValue()
	allocatableMemory := int64(mi.MemoryCapacity) - int64(memoryReservation)
	n.self = &v1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: "node", Labels: map[string]string{
			v1.LabelOSStable: "linux", v1.LabelHostname: "node"}},
		Status: v1.NodeStatus{
			Capacity: v1.ResourceList{
				v1.ResourceCPU:              *resource.NewMilliQuantity(int64(mi.NumCores)*1000, resource.DecimalSI),
				v1.ResourceMemory:           *resource.NewQuantity(int64(mi.MemoryCapacity), resource.BinarySI),
				v1.ResourcePods:             *resource.NewQuantity(k.MaxPods, resource.DecimalSI),
				v1.ResourceEphemeralStorage: *resource.NewQuantity(math.MaxInt64/2, resource.BinarySI),
			},
			Allocatable: v1.ResourceList{
				v1.ResourceCPU:              *resource.NewMilliQuantity(max(allocatableCPU, 0), resource.DecimalSI),
				v1.ResourceMemory:           *resource.NewQuantity(max(allocatableMemory, 0), resource.BinarySI),
				v1.ResourcePods:             *resource.NewQuantity(k.MaxPods, resource.DecimalSI),
				v1.ResourceEphemeralStorage: *resource.NewQuantity(math.MaxInt64/2, resource.BinarySI),
			},
		},
	}
	// The kubelet's own predicate handler (lifecycle.NewPredicateAdmitHandler) with the failure handler the
	// kubelet's tests use: the real one only evicts to make room for critical pods, which these are not. No
	// device plugins, so no plugin resources to update.
	n.predicate = lifecycle.NewPredicateAdmitHandler(
		func(context.Context, bool) (*v1.Node, error) { return n.self, nil },
		lifecycle.NewAdmissionFailureHandlerStub(),
		func(*schedulerframework.NodeInfo, *lifecycle.PodAdmitAttributes) error { return nil })
	n.resources = podresources.NewV1PodResourcesServer(context.Background(), podresources.PodResourcesProviders{
		Pods: podsProvider{n}, Devices: noDevices{}, Cpus: cpusProvider{n}, Memory: memoryResources{n},
		DynamicResources: noDynamicResources{},
	})
	return n, nil
}

func defaults(k *kubeletSettings) {
	// pkg/kubelet/apis/config/v1beta1/defaults.go
	if k.TopologyManagerPolicy == "" {
		k.TopologyManagerPolicy = topologymanager.PolicyNone
	}
	if k.TopologyManagerScope == "" {
		k.TopologyManagerScope = "container"
	}
	if k.MemoryManagerPolicy == "" {
		k.MemoryManagerPolicy = "None"
	}
	if k.MaxPods == 0 {
		k.MaxPods = 110
	}
}

func setFeatureGates(k kubeletSettings) error {
	gates := k.FeatureGates
	if gates == nil {
		gates = map[string]bool{}
		for option := range k.CPUManagerPolicyOptions {
			// An option that is only refused for its gate is an alpha one.
			if cpumanager.CheckPolicyOptionAvailable(option) != nil {
				gates[string(features.CPUManagerPolicyAlphaOptions)] = true
			}
		}
	}
	if err := utilfeature.DefaultMutableFeatureGate.SetFromMap(gates); err != nil {
		return fmt.Errorf("kubelet.featureGates: %w", err)
	}
	return nil
}

// decodePod reads the pod as the apiserver stores it: defaulted (requests from limits, among others) and with
// the QoS class it computes at creation, which the managers read from the status.
func decodePod(raw json.RawMessage) (*v1.Pod, error) {
	if len(raw) == 0 {
		return nil, errors.New("add needs a pod")
	}
	pod := &v1.Pod{}
	if err := json.Unmarshal(raw, pod); err != nil {
		return nil, fmt.Errorf("pod: %w", err)
	}
	if pod.UID == "" {
		return nil, errors.New("pod: metadata.uid is empty; the kubelet keys every allocation by it")
	}
	if len(pod.Spec.Containers) == 0 {
		return nil, fmt.Errorf("pod %s/%s has no containers", pod.Namespace, pod.Name)
	}
	corev1defaults.SetObjectDefaults_Pod(pod)
	pod.Status.QOSClass = qos.ComputePodQOS(pod)
	// The kubelet only receives pods bound to it, which the scheduler matched to its labels; this synthetic node
	// has neither that name nor those labels to judge them by again.
	pod.Spec.NodeName = "node"
	pod.Spec.NodeSelector = nil
	if pod.Spec.Affinity != nil {
		pod.Spec.Affinity.NodeAffinity = nil
	}
	return pod, nil
}

func (n *node) active(uid string) int {
	return slices.IndexFunc(n.pods, func(p *v1.Pod) bool { return string(p.UID) == uid })
}

func containers(pod *v1.Pod) []v1.Container {
	return append(slices.Clone(pod.Spec.InitContainers), pod.Spec.Containers...)
}

// add is canAdmitPod with the handlers that can refuse such a pod, in the kubelet's order: the Topology Manager
// (which allocates CPUs and memory through its hint providers), then the predicate handler (resource fit), then
// the rejection as rejectPod words it.
func (n *node) add(pod *v1.Pod) verdict {
	attrs := &lifecycle.PodAdmitAttributes{Pod: pod, OtherPods: n.pods}
	result := n.tm.Admit(attrs)
	if result.Admit {
		result = n.predicate.Admit(attrs)
	}
	if !result.Admit {
		n.release(pod)
		return verdict{Reason: result.Reason, Message: "Pod was rejected: " + result.Message, Free: n.free()}
	}
	answer := verdict{Admit: true, Containers: map[string]placed{}}
	for _, c := range containers(pod) {
		cpus, _ := n.cpuState.GetCPUSet(string(pod.UID), c.Name)
		answer.Containers[c.Name] = placed{CPUs: cpus.String(), MemoryNUMA: n.memoryNUMA(string(pod.UID), c.Name)}
	}
	n.pods = append(n.pods, pod)
	// The pod starts: memorymanager's AddContainer frees each regular init container's memory when the next
	// container starts (its CPUs stay until the pod goes). The answer above is where each one was placed.
	if n.mem != nil {
		for _, c := range pod.Spec.InitContainers {
			if !apiv1pod.IsRestartableInitContainer(&c) {
				n.mem.RemoveContainer(n.logger, n.memState, string(pod.UID), c.Name)
			}
		}
	}
	answer.Free = n.free()
	return answer
}

func (n *node) remove(uid string) bool {
	i := n.active(uid)
	if i < 0 {
		return false
	}
	n.release(n.pods[i])
	n.pods = slices.Delete(n.pods, i, i+1)
	return true
}

// release gives back every container's CPUs and memory, as removeStaleState does for a pod no longer active.
func (n *node) release(pod *v1.Pod) {
	for _, c := range containers(pod) {
		_ = n.cpu.RemoveContainer(n.logger, n.cpuState, string(pod.UID), c.Name) // errors only for a bad state
		if n.mem != nil {
			n.mem.RemoveContainer(n.logger, n.memState, string(pod.UID), c.Name)
		}
	}
}

func (n *node) memoryNUMA(uid, name string) []int {
	numa := []int{}
	if n.mem == nil {
		return numa
	}
	for _, b := range n.memState.GetMemoryBlocks(uid, name) {
		for _, id := range b.NUMAAffinity {
			if !slices.Contains(numa, id) {
				numa = append(numa, id)
			}
		}
	}
	slices.Sort(numa)
	return numa
}

func (n *node) free() []string {
	available := n.cpuState.GetDefaultCPUSet().Difference(n.reserved())
	out := make([]string, len(n.numaIDs))
	for i, id := range n.numaIDs {
		out[i] = available.Intersection(n.topo.CPUDetails.CPUsInNUMANodes(id)).String()
	}
	return out
}

func (n *node) reserved() cpuset.CPUSet {
	return n.topo.CPUDetails.CPUs().Difference(n.cpu.GetAllocatableCPUs(n.cpuState))
}

// podResources answers as the kubelet's podresources v1 server (its own List and GetAllocatableResources), with
// the container manager's providers: the CPU Manager's exclusive and allocatable CPUs, the Memory Manager's blocks.
func (n *node) podResources() map[string]any {
	listed, err := n.resources.List(context.Background(), &podresourcesv1.ListPodResourcesRequest{})
	if err != nil {
		return map[string]any{"error": err.Error()}
	}
	allocatable, err := n.resources.GetAllocatableResources(context.Background(), &podresourcesv1.AllocatableResourcesRequest{})
	if err != nil {
		return map[string]any{"error": err.Error()}
	}
	pods := []podWire{}
	for _, p := range listed.PodResources {
		wire := podWire{Namespace: p.Namespace, Name: p.Name, Containers: []containerWire{}}
		for _, c := range p.Containers {
			wire.Containers = append(wire.Containers, containerWire{Name: c.Name, CPUIDs: sorted(c.CpuIds), Memory: memoryOut(c.Memory)})
		}
		pods = append(pods, wire)
	}
	return map[string]any{"allocatable": map[string]any{"cpu_ids": sorted(allocatable.CpuIds), "memory": memoryOut(allocatable.Memory)},
		"pods": pods}
}

func sorted(ids []int64) []int64 {
	out := append([]int64{}, ids...) // the API's order is a set's: sorted here so answers compare
	slices.Sort(out)
	return out
}

func memoryOut(blocks []*podresourcesv1.ContainerMemory) []memoryWire {
	out := []memoryWire{}
	for _, b := range blocks {
		w := memoryWire{Type: b.MemoryType, Size: b.Size, NUMA: []int64{}}
		for _, nn := range b.GetTopology().GetNodes() {
			w.NUMA = append(w.NUMA, nn.ID)
		}
		out = append(out, w)
	}
	// The API's order is a map's: sorted (by NUMA nodes, then type) so answers compare.
	slices.SortFunc(out, func(a, b memoryWire) int {
		if c := slices.Compare(a.NUMA, b.NUMA); c != 0 {
			return c
		}
		return strings.Compare(a.Type, b.Type)
	})
	return out
}

type podsProvider struct{ n *node }

func (p podsProvider) GetActivePods() []*v1.Pod { return p.n.pods }
func (p podsProvider) GetPods() []*v1.Pod       { return p.n.pods }
func (p podsProvider) GetPodByName(namespace, name string) (*v1.Pod, bool) {
	i := slices.IndexFunc(p.n.pods, func(pod *v1.Pod) bool { return pod.Namespace == namespace && pod.Name == name })
	if i < 0 {
		return nil, false
	}
	return p.n.pods[i], true
}

type noDevices struct{}

func (noDevices) UpdateAllocatedDevices()                                      {}
func (noDevices) GetDevices(string, string) []*podresourcesv1.ContainerDevices { return nil }
func (noDevices) GetAllocatableDevices() []*podresourcesv1.ContainerDevices    { return nil }

type noDynamicResources struct{}

func (noDynamicResources) GetDynamicResources(*v1.Pod, *v1.Container) []*podresourcesv1.DynamicResource {
	return nil
}

// cpusProvider is containerManagerImpl.GetCPUs / GetAllocatableCPUs over the CPU Manager's state.
type cpusProvider struct{ n *node }

func (p cpusProvider) GetCPUs(podUID, containerName string) []int64 {
	cpus, _ := p.n.cpuState.GetCPUSet(podUID, containerName)
	return int64s(cpus)
}

func (p cpusProvider) GetAllocatableCPUs() []int64 {
	return int64s(p.n.cpu.GetAllocatableCPUs(p.n.cpuState))
}

func int64s(set cpuset.CPUSet) []int64 {
	out := []int64{}
	for _, cpu := range set.List() {
		out = append(out, int64(cpu))
	}
	return out
}

// memoryResources is containerManagerImpl.GetMemory / GetAllocatableMemory (containerMemoryFromBlock) over the
// Memory Manager's state; under the None policy both are empty, as that policy's are.
type memoryResources struct{ n *node }

func (p memoryResources) GetMemory(podUID, containerName string) []*podresourcesv1.ContainerMemory {
	if p.n.mem == nil {
		return nil
	}
	return containerMemory(p.n.memState.GetMemoryBlocks(podUID, containerName))
}

func (p memoryResources) GetAllocatableMemory() []*podresourcesv1.ContainerMemory {
	if p.n.mem == nil {
		return nil
	}
	return containerMemory(p.n.mem.GetAllocatableMemory(p.n.memState))
}

func containerMemory(blocks []memstate.Block) []*podresourcesv1.ContainerMemory {
	var out []*podresourcesv1.ContainerMemory
	for _, b := range blocks {
		m := &podresourcesv1.ContainerMemory{MemoryType: string(b.Type), Size: b.Size,
			Topology: &podresourcesv1.TopologyInfo{Nodes: []*podresourcesv1.NUMANode{}}}
		for _, id := range b.NUMAAffinity {
			m.Topology.Nodes = append(m.Topology.Nodes, &podresourcesv1.NUMANode{ID: int64(id)})
		}
		out = append(out, m)
	}
	return out
}
