// Command balloons runs the real NRI balloons policy of containers/nri-plugins (its resmgr and agent, as the
// plugin's own main wires them) against a sysfs tree under -host-root, and drives it as a container runtime
// would, through containerd/nri's runtime-side adaptation on a socket in a temporary directory.
//
// Its policy comes either from a BalloonsPolicy file (-config-file: the oracle's one node) or, in agent mode,
// from a cluster (-kubeconfig and the NODE_NAME environment variable, as the plugin's DaemonSet passes them):
// then the plugin's own agent picks the node's BalloonsPolicy (node.<name>, else group.<label>, else default),
// patches that policy's status, and writes the node's NodeResourceTopology through the apiserver itself.
// tests/oracle/peer.py speaks its line protocol; the protocol is described there.
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	nri "github.com/containerd/nri/pkg/adaptation"
	balloons "github.com/containers/nri-plugins/cmd/plugins/balloons/policy"
	"github.com/containers/nri-plugins/pkg/agent"
	"github.com/containers/nri-plugins/pkg/kubernetes"
	logger "github.com/containers/nri-plugins/pkg/log"
	"github.com/containers/nri-plugins/pkg/pidfile"
	resmgr "github.com/containers/nri-plugins/pkg/resmgr/main"
	resmgrpolicy "github.com/containers/nri-plugins/pkg/resmgr/policy"
)

const cfsPeriod = 100000 // the kubelet's CFS period, in microseconds

// Pod is a pod sandbox as a request names it; the QoS class becomes the cgroup parent the kubelet gives it.
type Pod struct {
	Name        string            `json:"name"`
	Namespace   string            `json:"namespace"`
	QOS         string            `json:"qos"`
	Labels      map[string]string `json:"labels"`
	Annotations map[string]string `json:"annotations"`
}

func (p Pod) key() string { return p.Namespace + "/" + p.Name }

// Container carries what the kubelet turns into Linux resources: CPU request and limit in milli-CPUs,
// memory limit in bytes.
type Container struct {
	Name        string            `json:"name"`
	CPURequestM int64             `json:"cpu_request_m"`
	CPULimitM   int64             `json:"cpu_limit_m"`
	MemoryLimit int64             `json:"memory_limit"`
	Annotations map[string]string `json:"annotations"`
}

type request struct {
	Op        string    `json:"op"`
	Pod       Pod       `json:"pod"`
	Container Container `json:"container"`
	Policy    string    `json:"policy"` // reconfigure: the new BalloonsPolicy, YAML
}

// Placement is what the runtime last applied to a container.
type Placement struct {
	Cpuset string `json:"cpuset"`
	Mems   string `json:"mems"`
}

type answer struct {
	Cpuset     *string                      `json:"cpuset,omitempty"`
	Mems       *string                      `json:"mems,omitempty"`
	Updates    map[string]Placement         `json:"updates,omitempty"`
	Containers map[string]Placement         `json:"containers,omitempty"`
	Balloons   []balloon                    `json:"balloons,omitempty"`
	Zones      []*resmgrpolicy.TopologyZone `json:"zones,omitempty"`
	Applied    *bool                        `json:"applied,omitempty"`
	Refused    string                       `json:"refused,omitempty"`
	Error      *string                      `json:"error"`
}

type balloon struct {
	Name         string   `json:"name"`
	Type         string   `json:"type"`
	Instance     string   `json:"instance"`
	Cpuset       string   `json:"cpuset"`
	SharedCpuset string   `json:"shared_cpuset"`
	Components   string   `json:"component_cpusets,omitempty"`
	Containers   []string `json:"containers"`
}

type podState struct {
	sandbox    *nri.PodSandbox
	containers map[string]*nri.Container // by container name
}

// runtime is the fake container runtime: the pods and containers it runs and where they are pinned.
type runtime struct {
	sync.Mutex
	nri       *nri.Adaptation
	backend   resmgrpolicy.Backend
	pods      map[string]*podState
	placement map[string]Placement // by container ID
	names     map[string]string    // container ID -> namespace/pod/container
	nextID    int
	log       *logWatch
	config    string // the policy file the agent watches

	unsolicitedLock sync.Mutex
	unsolicited     []*nri.ContainerUpdate // updates the plugin sent on its own, applied before the next request
}

func (r *runtime) id(prefix string) string {
	r.nextID++
	return fmt.Sprintf("%s%06d", prefix, r.nextID)
}

// apply records the runtime's view of the updates the plugin asked for and returns them by container name.
func (r *runtime) apply(updates []*nri.ContainerUpdate) map[string]Placement {
	changed := map[string]Placement{}
	for _, u := range updates {
		cpu := u.GetLinux().GetResources().GetCpu()
		if cpu == nil {
			continue
		}
		p := r.placement[u.ContainerId]
		if cpu.Cpus != "" {
			p.Cpuset = cpu.Cpus
		}
		if cpu.Mems != "" {
			p.Mems = cpu.Mems
		}
		r.placement[u.ContainerId] = p
		if name, ok := r.names[u.ContainerId]; ok {
			changed[name] = p
		}
	}
	return changed
}

// cgroupParent is the kubelet's cgroup for a pod of that QoS class: resmgr reads the class from it.
func cgroupParent(qos, uid string) (string, bool) {
	switch qos {
	case "Guaranteed":
		return "/kubepods/pod" + uid, true
	case "Burstable":
		return "/kubepods/burstable/pod" + uid, true
	case "BestEffort":
		return "/kubepods/besteffort/pod" + uid, true
	}
	return "", false
}

func (r *runtime) sandbox(ctx context.Context, p Pod) (*podState, error) {
	if ps, ok := r.pods[p.key()]; ok {
		return ps, nil
	}
	if p.Name == "" || p.Namespace == "" {
		return nil, errors.New("a pod needs a name and a namespace")
	}
	uid := r.id("uid-")
	parent, ok := cgroupParent(p.QOS, uid)
	if !ok {
		return nil, fmt.Errorf("pod %s: qos must be Guaranteed, Burstable or BestEffort, not %q", p.key(), p.QOS)
	}
	sb := &nri.PodSandbox{
		Id: r.id("pod-"), Name: p.Name, Uid: uid, Namespace: p.Namespace,
		Labels: p.Labels, Annotations: p.Annotations,
		Linux: &nri.LinuxPodSandbox{CgroupParent: parent, CgroupsPath: parent},
	}
	if err := r.nri.RunPodSandbox(ctx, &nri.StateChangeEvent{Pod: sb}); err != nil {
		return nil, fmt.Errorf("RunPodSandbox %s: %w", p.key(), err)
	}
	ps := &podState{sandbox: sb, containers: map[string]*nri.Container{}}
	r.pods[p.key()] = ps
	return ps, nil
}

func (r *runtime) create(ctx context.Context, p Pod, c Container) answer {
	ps, err := r.sandbox(ctx, p)
	if err != nil {
		return failed(err)
	}
	if c.Name == "" {
		return failed(fmt.Errorf("pod %s: a container needs a name", p.key()))
	}
	if _, ok := ps.containers[c.Name]; ok {
		return failed(fmt.Errorf("pod %s already has a container %q", p.key(), c.Name))
	}
	cpu := &nri.LinuxCPU{Shares: nri.UInt64(kubernetes.MilliCPUToShares(c.CPURequestM)), Period: nri.UInt64(uint64(cfsPeriod))}
	if c.CPULimitM > 0 {
		cpu.Quota = nri.Int64(c.CPULimitM * cfsPeriod / 1000)
	}
	res := &nri.LinuxResources{Cpu: cpu}
	if c.MemoryLimit > 0 {
		res.Memory = &nri.LinuxMemory{Limit: nri.Int64(c.MemoryLimit)}
	}
	ctr := &nri.Container{
		Id: r.id("ctr-"), PodSandboxId: ps.sandbox.Id, Name: c.Name, State: nri.ContainerState_CONTAINER_CREATED,
		Annotations: c.Annotations,
		Linux:       &nri.LinuxContainer{Resources: res, CgroupsPath: ps.sandbox.Linux.CgroupParent + "/" + c.Name},
	}
	rpl, err := r.nri.CreateContainer(ctx, &nri.CreateContainerRequest{Pod: ps.sandbox, Container: ctr})
	if err != nil {
		// The runtime fails the container: it never runs, and the plugin forgets it.
		return failed(err)
	}
	r.names[ctr.Id] = p.key() + "/" + c.Name
	ps.containers[c.Name] = ctr
	updates := r.apply(rpl.GetUpdate())
	own := r.apply([]*nri.ContainerUpdate{{ContainerId: ctr.Id, Linux: &nri.LinuxContainerUpdate{Resources: rpl.GetAdjust().GetLinux().GetResources()}}})
	delete(updates, r.names[ctr.Id])
	ctr.State = nri.ContainerState_CONTAINER_RUNNING
	if err := r.nri.StartContainer(ctx, &nri.StateChangeEvent{Pod: ps.sandbox, Container: ctr}); err != nil {
		return failed(fmt.Errorf("StartContainer %s: %w", r.names[ctr.Id], err))
	}
	placed := own[r.names[ctr.Id]]
	return answer{Cpuset: &placed.Cpuset, Mems: &placed.Mems, Updates: updates}
}

func (r *runtime) remove(ctx context.Context, ps *podState, name string) (map[string]Placement, error) {
	ctr, ok := ps.containers[name]
	if !ok {
		return nil, fmt.Errorf("pod %s/%s has no container %q", ps.sandbox.Namespace, ps.sandbox.Name, name)
	}
	rpl, err := r.nri.StopContainer(ctx, &nri.StopContainerRequest{Pod: ps.sandbox, Container: ctr})
	if err != nil {
		return nil, fmt.Errorf("StopContainer %s: %w", r.names[ctr.Id], err)
	}
	ctr.State = nri.ContainerState_CONTAINER_STOPPED
	if err := r.nri.RemoveContainer(ctx, &nri.StateChangeEvent{Pod: ps.sandbox, Container: ctr}); err != nil {
		return nil, fmt.Errorf("RemoveContainer %s: %w", r.names[ctr.Id], err)
	}
	updates := r.apply(rpl.GetUpdate())
	delete(updates, r.names[ctr.Id])
	delete(r.placement, ctr.Id)
	delete(r.names, ctr.Id)
	delete(ps.containers, name)
	return updates, nil
}

func (r *runtime) pod(p Pod) (*podState, error) {
	ps, ok := r.pods[p.key()]
	if !ok {
		return nil, fmt.Errorf("no pod %s", p.key())
	}
	return ps, nil
}

func (r *runtime) removePod(ctx context.Context, p Pod) answer {
	ps, err := r.pod(p)
	if err != nil {
		return failed(err)
	}
	updates := map[string]Placement{}
	names := make([]string, 0, len(ps.containers))
	for name := range ps.containers {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		changed, err := r.remove(ctx, ps, name)
		if err != nil {
			return failed(err)
		}
		for k, v := range changed {
			updates[k] = v
		}
	}
	for prefix := range updates {
		if strings.HasPrefix(prefix, p.key()+"/") {
			delete(updates, prefix)
		}
	}
	if err := r.nri.StopPodSandbox(ctx, &nri.StateChangeEvent{Pod: ps.sandbox}); err != nil {
		return failed(fmt.Errorf("StopPodSandbox %s: %w", p.key(), err))
	}
	if err := r.nri.RemovePodSandbox(ctx, &nri.StateChangeEvent{Pod: ps.sandbox}); err != nil {
		return failed(fmt.Errorf("RemovePodSandbox %s: %w", p.key(), err))
	}
	delete(r.pods, p.key())
	return answer{Updates: updates}
}

func (r *runtime) containers() map[string]Placement {
	all := map[string]Placement{}
	for id, name := range r.names {
		all[name] = r.placement[id]
	}
	return all
}

// balloons reads the zones the plugin would export to its NodeResourceTopology: one per balloon, and its
// containers as child zones when the policy sets showContainersInNrt.
func (r *runtime) balloons() answer {
	zones := r.backend.GetTopologyZones()
	byName := map[string]*balloon{}
	var out []balloon
	for _, z := range zones {
		if z.Type != "balloon" {
			continue
		}
		b := balloon{Name: z.Name, Containers: []string{}}
		if i := strings.LastIndex(z.Name, "["); i > 0 && strings.HasSuffix(z.Name, "]") {
			b.Type, b.Instance = z.Name[:i], z.Name[i+1:len(z.Name)-1]
		}
		for _, a := range z.Attributes {
			switch a.Name {
			case "cpuset":
				b.Cpuset = a.Value
			case "shared cpuset":
				b.SharedCpuset = a.Value
			case "component cpusets":
				b.Components = a.Value
			}
		}
		out = append(out, b)
	}
	for i := range out {
		byName[out[i].Name] = &out[i]
	}
	for _, z := range zones {
		if b, ok := byName[z.Parent]; ok && z.Type != "balloon" {
			b.Containers = append(b.Containers, z.Name)
		}
	}
	return answer{Balloons: out, Zones: zones}
}

func failed(err error) answer {
	msg := err.Error()
	return answer{Error: &msg}
}

func (r *runtime) serve(in io.Reader, out io.Writer) {
	enc := json.NewEncoder(out)
	scan := bufio.NewScanner(in)
	scan.Buffer(make([]byte, 1<<20), 1<<24)
	for scan.Scan() {
		line := bytes.TrimSpace(scan.Bytes())
		if len(line) == 0 {
			continue
		}
		var req request
		var ans answer
		if err := json.Unmarshal(line, &req); err != nil {
			ans = failed(fmt.Errorf("request is not JSON of the protocol: %v", err))
		} else {
			ans = r.handle(req)
		}
		if err := enc.Encode(ans); err != nil {
			return
		}
	}
}

func (r *runtime) handle(req request) answer {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	r.Lock()
	defer r.Unlock()
	r.unsolicitedLock.Lock()
	r.apply(r.unsolicited)
	r.unsolicited = nil
	r.unsolicitedLock.Unlock()
	switch req.Op {
	case "create":
		return r.create(ctx, req.Pod, req.Container)
	case "remove":
		ps, err := r.pod(req.Pod)
		if err != nil {
			return failed(err)
		}
		updates, err := r.remove(ctx, ps, req.Container.Name)
		if err != nil {
			return failed(err)
		}
		return answer{Updates: updates}
	case "remove_pod":
		return r.removePod(ctx, req.Pod)
	case "containers":
		return answer{Containers: r.containers()}
	case "balloons":
		return r.balloons()
	case "reconfigure":
		if r.config == "" {
			return failed(errors.New("in agent mode the policy is the node's BalloonsPolicy in the cluster: update that"))
		}
		refused, err := r.log.reconfigure(r.config, []byte(req.Policy))
		if err != nil {
			return failed(err)
		}
		applied := refused == ""
		return answer{Applied: &applied, Refused: refused}
	}
	return failed(fmt.Errorf("unknown op %q (create, remove, remove_pod, containers, balloons, reconfigure)", req.Op))
}

// logWatch passes the plugin's log through to stderr and reads the few lines that tell how a configuration
// went: an invalid policy at start-up makes the plugin exit (or, when it fails CRD-level validation, wait
// forever), and an update's outcome is only ever logged.
type logWatch struct {
	sync.Mutex
	out    *json.Encoder
	ready  chan struct{}
	once   sync.Once
	update *pendingUpdate // the configuration update a reconfigure op waits for
}

type pendingUpdate struct {
	seen bool   // the plugin took the new file in
	err  string // why it refused it
	done chan string
}

var refusals = []string{"failed to apply configuration: ", "failed to validate configuration: ", "failed to start with initial configuration"}

const (
	updateSeen     = "configuration update "    // resmgr.updateConfig, before applying
	updateFailed   = "failed to apply update: " // resmgr.reconfigure; the previous config is put back
	updateInvalid  = "failed to validate configuration: "
	updateFinished = "updating topology zones..." // resmgr.updateConfig, after applying or reverting
)

func after(line, marker string) (string, bool) {
	i := strings.Index(line, marker)
	if i < 0 {
		return "", false
	}
	return strings.TrimRight(strings.TrimSpace(line[i:]), `"`), true
}

func (w *logWatch) Write(p []byte) (int, error) {
	os.Stderr.Write(p)
	select {
	case <-w.ready:
		w.Lock()
		defer w.Unlock()
		if w.update != nil {
			for _, line := range strings.Split(string(p), "\n") {
				w.follow(line)
			}
		}
	default:
		for _, line := range strings.Split(string(p), "\n") {
			for _, marker := range refusals {
				if msg, ok := after(line, marker); ok {
					w.refuse(msg)
				}
			}
		}
	}
	return len(p), nil
}

func (w *logWatch) follow(line string) {
	u := w.update
	switch {
	case strings.Contains(line, updateSeen):
		u.seen = true
	case strings.Contains(line, updateFailed):
		u.err, _ = after(line, updateFailed)
	case strings.Contains(line, updateInvalid):
		msg, _ := after(line, updateInvalid)
		u.done <- msg
		w.update = nil
	case u.seen && strings.Contains(line, updateFinished):
		u.done <- u.err
		w.update = nil
	}
}

func (w *logWatch) refuse(msg string) {
	w.once.Do(func() {
		w.out.Encode(map[string]any{"ready": false, "error": msg})
		// The plugin exits by itself after a fatal refusal; after a validation one it would wait for a
		// better configuration that never comes.
		go func() { time.Sleep(200 * time.Millisecond); os.Exit(2) }()
	})
}

// reconfigure replaces the policy file, as an updated BalloonsPolicy reaches the agent, and waits for the
// plugin's verdict on it: "" when it applied it, else its error (it then keeps the previous configuration).
func (w *logWatch) reconfigure(file string, policy []byte) (string, error) {
	done := make(chan string, 1)
	w.Lock()
	w.update = &pendingUpdate{done: done}
	w.Unlock()
	next := file + ".next"
	if err := os.WriteFile(next, policy, 0o644); err != nil {
		return "", err
	}
	if err := os.Rename(next, file); err != nil {
		return "", err
	}
	select {
	case verdict := <-done:
		return verdict, nil
	case <-time.After(30 * time.Second):
		w.Lock()
		w.update = nil
		w.Unlock()
		return "", errors.New("the plugin did not take the new policy file in within 30 s")
	}
}

func main() {
	// The protocol owns the original stdout; everything else that writes to fd 1 lands on stderr.
	protoFd, err := syscall.Dup(1)
	if err != nil {
		fmt.Fprintf(os.Stderr, "dup stdout: %v\n", err)
		os.Exit(1)
	}
	if err := syscall.Dup2(2, 1); err != nil {
		fmt.Fprintf(os.Stderr, "redirect stdout: %v\n", err)
		os.Exit(1)
	}
	proto := os.NewFile(uintptr(protoFd), "protocol")
	enc := json.NewEncoder(proto)
	fatal := func(format string, args ...any) {
		enc.Encode(map[string]any{"ready": false, "error": fmt.Sprintf(format, args...)})
		os.Exit(1)
	}

	flag.Parse()
	configFile := flag.Lookup("config-file").Value.String()
	agentMode := flag.Lookup("kubeconfig").Value.String() != ""
	if flag.Lookup("host-root").Value.String() == "" || (configFile == "") == !agentMode ||
		(agentMode && os.Getenv("NODE_NAME") == "") {
		fatal("usage: balloons -host-root DIR (-config-file POLICY.yaml | -kubeconfig FILE with NODE_NAME set)")
	}
	work, err := os.MkdirTemp("", "balloons-oracle-")
	if err != nil {
		fatal("temporary directory: %v", err)
	}
	defer os.RemoveAll(work)
	socket := filepath.Join(work, "nri.sock")
	for name, value := range map[string]string{
		"nri-socket": socket, "state-dir": filepath.Join(work, "state"), "pid-file": filepath.Join(work, "pid"),
	} {
		if err := flag.Set(name, value); err != nil {
			fatal("flag %s: %v", name, err)
		}
	}
	// v0.14.0 parses -pid-file but never hands it to pkg/pidfile, whose path stays /run/<binary>.pid: peers
	// started at once (the oracle's threads, test workers, a virtual fleet) would remove and create the same file.
	pidfile.SetPath(filepath.Join(work, "pid"))

	watch := &logWatch{out: enc, ready: make(chan struct{})}
	logger.SetOutput(watch)

	synced := make(chan struct{})
	var listening atomic.Bool // Start synchronizes the (no) pre-launched plugins; only a connection counts
	rt := &runtime{pods: map[string]*podState{}, placement: map[string]Placement{}, names: map[string]string{},
		log: watch, config: configFile}
	syncFn := func(ctx context.Context, cb nri.SyncCB) error {
		if _, err := cb(ctx, nil, nil); err != nil {
			return err
		}
		if listening.Load() {
			close(synced)
		}
		return nil
	}
	updateFn := func(_ context.Context, updates []*nri.ContainerUpdate) ([]*nri.ContainerUpdate, error) {
		// Queued, not applied: a request may hold the runtime's state while it waits for the plugin.
		rt.unsolicitedLock.Lock()
		rt.unsolicited = append(rt.unsolicited, updates...)
		rt.unsolicitedLock.Unlock()
		return nil, nil
	}
	nri.SetPluginRequestTimeout(60 * time.Second)
	plugins := filepath.Join(work, "plugins")
	if err := os.MkdirAll(plugins, 0o755); err != nil {
		fatal("%v", err)
	}
	rt.nri, err = nri.New("model-placement-oracle", "v0", syncFn, updateFn,
		nri.WithSocketPath(socket), nri.WithPluginPath(plugins), nri.WithPluginConfigPath(plugins))
	if err != nil {
		fatal("NRI runtime: %v", err)
	}
	if err := rt.nri.Start(); err != nil {
		fatal("NRI runtime start: %v", err)
	}
	listening.Store(true)
	defer rt.nri.Stop()

	agt, err := agent.New(agent.BalloonsConfigInterface())
	if err != nil {
		fatal("agent: %v", err)
	}
	rt.backend = balloons.New()
	mgr, err := resmgr.New(agt, rt.backend)
	if err != nil {
		fatal("resource manager: %v", err)
	}
	go func() {
		if err := mgr.Run(); err != nil {
			watch.refuse(fmt.Sprintf("resource manager: %v", err))
		}
	}()

	select {
	case <-synced:
	case <-time.After(60 * time.Second):
		// In agent mode the plugin connects only once the agent has handed it a policy.
		fatal("the plugin did not connect to the runtime within 60 s (see stderr)")
	}
	// The adaptation registers the plugin right after synchronizing it; this waits for that.
	rt.nri.BlockPluginSync().Unblock()
	close(watch.ready)
	enc.Encode(map[string]any{"ready": true, "error": nil})
	rt.serve(os.Stdin, proto)
}
