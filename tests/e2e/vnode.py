"""Virtual nodes: behind a Node object of the e2e control plane, the real balloons plugin and a kubelet stand-in.

Per node, one `tests/peers/balloons` process in agent mode on a synthetic sysfs of the node's shape
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
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from tests.e2e.cluster import Api, Cluster
from tests.oracle.kubelet import PodRun, peer_pod, run_pod
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


def node_status(shape: NodeShape) -> dict[str, Any]:
    """What the kubelet posts: capacity from the machine, allocatable the same (no kube-/system-reserved is
    configured here), the four conditions with the kubelet's reasons, its address and versions."""
    now = _now()
    capacity = {"cpu": str(shape.cpus), "memory": f"{shape.memory_gib_per_numa * shape.numa_nodes}Gi",
                "pods": "110", "ephemeral-storage": "500Gi", "hugepages-1Gi": "0", "hugepages-2Mi": "0"}
    pressure = [("MemoryPressure", "KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
                ("DiskPressure", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
                ("PIDPressure", "KubeletHasSufficientPID", "kubelet has sufficient PID available")]
    conditions = [{"type": t, "status": "False", "reason": r, "message": m, "lastHeartbeatTime": now,
                   "lastTransitionTime": now} for t, r, m in pressure]
    conditions.append({"type": "Ready", "status": "True", "reason": "KubeletReady",
                       "message": "kubelet is posting ready status", "lastHeartbeatTime": now,
                       "lastTransitionTime": now})
    return {"capacity": capacity, "allocatable": dict(capacity), "conditions": conditions,
            "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}, {"type": "Hostname", "address": "vnode"}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {"architecture": "amd64", "operatingSystem": "linux", "kubeletVersion": "v1.35.4",
                         "containerRuntimeVersion": "containerd://2.1.0", "kernelVersion": "6.8.0",
                         "osImage": "Ubuntu 24.04", "kubeProxyVersion": "", "machineID": "", "systemUUID": "",
                         "bootID": ""}}


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


class VirtualNode:
    """One Node, its plugin and its kubelet stand-in; `stop` ends both (and `start` leaves nothing behind when
    it fails)."""

    def __init__(self, cluster: Cluster, name: str, shape: NodeShape, *, labels: dict[str, str] | None = None,
                 taints: list[dict[str, str]] | None = None,
                 on_record: Callable[[dict[str, Any]], None] | None = None) -> None:
        self.cluster, self.name, self.shape, self.on_record = cluster, name, shape, on_record
        self.labels, self.taints = labels or {}, taints or []
        # Its own client: a watch holds a connection for the node's life.
        self.api = Api(cluster.server, cluster.pki / "ca.crt", cluster.api.auth["Authorization"].split()[1])
        self.record_path = cluster.root / "vnodes" / f"{name}.json"
        self.pods: dict[str, dict[str, Any]] = {}  # "ns/name" -> its record entry
        self.running: dict[str, PodRun] = {}  # "ns/name" -> what the plugin runs for it
        self.retries: dict[str, threading.Timer] = {}  # "ns/name" -> its next sync after a refused container
        self.peer: BalloonsPeer | None = None
        # The plugin speaks one request at a time; the watch and the back-off timers take turns.
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.refusals: list[str] = []  # why the plugin exited at start, one per restart
        self.errors: list[str] = []  # what went wrong in the kubelet thread, for a test to show

    # -- life -------------------------------------------------------------------------------------------

    def start(self, kubeconfig: Path) -> VirtualNode:
        """Register the Node, start its plugin (which reads the node's policy from the cluster) and the kubelet."""
        self.api.call("POST", "/api/v1/nodes", node_object(self.name, self.shape, self.labels, self.taints))
        self.api.call("PATCH", f"/api/v1/nodes/{self.name}/status", {"status": node_status(self.shape)},
                      content_type="application/strategic-merge-patch+json")
        self.record_path.parent.mkdir(parents=True, exist_ok=True)
        self._write()
        self.peer = self._plugin(kubeconfig)
        self._thread = threading.Thread(target=self._kubelet, name=f"kubelet-{self.name}", daemon=True)
        self._thread.start()
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

    def stop(self, deadline: float | None = None) -> None:
        """Stop the plugin and the kubelet; the kubelet thread (a daemon, blocked in a watch read until its next
        event) is waited for until `deadline` (monotonic), 5 s from now by default."""
        self._stop.set()
        with self._lock:
            for timer in self.retries.values():
                timer.cancel()
        if self.peer is not None:
            self.peer.close()
        if self._thread is not None:
            self._thread.join(max(0.0, (deadline or time.monotonic() + 5) - time.monotonic()))

    def rss_bytes(self) -> int:
        """Resident memory of the node's plugin process."""
        assert self.peer is not None
        for line in Path(f"/proc/{self.peer.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        return 0

    def record(self) -> dict[str, Any]:
        return json.loads(self.record_path.read_text())

    # -- the kubelet stand-in -----------------------------------------------------------------------------

    def _kubelet(self) -> None:
        selector = f"fieldSelector=spec.nodeName={self.name}"
        while not self._stop.is_set():
            try:
                listed = self.api.get(f"/api/v1/pods?{selector}")
                seen = set()
                for pod in listed["items"]:
                    seen.add(self._key(pod))
                    self._sync(pod, deleted=False)
                for key in set(self.running) - seen:  # deleted while we were not watching
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
            self._sync_locked(pod, deleted)

    def _sync_locked(self, pod: dict[str, Any], deleted: bool) -> None:
        key, meta = self._key(pod), pod["metadata"]
        assert self.peer is not None
        if deleted or meta.get("deletionTimestamp"):
            timer = self.retries.pop(key, None)
            if timer is not None:
                timer.cancel()
            if key in self.running:
                self.peer.remove_pod(self.running.pop(key).pod)
            if self.pods.pop(key, None) is not None:
                self._write()
            if not deleted:  # the containers are gone: the kubelet finishes the graceful delete
                self.api.call("DELETE", f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}",
                              {"kind": "DeleteOptions", "apiVersion": "v1", "gracePeriodSeconds": 0,
                               "preconditions": {"uid": meta["uid"]}}, ok=(200, 404, 409))
            return
        if key in self.running or key in self.retries or pod.get("status", {}).get("phase") in ("Succeeded", "Failed"):
            return
        self._start(pod)

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

    def _write(self) -> None:
        placed: dict[str, dict[str, dict[str, str]]] = {}
        if self.peer is not None:
            for name, p in self.peer.containers().items():
                ns, pod, ctr = name.split("/", 2)
                placed.setdefault(f"{ns}/{pod}", {})[ctr] = {
                    "cpuset": ",".join(map(str, sorted(p.cpus))), "mems": ",".join(map(str, sorted(p.mems)))}
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

    def _refused(self, pod: dict[str, Any], run: PodRun, container: str, error: str) -> None:
        meta, now = pod["metadata"], _now()
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
        self.api.call("POST", f"/api/v1/namespaces/{meta['namespace']}/events", {
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
            "involvedObject": {"kind": "Pod", "apiVersion": "v1", "namespace": meta["namespace"], "name": meta["name"],
                               "uid": meta["uid"], "fieldPath": f"spec.containers{{{container}}}"},
            "reason": "Failed", "message": f"Error: {error}", "type": "Warning", "count": 1,
            "firstTimestamp": now, "lastTimestamp": now, "source": {"component": "kubelet", "host": self.name},
            "reportingComponent": "kubelet", "reportingInstance": self.name})


def start_fleet(cluster: Cluster, nodes: list[tuple[str, NodeShape, dict[str, str]]],
                taints: list[dict[str, str]] | None = None,
                on_record: Callable[[dict[str, Any]], None] | None = None) -> list[VirtualNode]:
    """Virtual nodes for (name, shape, labels); their policies must be in the cluster first (the plugin waits
    for one). All are stopped again if any fails to start."""
    kubeconfig = install_plugin_rbac(cluster)
    fleet: list[VirtualNode] = []
    try:
        for name, shape, labels in nodes:
            fleet.append(VirtualNode(cluster, name, shape, labels=labels, taints=taints,
                                     on_record=on_record).start(kubeconfig))
    except BaseException:
        stop_fleet(cluster, fleet)
        raise
    return fleet


def stop_fleet(cluster: Cluster, fleet: list[VirtualNode]) -> None:
    """Every node stopped within one 5 s wait for the kubelet threads (not 5 s each), the Nodes deleted at once."""
    deadline = time.monotonic() + 5
    for vnode in fleet:
        vnode.stop(deadline)
    if fleet:
        cluster.kubectl("delete", "node", *(v.name for v in fleet), "--wait=false", check=False)
