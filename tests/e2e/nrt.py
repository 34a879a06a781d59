"""The NodeResourceTopology pipeline of a kubelet-static node, run with the real peers built from tests/peers/nrt.

- `PodResources`: the kubelet's podresources API (v1 `List`, `GetAllocatableResources`, `Get`) on a unix socket,
  served by the kubelet v1.35.4's own server code from the state it is told (`set`), in the JSON the kubelet
  driver's `podresources` op answers (see tests/peers/nrt/podresources.go).
- `TopologyUpdaters`: node-feature-discovery's nfd-topology-updater v0.19.0, one process per node, with the
  ServiceAccount, RBAC, args and env its DaemonSet gets from NFD's own Helm chart of that release (rendered by the
  real helm: `install_topology_updaters`). Rewritten only where there is no pod: the in-cluster config becomes the
  ServiceAccount's token in a kubeconfig (`-kubeconfig`), each hostPath/ConfigMap mount becomes a file of the
  node's directory, NODE_NAME is the node, KUBERNETES_NAMESPACE stands for the ServiceAccount's namespace file
  (NFD names that Namespace as the NRT's owner), and `-port` is a free port (NFD serves /healthz and /metrics on
  every address; it has no flag for one). The host's /sys is the node's synthetic sysfs
  (tests/oracle/sysfs.py) in the process's working directory (the binary's hostpath prefix is
  /proc/self/cwd/host/).
  Values chosen for the chart: the kubelet configuration read from a file (`kubeletConfigPath`), not /configz;
  no kubelet state directory to watch (`kubeletStateDir` empty: there are no checkpoint files here, so updates
  come every `updateInterval` rather than on each CPU manager checkpoint write); pods fingerprint on (default).
- `start_nrt_scheduler`: kube-scheduler v1.35.4 with NodeResourceTopologyMatch as a secondary scheduler
  (`topo-aware-scheduler`), tests/e2e/nrt-scheduler/config.yaml, running as the ServiceAccount of
  tests/e2e/nrt-scheduler/rbac.yaml.

The NodeResourceTopology CRD is the one `Cluster.install` applies (nri-plugins v0.14.0's copy of the
topology.node.k8s.io v1alpha2 API the updater writes and the plugin reads).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tests.e2e.cluster import LOOPBACK, Cluster, Component, free_port
from tests.oracle.sysfs import NodeShape, write_sysfs
from tests.peers.build import build, module_source

NFD = "sigs.k8s.io/node-feature-discovery"
NFD_CHART = "deployment/helm/node-feature-discovery"
NFD_NAMESPACE = "node-feature-discovery"
NFD_RELEASE = "nfd"
UPDATER_TEMPLATES = ("serviceaccount", "clusterrole", "clusterrolebinding", "topologyupdater",
                     "nfd-topologyupdater-conf")
KUBELET_CONFIG = "/var/lib/kubelet/config.yaml"  # where a kubeadm node keeps it; the chart mounts it from there
HOST_PREFIX = "host"  # tests/peers/nrt/ldflags: hostpath.pathPrefix=/proc/self/cwd/host/
SCHEDULER_DIR = Path(__file__).resolve().parent / "nrt-scheduler"
SCHEDULER_NAME = "topo-aware-scheduler"
SCHEDULER_NAMESPACE = "kube-system"


_M64 = (1 << 64) - 1
_P1, _P2, _P3, _P4, _P5 = (0x9E3779B185EBCA87, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9, 0x85EBCA77C2B2AE63,
                           0x27D4EB2F165667C5)


def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (64 - r))) & _M64


def _round(acc: int, lane: int) -> int:
    return (_rotl((acc + lane * _P2) & _M64, 31) * _P1) & _M64


def _xxh64(data: bytes, seed: int = 0) -> int:
    """XXH64 (the xxHash spec; cespare/xxhash/v2 in Go)."""
    n, i = len(data), 0
    if n >= 32:
        v = [(seed + _P1 + _P2) & _M64, (seed + _P2) & _M64, seed, (seed - _P1) & _M64]
        while i + 32 <= n:
            for j in range(4):
                v[j] = _round(v[j], int.from_bytes(data[i:i + 8], "little"))
                i += 8
        h = (_rotl(v[0], 1) + _rotl(v[1], 7) + _rotl(v[2], 12) + _rotl(v[3], 18)) & _M64
        for lane in v:
            h = ((h ^ _round(0, lane)) * _P1 + _P4) & _M64
    else:
        h = (seed + _P5) & _M64
    h = (h + n) & _M64
    while i + 8 <= n:
        h = (_rotl(h ^ _round(0, int.from_bytes(data[i:i + 8], "little")), 27) * _P1 + _P4) & _M64
        i += 8
    if i + 4 <= n:
        h = (_rotl(h ^ (int.from_bytes(data[i:i + 4], "little") * _P1 & _M64), 23) * _P2 + _P3) & _M64
        i += 4
    for byte in data[i:]:
        h = (_rotl(h ^ (byte * _P5 & _M64), 11) * _P1) & _M64
    h = ((h ^ (h >> 33)) * _P2) & _M64
    h = ((h ^ (h >> 29)) * _P3) & _M64
    return h ^ (h >> 32)


def pods_fingerprint(pods: Iterable[tuple[str, str]]) -> str:
    """The `nodeTopologyPodsFingerprint` of a set of pods (namespace, name), as podfingerprint v0.3.0 signs it
    (NFD writes it, the scheduler's cache recomputes it): each pod hashed as XXH64(name) seeded with
    XXH64(namespace), the sorted hashes hashed again as little-endian words."""
    hashes = sorted(_xxh64(name.encode(), _xxh64(namespace.encode())) for namespace, name in pods)
    return f"pfp0v001{_xxh64(b''.join(h.to_bytes(8, 'little') for h in hashes)):016x}"


def node_resource_topology(cluster: Cluster, name: str) -> dict[str, Any] | None:
    """The node's NodeResourceTopology; None while there is none."""
    got = cluster.api.call("GET", f"/apis/topology.node.k8s.io/v1alpha2/noderesourcetopologies/{name}",
                           ok=(200, 404))
    return got if got.get("kind") == "NodeResourceTopology" else None


def nrt_binary() -> str:
    return str(build("nrt"))


class PodResources:
    """`nrt podresources` on `socket`: `set(state)` replaces what the kubelet's API serves; the socket exists
    once the first state is accepted."""

    def __init__(self, socket: Path, log: Path) -> None:
        self.socket = socket
        with open(log, "ab") as err:  # the child keeps its own copy of the descriptor
            self.proc = subprocess.Popen([nrt_binary(), "podresources", f"-socket={socket}"], stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, stderr=err, start_new_session=True)

    def set(self, state: dict[str, Any]) -> None:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(state).encode() + b"\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise AssertionError(f"podresources on {self.socket} exited ({self.proc.wait(5)}) before answering")
        answer = json.loads(line)
        if not answer.get("ok"):
            raise AssertionError(f"podresources on {self.socket} refused the state: {answer.get('error')}")

    def close(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()  # end of stdin: it stops serving and removes the socket
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


def _render_nfd(update_interval: str) -> list[dict[str, Any]]:
    shows = [arg for t in UPDATER_TEMPLATES for arg in ("--show-only", f"templates/{t}.yaml")]
    values = {"master.enable": "false", "worker.enable": "false", "gc.enable": "false",
              "topologyUpdater.enable": "true", "topologyUpdater.kubeletConfigPath": KUBELET_CONFIG,
              "topologyUpdater.kubeletStateDir": "", "topologyUpdater.updateInterval": update_interval}
    sets = [arg for key, value in values.items() for arg in ("--set", f"{key}={value}")]
    rendered = subprocess.run([str(build("helm")), "template", NFD_RELEASE, str(module_source("nrt", NFD) / NFD_CHART),
                               "--namespace", NFD_NAMESPACE, *sets, *shows], capture_output=True, text=True,
                              timeout=120)
    if rendered.returncode != 0:
        raise AssertionError(f"helm template of NFD's chart failed:\n{rendered.stderr}")
    return [d for d in yaml.safe_load_all(rendered.stdout) if d]


@dataclass
class TopologyUpdaters:
    """NFD's topology-updater DaemonSet as rendered (its pod template's one container and volumes), and the
    kubeconfig of its ServiceAccount; `start` runs its pod for one node."""

    cluster: Cluster
    container: dict[str, Any]
    volumes: dict[str, dict[str, Any]]
    config: dict[str, str]  # the updater's ConfigMap data
    kubeconfig: Path

    def start(self, node: str, shape: NodeShape, kubelet_config: dict[str, Any], socket: Path) -> Component:
        """The updater of `node`: its sysfs is `shape`'s, its kubelet configuration file `kubelet_config`
        (a KubeletConfiguration), its podresources socket `socket` (served by a `PodResources`)."""
        here = self.cluster.root / "nrt" / node
        if here.exists():
            shutil.rmtree(here)
        here.mkdir(parents=True)
        write_sysfs(here / HOST_PREFIX, shape)
        local: dict[str, Path] = {}  # mountPath -> what the node's directory holds there
        for mount in self.container["volumeMounts"]:
            volume = self.volumes[mount["name"]]
            if "configMap" in volume:
                conf = here / "conf"
                conf.mkdir()
                for item in volume["configMap"]["items"]:
                    (conf / item["path"]).write_text(self.config[item["key"]])
                local[mount["mountPath"]] = conf
            elif volume["hostPath"]["path"] == "/sys":
                local[mount["mountPath"]] = here / HOST_PREFIX / "sys"
            elif volume["hostPath"]["path"].endswith("/pod-resources/kubelet.sock"):
                local[mount["mountPath"]] = socket
            elif volume["hostPath"]["path"] == KUBELET_CONFIG:
                local[mount["mountPath"]] = here / "kubelet-config.yaml"
                local[mount["mountPath"]].write_text(yaml.safe_dump(kubelet_config))
            else:
                raise AssertionError(f"NFD's chart mounts {volume} at {mount['mountPath']}, which no node here has")
        args = [self._local(arg, local) for arg in self.container["args"]]
        if not any(arg.startswith("-config=") for arg in args):
            # Its default -config path is where the pod mounts the ConfigMap.
            default = Path("/etc/kubernetes/node-feature-discovery/nfd-topology-updater.conf")
            args.append(f"-config={local[str(default.parent)] / default.name}")
        args = [f"-port={free_port()}" if arg.startswith("-port=") else arg for arg in args]
        env = {e["name"]: node if e["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName" else LOOPBACK
               for e in self.container["env"]}
        env["KUBERNETES_NAMESPACE"] = NFD_NAMESPACE
        comp = Component(f"nfd-topology-updater-{node}", [nrt_binary(), "nfd-topology-updater",
                                                          f"-kubeconfig={self.kubeconfig}", *args],
                         self.cluster.logs / f"nfd-topology-updater-{node}.log", env, cwd=here)
        self.cluster.components[comp.name] = comp
        return comp.start()

    @staticmethod
    def _local(arg: str, local: dict[str, Path]) -> str:
        flag, eq, value = arg.partition("=")
        for mount, path in local.items():
            for scheme in ("", "file://"):
                if eq and value.startswith(scheme + mount):
                    return f"{flag}={scheme}{path}{value[len(scheme + mount):]}"
        return arg


def install_topology_updaters(cluster: Cluster, update_interval: str = "1s") -> TopologyUpdaters:
    """NFD's Namespace, the topology-updater's ServiceAccount, ClusterRole and binding as NFD's chart renders
    them, applied; the DaemonSet's pod template to run per node."""
    docs = _render_nfd(update_interval)
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump({"apiVersion": "v1", "kind": "Namespace",
                                                             "metadata": {"name": NFD_NAMESPACE}}))
    rbac = [d for d in docs if d["kind"] in ("ServiceAccount", "ClusterRole", "ClusterRoleBinding")]
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(rbac))
    daemonset = next(d for d in docs if d["kind"] == "DaemonSet")
    pod = daemonset["spec"]["template"]["spec"]
    config = next(d for d in docs if d["kind"] == "ConfigMap")["data"]
    return TopologyUpdaters(cluster, pod["containers"][0], {v["name"]: v for v in pod["volumes"]}, config,
                            cluster.service_account_kubeconfig(pod["serviceAccountName"], NFD_NAMESPACE))


def start_nrt_scheduler(cluster: Cluster) -> Component:
    """kube-scheduler with NodeResourceTopologyMatch (tests/e2e/nrt-scheduler), as its ServiceAccount. Start it
    after every node's NRT exists: its cache ignores NRTs created later (scheduler-plugins#967)."""
    cluster.kubectl("apply", "-f", str(SCHEDULER_DIR / "rbac.yaml"))
    config = yaml.safe_load((SCHEDULER_DIR / "config.yaml").read_text())
    config["clientConnection"] = {"kubeconfig": str(cluster.service_account_kubeconfig(SCHEDULER_NAME,
                                                                                          SCHEDULER_NAMESPACE))}
    path = cluster.root / "nrt-scheduler.yaml"
    path.write_text(yaml.safe_dump(config))
    cluster.ports["nrt-scheduler"] = free_port()
    return cluster._component("nrt-scheduler", [f"--config={path}", "--v=2", f"--bind-address={LOOPBACK}",
                                                f"--secure-port={cluster.ports['nrt-scheduler']}"],
                              argv0=[nrt_binary(), "kube-scheduler"])

