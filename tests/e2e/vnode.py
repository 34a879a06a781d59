"""Virtual nodes: behind a Node object of the e2e control plane, a kubelet stand-in (`KubeletStandIn`) and what
really decides where containers run: the balloons plugin (`VirtualNode`) or the kubelet's own managers
(`KubeletStaticNode`, see its docstring: kubelet v1.35.4's CPU, Topology and Memory Managers through
tests/oracle/kubeletpeer.py, node-feature-discovery's topology-updater writing the NRT through tests/e2e/nrt.py).

Balloons nodes: per node, one `tests/peers/balloons` process in agent mode on a synthetic sysfs of the node's shape
(`tests/oracle/sysfs.py`): the plugin's own agent (nri-plugins `pkg/agent`) watches the Node and picks its
BalloonsPolicy (`node.<name>`, else `group.<config.nri/group label>`, else `default`) from the apiserver, patches
that policy's status and writes the node's NodeResourceTopology itself, with the ServiceAccount and RBAC the
nri-plugins Helm chart gives the plugin (rendered by the real helm, `install_plugin_rbac`).

The kubelet stand-in (one thread per node) registers the Node with the status a kubelet reports, watches the pods
bound to it (`fieldSelector=spec.nodeName=<node>`) and runs each one on the plugin as the kubelet would
(`tests/oracle/kubelet.py`: the one pod-to-plugin conversion, init containers to completion, then native sidecars
and app containers). A pod whose containers all start is set Running with the kubelet's conditions. A container the
plugin refuses is what kubelet v1.35's kuberuntime does with a CreateContainer error: a Warning event (reason
`Failed`, "Error: <the plugin's error>"), the container waiting in `CreateContainerError` with that message, the
pod Pending, and the pod synced again after its worker's back-off (`backOffPeriod` 10 s, jitter 0.5: 10-15 s);
unlike the kubelet, the containers that did start are removed too and the whole pod is retried. A pod being
deleted has its containers removed from the plugin and is then deleted for good (grace period 0), as the kubelet's
status manager finishes a graceful delete. No restarts, probes or network.

Where each container runs is written after every change to `<cluster root>/vnodes/<node>.json`:

    {"node": "vn-0", "shape": {NodeShape fields},
     "pods": {"<ns>/<pod>": {"uid": "...", "phase": "Running" | "Pending", "attempts": 1,
                             "message": "<the plugin's error>" (Pending: refused on its last attempt),
                             "containers": {"<container>": {"cpuset": "1,2,3,65,66,67", "mems": "0"}}}}}

On a kubelet-static node a pod is "Running" or "Failed" (rejected at admission, with "reason" and "message"), and
"cpuset" is the container's exclusive CPUs ("" for one in the shared pool), "mems" its Memory Manager NUMA nodes.

`containers` are those running now, as the runtime last applied the plugin's pinning (so a re-pin the plugin makes
while another pod starts shows too); a removed pod leaves the file. `on_record`, if given, gets each record as it
is written (in the kubelet thread), so that a pod deleted soon after it starts is seen all the same.
"""

from __future__ import annotations

import json
import os
import random
import re
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any, TypeVar

from placement.quantity import cpu_milli, memory_bytes
from tests.e2e.cluster import Api, Cluster, Component
from tests.e2e.nrt import PodResources, TopologyUpdaters, install_topology_updaters
from tests.oracle.kubelet import PodRun, peer_pod, run_pod
from tests.oracle.kubeletpeer import REJECTED, KubeletPeer, Placed
from tests.oracle.peer import BalloonsPeer, PolicyRefused, nri_plugins_dir
from tests.oracle.sysfs import NodeShape
from tests.peers.build import build

PLUGIN_NAMESPACE = "kube-system"
PLUGIN_ACCOUNT = "nri-resource-policy-balloons"  # the chart's ServiceAccount for the balloons plugin
CHART = "deployment/helm/balloons"
RBAC_TEMPLATES = ("serviceaccount", "clusterrole", "clusterrolebinding", "role", "rolebindings")
WATCH_SECONDS = 300
RESTARTS = 5
GRPC_WRAPPER = re.compile(r"^rpc error: code = \w+ desc = ")
BACKOFF_SECONDS, BACKOFF_JITTER = 10.0, 0.5  # kubelet.go backOffPeriod, pod_workers.go workerBackOffPeriodJitterFactor


def install_plugin_rbac(cluster: Cluster) -> Path:
    """The plugin's ServiceAccount, ClusterRole, Role and bindings as the nri-plugins chart of the pinned release
    renders them (`helm template`), applied with kubectl; the kubeconfig its agent authenticates with."""
    shows = [arg for t in RBAC_TEMPLATES for arg in ("--show-only", f"templates/{t}.yaml")]
    rendered = subprocess.run([str(build("helm")), "template", PLUGIN_ACCOUNT, str(nri_plugins_dir() / CHART),
                               "--namespace", PLUGIN_NAMESPACE, *shows], capture_output=True, text=True, timeout=120)
    if rendered.returncode != 0:
        raise AssertionError(f"helm template of the nri-plugins balloons chart failed:\n{rendered.stderr}")
    cluster.kubectl("apply", "-f", "-", input=rendered.stdout)
    return cluster.service_account_kubeconfig(PLUGIN_ACCOUNT, PLUGIN_NAMESPACE)


def node_object(name: str, shape: NodeShape, labels: dict[str, str], taints: list[dict[str, str]]) -> dict[str, Any]:
    """The Node as a kubelet registers it for this shape (with NFD's labels); its status is `node_status`."""
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {
                "kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
                "feature.node.kubernetes.io/cpu-hardware_multithreading": str(shape.threads_per_core > 1).lower(),
                "feature.node.kubernetes.io/memory-numa.node_count": str(shape.numa_nodes),
                "feature.node.kubernetes.io/memory-numa": str(shape.numa_nodes > 1).lower(),
                **labels}},
            "spec": {"taints": taints} if taints else {}}


def node_status(shape: NodeShape, reserved_cpus: int = 0, reserved_memory: int = 0) -> dict[str, Any]:
    """What the kubelet posts: capacity from the machine, allocatable = capacity less what its configuration
    reserves (CPUs; bytes of memory: kube- and system-reserved plus the hard eviction threshold), the four
    conditions with the kubelet's reasons, its address and versions."""
    now = _now()
    gib = shape.memory_gib_per_numa * shape.numa_nodes
    capacity = {"cpu": str(shape.cpus), "memory": f"{gib}Gi", "pods": "110", "ephemeral-storage": "500Gi",
                "hugepages-1Gi": "0", "hugepages-2Mi": "0"}
    allocatable = {**capacity, "cpu": str(shape.cpus - reserved_cpus),
                   **({"memory": f"{(gib * 2**30 - reserved_memory) // 1024}Ki"} if reserved_memory else {})}
    pressure = [("MemoryPressure", "KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
                ("DiskPressure", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
                ("PIDPressure", "KubeletHasSufficientPID", "kubelet has sufficient PID available")]
    conditions = [{"type": t, "status": "False", "reason": r, "message": m, "lastHeartbeatTime": now,
                   "lastTransitionTime": now} for t, r, m in pressure]
    conditions.append({"type": "Ready", "status": "True", "reason": "KubeletReady",
                       "message": "kubelet is posting ready status", "lastHeartbeatTime": now,
                       "lastTransitionTime": now})
    return {"capacity": capacity, "allocatable": allocatable, "conditions": conditions,
            "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}, {"type": "Hostname", "address": "vnode"}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {"architecture": "amd64", "operatingSystem": "linux", "kubeletVersion": "v1.35.4",
                         "containerRuntimeVersion": "containerd://2.1.0", "kernelVersion": "6.8.0",
                         "osImage": "Ubuntu 24.04", "kubeProxyVersion": "", "machineID": "", "systemUUID": "",
                         "bootID": ""}}


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


class KubeletStandIn:
    """A Node and the kubelet stand-in behind it (one thread): the Node registered with the status a kubelet
    reports, the pods bound to it watched and started in the kubelet's order, their status written, the record
    kept. What runs a pod's containers is the subclass's: `_start`, `_forget`, `_placed` and `_close`."""

    def __init__(self, cluster: Cluster, name: str, shape: NodeShape, *, labels: dict[str, str] | None = None,
                 taints: list[dict[str, str]] | None = None,
                 on_record: Callable[[dict[str, Any]], None] | None = None) -> None:
        self.cluster, self.name, self.shape, self.on_record = cluster, name, shape, on_record
        self.labels, self.taints = labels or {}, taints or []
        # Its own client: a watch holds a connection for the node's life.
        self.api = Api(cluster.server, cluster.pki / "ca.crt", cluster.api.auth["Authorization"].split()[1])
        self.record_path = cluster.root / "vnodes" / f"{name}.json"
        self.pods: dict[str, dict[str, Any]] = {}  # "ns/name" -> its record entry, while the node has the pod
        # The runtime speaks one request at a time; the watch and any timers take turns.
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.errors: list[str] = []  # what went wrong in the kubelet thread, for a test to show

    # -- life -------------------------------------------------------------------------------------------

    def _register(self, reserved_cpus: int = 0, reserved_memory: int = 0) -> None:
        self.api.call("POST", "/api/v1/nodes", node_object(self.name, self.shape, self.labels, self.taints))
        self.api.call("PATCH", f"/api/v1/nodes/{self.name}/status",
                      {"status": node_status(self.shape, reserved_cpus, reserved_memory)},
                      content_type="application/strategic-merge-patch+json")
        self.record_path.parent.mkdir(parents=True, exist_ok=True)
        self._write()

    def _run(self) -> None:
        self._thread = threading.Thread(target=self._kubelet, name=f"kubelet-{self.name}", daemon=True)
        self._thread.start()

    def stop(self, deadline: float | None = None) -> None:
        """Stop the runtime and the kubelet; the kubelet thread (a daemon, blocked in a watch read until its next
        event) is waited for until `deadline` (monotonic), 5 s from now by default."""
        self._stop.set()
        with self._lock:
            self._close()
        if self._thread is not None:
            self._thread.join(max(0.0, (deadline or time.monotonic() + 5) - time.monotonic()))

    def record(self) -> dict[str, Any]:
        return json.loads(self.record_path.read_text())

    def _close(self) -> None:
        raise NotImplementedError

    def _start(self, pod: dict[str, Any]) -> None:
        raise NotImplementedError

    def _forget(self, key: str) -> None:
        """The pod's containers removed from the runtime (it may have none there)."""
        raise NotImplementedError

    def _placed(self) -> dict[str, dict[str, dict[str, str]]]:
        """"ns/name" -> container -> its "cpuset" and "mems", for every container running now."""
        raise NotImplementedError

    # -- the kubelet stand-in -----------------------------------------------------------------------------

    def _kubelet(self) -> None:
        selector = f"fieldSelector=spec.nodeName={self.name}"
        while not self._stop.is_set():
            try:
                listed = self.api.get(f"/api/v1/pods?{selector}")
                seen = set()
                # HandlePodAdditions: the oldest pod first.
                for pod in sorted(listed["items"], key=lambda p: p["metadata"]["creationTimestamp"]):
                    seen.add(self._key(pod))
                    self._sync(pod, deleted=False)
                for key in set(self.pods) - seen:  # deleted while we were not watching
                    self._sync({"metadata": dict(zip(("namespace", "name"), key.split("/", 1)))}, deleted=True)
                self._watch(selector, listed["metadata"]["resourceVersion"])
            except Exception as exc:
                if self._stop.is_set():
                    return
                self.errors.append(f"{type(exc).__name__}: {exc}")
                time.sleep(0.5)

    def _watch(self, selector: str, version: str) -> None:
        for event in self.api.watch(f"/api/v1/pods?{selector}&watch=1&allowWatchBookmarks=false"
                                    f"&resourceVersion={version}&timeoutSeconds={WATCH_SECONDS}", WATCH_SECONDS + 30):
            if self._stop.is_set() or event["type"] == "ERROR":
                return  # stopped, or a gone resourceVersion: list again
            self._sync(event["object"], deleted=event["type"] == "DELETED")

    @staticmethod
    def _key(pod: dict[str, Any]) -> str:
        return f"{pod['metadata']['namespace']}/{pod['metadata']['name']}"

    def _sync(self, pod: dict[str, Any], deleted: bool) -> None:
        with self._lock:
            if not self._stop.is_set():
                self._sync_locked(pod, deleted)

    def _sync_locked(self, pod: dict[str, Any], deleted: bool) -> None:
        key, meta = self._key(pod), pod["metadata"]
        if deleted or meta.get("deletionTimestamp"):
            self._forget(key)
            if self.pods.pop(key, None) is not None:
                self._write()
            if not deleted:  # the containers are gone: the kubelet finishes the graceful delete
                self.api.call("DELETE", f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}",
                              {"kind": "DeleteOptions", "apiVersion": "v1", "gracePeriodSeconds": 0,
                               "preconditions": {"uid": meta["uid"]}}, ok=(200, 404, 409))
            return
        if key in self.pods or pod.get("status", {}).get("phase") in ("Succeeded", "Failed"):
            return
        self._start(pod)

    def _write(self) -> None:
        placed = self._placed()
        pods = {key: {**entry, "containers": placed.get(key, {})} for key, entry in self.pods.items()}
        record = {"node": self.name, "shape": asdict(self.shape), "pods": pods}
        partial = self.record_path.with_suffix(".partial")
        partial.write_text(json.dumps(record, indent=1))
        os.replace(partial, self.record_path)
        if self.on_record is not None:
            self.on_record(record)

    def _status(self, pod: dict[str, Any], status: dict[str, Any]) -> None:
        meta = pod["metadata"]
        self.api.call("PATCH", f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}/status",
                      {"status": status}, content_type="application/strategic-merge-patch+json", ok=(200, 404))

    def _event(self, pod: dict[str, Any], reason: str, message: str, field: str | None = None) -> None:
        """A Warning event from the kubelet about the pod (or one of its containers, `field`)."""
        meta, now = pod["metadata"], _now()
        self.api.call("POST", f"/api/v1/namespaces/{meta['namespace']}/events", {
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
            "involvedObject": {"kind": "Pod", "apiVersion": "v1", "namespace": meta["namespace"], "name": meta["name"],
                               "uid": meta["uid"], **({"fieldPath": field} if field else {})},
            "reason": reason, "message": message, "type": "Warning", "count": 1,
            "firstTimestamp": now, "lastTimestamp": now, "source": {"component": "kubelet", "host": self.name},
            "reportingComponent": "kubelet", "reportingInstance": self.name})

    def _running(self, pod: dict[str, Any], run: PodRun, started: str) -> None:
        now = _now()
        true = [{"type": t, "status": "True", "lastTransitionTime": now}
                for t in ("PodReadyToStartContainers", "Initialized", "ContainersReady", "Ready")]
        spec = pod["spec"]
        statuses = [{"name": c["name"], "image": c.get("image", ""), "imageID": "", "containerID": f"vnode://{c['name']}",
                     "ready": True, "started": True, "restartCount": 0, "state": {"running": {"startedAt": now}}}
                    for c in spec["containers"]]
        init = [{"name": c["name"], "image": c.get("image", ""), "imageID": "", "restartCount": 0,
                 **({"ready": True, "started": True, "state": {"running": {"startedAt": now}}}
                    if keep else {"ready": True, "state": {"terminated": {"exitCode": 0, "reason": "Completed",
                                                                          "startedAt": started, "finishedAt": now}}})}
                for c, keep in zip(spec.get("initContainers") or (), run.sidecar)]
        self._status(pod, {"phase": "Running", "conditions": true, "hostIP": "127.0.0.1",
                           "hostIPs": [{"ip": "127.0.0.1"}], "startTime": started, "qosClass": run.pod.qos,
                           "containerStatuses": statuses, **({"initContainerStatuses": init} if init else {})})


class VirtualNode(KubeletStandIn):
    """A balloons node: its plugin runs the containers; `stop` ends both (and `start` leaves nothing behind when
    it fails)."""

    def __init__(self, cluster: Cluster, name: str, shape: NodeShape, *, labels: dict[str, str] | None = None,
                 taints: list[dict[str, str]] | None = None,
                 on_record: Callable[[dict[str, Any]], None] | None = None) -> None:
        super().__init__(cluster, name, shape, labels=labels, taints=taints, on_record=on_record)
        self.running: dict[str, PodRun] = {}  # "ns/name" -> what the plugin runs for it
        self.retries: dict[str, threading.Timer] = {}  # "ns/name" -> its next sync after a refused container
        self.peer: BalloonsPeer | None = None
        self.refusals: list[str] = []  # why the plugin exited at start, one per restart

    def start(self, kubeconfig: Path) -> VirtualNode:
        """Register the Node, start its plugin (which reads the node's policy from the cluster) and the kubelet."""
        self._register()
        self.peer = self._plugin(kubeconfig)
        self._run()
        return self

    def _plugin(self, kubeconfig: Path) -> BalloonsPeer:
        """The plugin, restarted as its DaemonSet's kubelet would when it exits refusing a policy: its agent may
        hand it the `default` (or group) policy before the node's own, whose events race in its select, and the
        plugin exits on a first policy that does not fit the node's CPUs."""
        for attempt in range(RESTARTS + 1):
            try:
                return BalloonsPeer(self.shape, node=self.name, kubeconfig=kubeconfig,
                                    log=self.cluster.logs / f"vnode-{self.name}.{attempt}.log")
            except PolicyRefused as refused:
                self.refusals.append(str(refused))
        raise PolicyRefused(f"{self.name}: the plugin refused its policy {RESTARTS + 1} times: {self.refusals}")

    def _close(self) -> None:
        for timer in self.retries.values():
            timer.cancel()
        if self.peer is not None:
            self.peer.close()

    def rss_bytes(self) -> int:
        """Resident memory of the node's plugin process."""
        assert self.peer is not None
        for line in Path(f"/proc/{self.peer.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        return 0

    def _forget(self, key: str) -> None:
        assert self.peer is not None
        timer = self.retries.pop(key, None)
        if timer is not None:
            timer.cancel()
        if key in self.running:
            self.peer.remove_pod(self.running.pop(key).pod)

    def _placed(self) -> dict[str, dict[str, dict[str, str]]]:
        placed: dict[str, dict[str, dict[str, str]]] = {}
        if self.peer is not None:
            for name, p in self.peer.containers().items():
                ns, pod, ctr = name.split("/", 2)
                placed.setdefault(f"{ns}/{pod}", {})[ctr] = {
                    "cpuset": ",".join(map(str, sorted(p.cpus))), "mems": ",".join(map(str, sorted(p.mems)))}
        return placed

    def _start(self, pod: dict[str, Any]) -> None:
        key, meta = self._key(pod), pod["metadata"]
        assert self.peer is not None
        run = peer_pod(pod)
        started = _now()
        results = run_pod(self.peer, run)
        # The kubelet reports the gRPC status's message, without the "rpc error: code = ... desc = " wrapper.
        failed = next(((name, GRPC_WRAPPER.sub("", got.error or "")) for name, got in results.items() if not got.ok),
                      None)
        attempts = self.pods.get(key, {}).get("attempts", 0) + 1
        # The record first: whoever sees the pod's new status through the apiserver finds the record as new.
        if failed is None:
            self.running[key] = run
            self.pods[key] = {"uid": meta["uid"], "phase": "Running", "attempts": attempts}
            self._write()
            self._running(pod, run, started)
            return
        self.peer.remove_pod(run.pod)
        self.pods[key] = {"uid": meta["uid"], "phase": "Pending", "attempts": attempts, "message": failed[1]}
        self._write()
        self._refused(pod, run, failed[0], failed[1])
        delay = BACKOFF_SECONDS * (1 + BACKOFF_JITTER * random.random())
        timer = self.retries[key] = threading.Timer(delay, self._retry, (key, meta["uid"]))
        timer.daemon = True
        timer.start()

    def _retry(self, key: str, uid: str) -> None:
        """The pod worker's next sync: the pod as the apiserver has it now, unless it is gone or going."""
        namespace, name = key.split("/", 1)
        try:
            pod = self.api.call("GET", f"/api/v1/namespaces/{namespace}/pods/{name}", ok=(200, 404))
        except Exception as exc:
            self.errors.append(f"retry of {key}: {type(exc).__name__}: {exc}")
            pod = None
        with self._lock:
            if self._stop.is_set() or self.retries.pop(key, None) is None:
                return
            if pod is None or pod.get("kind") == "Status" or pod["metadata"]["uid"] != uid:
                self._sync_locked({"metadata": {"namespace": namespace, "name": name}}, deleted=True)
            elif pod["metadata"].get("deletionTimestamp"):
                self._sync_locked(pod, deleted=False)
            else:
                self._start(pod)

    def _refused(self, pod: dict[str, Any], run: PodRun, container: str, error: str) -> None:
        now = _now()
        spec = pod["spec"]
        init = [c["name"] for c in spec.get("initContainers") or ()]
        others = "PodInitializing" if container in init else "ContainerCreating"

        def waiting(names: list[str]) -> list[dict[str, Any]]:
            return [{"name": n, "image": "", "imageID": "", "ready": False, "started": False, "restartCount": 0,
                     "state": {"waiting": {"reason": "CreateContainerError", "message": error} if n == container
                               else {"reason": others}}} for n in names]

        not_ready = [{"type": t, "status": "False", "reason": "ContainersNotReady", "lastTransitionTime": now,
                      "message": f"containers with unready status: [{' '.join(c['name'] for c in spec['containers'])}]"}
                     for t in ("ContainersReady", "Ready")]
        self._status(pod, {"phase": "Pending", "hostIP": "127.0.0.1", "hostIPs": [{"ip": "127.0.0.1"}],
                           "startTime": now, "qosClass": run.pod.qos,
                           "containerStatuses": waiting([c["name"] for c in spec["containers"]]),
                           **({"initContainerStatuses": waiting(init)} if init else {}),
                           "conditions": [{"type": "PodScheduled", "status": "True", "lastTransitionTime": now},
                                          *not_ready]})
        self._event(pod, "Failed", f"Error: {error}", f"spec.containers{{{container}}}")

class KubeletStaticNode(KubeletStandIn):
    """A kubelet-static node: the real kubelet's CPU, Topology and Memory Managers and its admission decide each
    pod (`KubeletPeer`, one process for the node's life, with the settings of the node's KubeletConfiguration);
    after each change the podresources API they make is served (`PodResources`) to node-feature-discovery's
    topology-updater, which writes the node's NodeResourceTopology from it and from that configuration file. A
    pod they reject is what kubelet.rejectPod makes of it: a Warning event with the reason, then phase Failed for
    good, with the reason and "Pod was rejected: ..." (a controller replaces it)."""

    def __init__(self, cluster: Cluster, name: str, shape: NodeShape, config: dict[str, Any], *,
                 labels: dict[str, str] | None = None, taints: list[dict[str, str]] | None = None,
                 on_record: Callable[[dict[str, Any]], None] | None = None) -> None:
        super().__init__(cluster, name, shape, labels=labels, taints=taints, on_record=on_record)
        self.config = config  # the node's KubeletConfiguration
        self.peer: KubeletPeer | None = None
        self.admitted: dict[str, tuple[str, dict[str, Placed]]] = {}  # "ns/name" -> its uid, where its containers run
        self.podresources: PodResources | None = None
        self.updater: Component | None = None

    def start(self, updaters: TopologyUpdaters) -> KubeletStaticNode:
        """Start the kubelet's managers, register the Node with what they reserve, serve podresources, start the
        node's topology-updater and the kubelet stand-in."""
        settings = kubelet_settings(self.config)
        self.peer = KubeletPeer()
        started = self.peer.start(self.shape, settings)
        if not started.ok:
            raise AssertionError(f"{self.name}: the kubelet would not start with {self.config}: {started.error}")
        self._register(len(started.reserved), settings["memoryReservation"])
        socket = self.cluster.root / "nrt" / f"{self.name}.sock"
        socket.parent.mkdir(parents=True, exist_ok=True)
        self.podresources = PodResources(socket, self.cluster.logs / f"podresources-{self.name}.log")
        self._publish()
        self.updater = updaters.start(self.name, self.shape, self.config, socket)
        self._run()
        return self

    def _close(self) -> None:
        if self.updater is not None:
            self.cluster.components.pop(self.updater.name, None)
            self.updater.stop()
        if self.podresources is not None:
            self.podresources.close()
        if self.peer is not None:
            self.peer.close()

    def _publish(self) -> None:
        assert self.peer is not None and self.podresources is not None
        self.podresources.set(self.peer.podresources_answer())

    def _start(self, pod: dict[str, Any]) -> None:
        key, meta = self._key(pod), pod["metadata"]
        assert self.peer is not None
        started = _now()
        verdict = self.peer.add(pod)
        run = peer_pod(pod)
        # The record first: whoever sees the pod's new status through the apiserver finds the record as new.
        if verdict.admit:
            self.admitted[key] = (meta["uid"], dict(verdict.containers))
            self.pods[key] = {"uid": meta["uid"], "phase": "Running"}
            self._write()
            self._publish()
            self._running(pod, run, started)
            return
        reason, message = verdict.reason or "", verdict.message or ""
        self.pods[key] = {"uid": meta["uid"], "phase": "Failed", "reason": reason, "message": message}
        self._write()
        self._event(pod, reason, message.removeprefix(REJECTED))
        self._status(pod, {"phase": "Failed", "reason": reason, "message": message, "qosClass": run.pod.qos})

    def _forget(self, key: str) -> None:
        assert self.peer is not None
        admitted = self.admitted.pop(key, None)
        if admitted is not None:
            self.peer.remove(admitted[0])
            self._publish()

    def _placed(self) -> dict[str, dict[str, dict[str, str]]]:
        return {key: {name: {"cpuset": ",".join(map(str, sorted(p.cpus))), "mems": ",".join(map(str, p.memory_numa))}
                      for name, p in containers.items()} for key, (_, containers) in self.admitted.items()}


def kubelet_settings(config: dict[str, Any]) -> dict[str, Any]:
    """The kubelet driver's settings (tests/peers/kube/kubelet.go) for a KubeletConfiguration: the reserved CPU
    quantity and memory summed as the kubelet sums them for allocatable (kube- plus system-reserved, plus the hard
    eviction threshold, 100Mi when the configuration sets none)."""
    reserved = [config.get(k) or {} for k in ("kubeReserved", "systemReserved")]
    eviction = (config.get("evictionHard") or {}).get("memory.available", "100Mi")
    return {"reservedSystemCPUs": config.get("reservedSystemCPUs", ""),
            "reservedCPUs": f"{sum(cpu_milli(r.get('cpu', '0')) for r in reserved)}m",
            "cpuManagerPolicyOptions": config.get("cpuManagerPolicyOptions") or {},
            "topologyManagerPolicy": config.get("topologyManagerPolicy", "none"),
            "topologyManagerScope": config.get("topologyManagerScope", "container"),
            "topologyManagerPolicyOptions": config.get("topologyManagerPolicyOptions") or {},
            "memoryManagerPolicy": config.get("memoryManagerPolicy", "None"),
            "memoryReservation": sum(memory_bytes(r.get("memory", "0")) for r in reserved) + memory_bytes(eviction)}


def start_fleet(cluster: Cluster, nodes: list[tuple[str, NodeShape, dict[str, str]]],
                taints: list[dict[str, str]] | None = None,
                on_record: Callable[[dict[str, Any]], None] | None = None) -> list[VirtualNode]:
    """Virtual nodes for (name, shape, labels); their policies must be in the cluster first (the plugin waits
    for one). All are stopped again if any fails to start."""
    kubeconfig = install_plugin_rbac(cluster)
    return _started(cluster, [lambda n=n: VirtualNode(cluster, n[0], n[1], labels=n[2], taints=taints,
                                                      on_record=on_record).start(kubeconfig) for n in nodes])


def start_kubelet_fleet(cluster: Cluster, nodes: list[tuple[str, NodeShape, dict[str, Any], dict[str, str]]],
                        taints: list[dict[str, str]] | None = None,
                        on_record: Callable[[dict[str, Any]], None] | None = None,
                        update_interval: str = "1s") -> list[KubeletStaticNode]:
    """Kubelet-static nodes for (name, shape, KubeletConfiguration, labels), each with NFD's topology-updater
    (installed here, rewriting the NRT every `update_interval`). All are stopped again if any fails to start."""
    updaters = install_topology_updaters(cluster, update_interval)
    return _started(cluster, [lambda n=n: KubeletStaticNode(cluster, n[0], n[1], n[2], labels=n[3], taints=taints,
                                                            on_record=on_record).start(updaters) for n in nodes])


StandIn = TypeVar("StandIn", bound=KubeletStandIn)


def _started(cluster: Cluster, starts: list[Callable[[], StandIn]]) -> list[StandIn]:
    fleet: list[StandIn] = []
    try:
        for start in starts:
            fleet.append(start())
    except BaseException:
        stop_fleet(cluster, fleet)
        raise
    return fleet


def stop_fleet(cluster: Cluster, fleet: Sequence[KubeletStandIn]) -> None:
    """Every node stopped within one 5 s wait for the kubelet threads (not 5 s each), the Nodes deleted at once."""
    deadline = time.monotonic() + 5
    for vnode in fleet:
        vnode.stop(deadline)
    if fleet:
        cluster.kubectl("delete", "node", *(v.name for v in fleet), "--wait=false", check=False)
