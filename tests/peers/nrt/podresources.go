package main

// podresources: the kubelet's podresources API (v1, and v1alpha1 beside it as the kubelet registers both) on a
// unix socket, served by the kubelet v1.35.4's own server code (pkg/kubelet/apis/podresources, with the rate
// limiter and listener of pkg/kubelet/server.ListenAndServePodResources) over providers that hold what we are
// told on stdin, one JSON state a line, each replacing the last:
//
//	{"allocatable": {"cpu_ids": [2, 3, ...], "memory": [{"type": "memory", "size": 68719476736, "numa": 0}, ...]},
//	 "pods": [{"namespace": "ns", "name": "p", "containers": [{"name": "c", "cpu_ids": [4, 5],
//	           "memory": [{"type": "memory", "size": 1073741824, "numa": 0}]}]}]}
//
// which is what the kubelet driver (`kube kubelet`, op "podresources") answers: allocatable = the CPU manager's
// GetAllocatableCPUs (all − reserved) and the memory manager's allocatable blocks per NUMA node; pods = the active
// pods in the kubelet's order, each container as podresources lists it (app containers and sidecars; the kubelet
// leaves regular init containers out, so the state should too). "numa" is one NUMA node id or a list of them (a
// memory block the memory manager spread over several). No devices and no dynamic resources: the nodes we emulate
// have none.
//
// Answers on stdout, one line per state: {"ok": true}, or {"error": "<why>"} and the previous state stays. The
// socket is created once the first state is accepted (a kubelet opens it once its managers have started), so a
// reader never sees a kubelet with no CPUs. End of stdin stops the server and removes the socket.

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"sync"

	"google.golang.org/grpc"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	criutil "k8s.io/cri-client/pkg/util"
	podresourcesapi "k8s.io/kubelet/pkg/apis/podresources/v1"
	podresourcesapiv1alpha1 "k8s.io/kubelet/pkg/apis/podresources/v1alpha1"
	apisgrpc "k8s.io/kubernetes/pkg/kubelet/apis/grpc"
	"k8s.io/kubernetes/pkg/kubelet/apis/podresources"
)

type memoryBlock struct {
	Type string   `json:"type"`
	Size uint64   `json:"size"`
	NUMA numaList `json:"numa"`
}

// numaList reads "numa" as a single id or a list of ids.
type numaList []int64

func (n *numaList) UnmarshalJSON(data []byte) error {
	var one int64
	if err := json.Unmarshal(data, &one); err == nil {
		*n = numaList{one}
		return nil
	}
	var many []int64
	if err := json.Unmarshal(data, &many); err != nil {
		return fmt.Errorf("numa is a NUMA node id or a list of them, not %s", data)
	}
	*n = many
	return nil
}

type containerState struct {
	Name   string        `json:"name"`
	CPUIDs []int64       `json:"cpu_ids"`
	Memory []memoryBlock `json:"memory"`
}

type podState struct {
	Namespace  string           `json:"namespace"`
	Name       string           `json:"name"`
	Containers []containerState `json:"containers"`
}

type nodeState struct {
	Allocatable *struct {
		CPUIDs []int64        `json:"cpu_ids"`
		Memory []memoryBlock `json:"memory"`
	} `json:"allocatable"`
	Pods []podState `json:"pods"`
}

// kubeletState is the four providers the kubelet's server asks: pods (the pod manager), CPUs (the CPU
// manager), memory (the memory manager) and devices (the device manager, empty here).
type kubeletState struct {
	lock        sync.RWMutex
	pods        []*v1.Pod
	byName      map[types.NamespacedName]*v1.Pod
	cpus        map[types.UID]map[string][]int64
	memory      map[types.UID]map[string][]*podresourcesapi.ContainerMemory
	allocCPUs   []int64
	allocMemory []*podresourcesapi.ContainerMemory
}

func containerMemory(blocks []memoryBlock, where string) ([]*podresourcesapi.ContainerMemory, error) {
	out := make([]*podresourcesapi.ContainerMemory, 0, len(blocks))
	for _, b := range blocks {
		if b.Type == "" || len(b.NUMA) == 0 {
			return nil, fmt.Errorf("%s: a memory block needs a type (memory, hugepages-<size>) and its NUMA node(s): %+v", where, b)
		}
		nodes := make([]*podresourcesapi.NUMANode, 0, len(b.NUMA))
		for _, id := range b.NUMA {
			nodes = append(nodes, &podresourcesapi.NUMANode{ID: id})
		}
		out = append(out, &podresourcesapi.ContainerMemory{MemoryType: b.Type, Size: b.Size,
			Topology: &podresourcesapi.TopologyInfo{Nodes: nodes}})
	}
	return out, nil
}

// set replaces the state with one read from a line, or leaves it as it was and says why not.
func (k *kubeletState) set(line []byte) error {
	var s nodeState
	if err := json.Unmarshal(line, &s); err != nil {
		return fmt.Errorf("not a podresources state: %v", err)
	}
	if s.Allocatable == nil {
		return errors.New(`the state has no "allocatable": the kubelet always reports its allocatable CPUs and memory`)
	}
	allocMemory, err := containerMemory(s.Allocatable.Memory, "allocatable")
	if err != nil {
		return err
	}
	next := kubeletState{byName: map[types.NamespacedName]*v1.Pod{}, cpus: map[types.UID]map[string][]int64{},
		memory: map[types.UID]map[string][]*podresourcesapi.ContainerMemory{}, allocCPUs: s.Allocatable.CPUIDs,
		allocMemory: allocMemory}
	for _, p := range s.Pods {
		key := types.NamespacedName{Namespace: p.Namespace, Name: p.Name}
		if p.Namespace == "" || p.Name == "" {
			return fmt.Errorf("a pod needs a namespace and a name: %+v", p)
		}
		if _, dup := next.byName[key]; dup {
			return fmt.Errorf("pod %s is listed twice", key)
		}
		// The providers are keyed by pod UID, which the API never shows; namespace/name stands in for it.
		pod := &v1.Pod{}
		pod.Namespace, pod.Name, pod.UID = p.Namespace, p.Name, types.UID(key.String())
		next.cpus[pod.UID] = map[string][]int64{}
		next.memory[pod.UID] = map[string][]*podresourcesapi.ContainerMemory{}
		for _, c := range p.Containers {
			if c.Name == "" {
				return fmt.Errorf("pod %s: a container needs a name", key)
			}
			if _, dup := next.cpus[pod.UID][c.Name]; dup {
				return fmt.Errorf("pod %s: container %s is listed twice", key, c.Name)
			}
			mem, err := containerMemory(c.Memory, fmt.Sprintf("pod %s container %s", key, c.Name))
			if err != nil {
				return err
			}
			pod.Spec.Containers = append(pod.Spec.Containers, v1.Container{Name: c.Name})
			next.cpus[pod.UID][c.Name] = c.CPUIDs
			next.memory[pod.UID][c.Name] = mem
		}
		next.pods = append(next.pods, pod)
		next.byName[key] = pod
	}
	k.lock.Lock()
	defer k.lock.Unlock()
	k.pods, k.byName, k.cpus, k.memory = next.pods, next.byName, next.cpus, next.memory
	k.allocCPUs, k.allocMemory = next.allocCPUs, next.allocMemory
	return nil
}

// PodsProvider: every pod told is active (the driver lists the pods its managers hold).
func (k *kubeletState) GetActivePods() []*v1.Pod { return k.GetPods() }
func (k *kubeletState) GetPods() []*v1.Pod {
	k.lock.RLock()
	defer k.lock.RUnlock()
	return k.pods
}
func (k *kubeletState) GetPodByName(namespace, name string) (*v1.Pod, bool) {
	k.lock.RLock()
	defer k.lock.RUnlock()
	pod, ok := k.byName[types.NamespacedName{Namespace: namespace, Name: name}]
	return pod, ok
}

// CPUsProvider
func (k *kubeletState) GetCPUs(podUID, containerName string) []int64 {
	k.lock.RLock()
	defer k.lock.RUnlock()
	return k.cpus[types.UID(podUID)][containerName]
}
func (k *kubeletState) GetAllocatableCPUs() []int64 {
	k.lock.RLock()
	defer k.lock.RUnlock()
	return k.allocCPUs
}

// MemoryProvider
func (k *kubeletState) GetMemory(podUID, containerName string) []*podresourcesapi.ContainerMemory {
	k.lock.RLock()
	defer k.lock.RUnlock()
	return k.memory[types.UID(podUID)][containerName]
}
func (k *kubeletState) GetAllocatableMemory() []*podresourcesapi.ContainerMemory {
	k.lock.RLock()
	defer k.lock.RUnlock()
	return k.allocMemory
}

// DevicesProvider and DynamicResourcesProvider: none on these nodes.
type noDevices struct{}

func (noDevices) UpdateAllocatedDevices()                                      {}
func (noDevices) GetDevices(string, string) []*podresourcesapi.ContainerDevices { return nil }
func (noDevices) GetAllocatableDevices() []*podresourcesapi.ContainerDevices    { return nil }
func (noDevices) GetDynamicResources(*v1.Pod, *v1.Container) []*podresourcesapi.DynamicResource {
	return nil
}

func runPodResources() int {
	flags := flag.NewFlagSet("podresources", flag.ContinueOnError)
	socket := flags.String("socket", "", "the unix socket to serve on (the kubelet's is /var/lib/kubelet/pod-resources/kubelet.sock)")
	if err := flags.Parse(os.Args[1:]); err != nil {
		return 2
	}
	if *socket == "" || flags.NArg() > 0 {
		fmt.Fprintln(os.Stderr, "podresources: give the socket to serve on with -socket PATH (and nothing else); states are read from stdin")
		return 2
	}
	state := &kubeletState{}
	providers := podresources.PodResourcesProviders{Pods: state, Devices: noDevices{}, Cpus: state, Memory: state,
		DynamicResources: noDevices{}}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var server *grpc.Server
	served := make(chan error, 1)

	out := json.NewEncoder(os.Stdout)
	in := bufio.NewReader(os.Stdin)
	for {
		line, err := in.ReadBytes('\n')
		if len(line) > 0 {
			if err := state.set(line); err != nil {
				_ = out.Encode(map[string]string{"error": err.Error()})
			} else {
				if server == nil {
					// As pkg/kubelet/server.ListenAndServePodResources.
					server = grpc.NewServer(apisgrpc.WithRateLimiter(ctx, "podresources", podresources.DefaultQPS, podresources.DefaultBurstTokens))
					podresourcesapiv1alpha1.RegisterPodResourcesListerServer(server, podresources.NewV1alpha1PodResourcesServer(providers))
					podresourcesapi.RegisterPodResourcesListerServer(server, podresources.NewV1PodResourcesServer(ctx, providers))
					listener, err := criutil.CreateListener(*socket)
					if err != nil {
						fmt.Fprintf(os.Stderr, "podresources: cannot listen on %s: %v\n", *socket, err)
						return 1
					}
					go func() { served <- server.Serve(listener) }()
				}
				_ = out.Encode(map[string]bool{"ok": true})
			}
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "podresources: reading stdin: %v\n", err)
			return 1
		}
		select {
		case err := <-served:
			fmt.Fprintf(os.Stderr, "podresources: the server stopped: %v\n", err)
			return 1
		default:
		}
	}
	if server != nil {
		server.Stop()
		_ = os.Remove(*socket)
	}
	return 0
}
