"""The webhook and the extender every e2e test talks to are our image (tests/e2e/conftest.py), run as the chart runs
them against the real control plane: held here to the chart's user, read-only root, capabilities, mounts and args,
`--in-cluster` through the ServiceAccount token where a pod has it, and to the SIGTERM drain."""

from __future__ import annotations

import json

from tests.e2e.cluster import OURS, Cluster, ContainerComponent
from tests.image.build import image, podman
from tests.support.chart import SERVICE_ACCOUNT


def test_our_servers_are_the_image_run_as_the_chart_runs_them(cluster: Cluster) -> None:
    for which, (deployment, name, _) in OURS.items():
        comp = cluster.components[which]
        assert isinstance(comp, ContainerComponent), f"the {which} is not running from the image"
        info = json.loads(podman("inspect", comp.container).stdout)[0]
        spec = cluster.container(deployment, name)
        context = {**cluster.pod_spec(deployment)["securityContext"], **spec["securityContext"]}
        assert info["ImageName"] == image() and info["State"]["Running"]
        assert info["Config"]["User"] == f"{context['runAsUser']}:{context['runAsGroup']}"
        assert info["HostConfig"]["ReadonlyRootfs"] and not info["EffectiveCaps"]
        assert info["HostConfig"]["NetworkMode"] == "host"
        # The chart's args, `--in-cluster` and the mounted paths as they are; only the listening address differs.
        assert info["Config"]["Cmd"] == cluster.local_args(spec["args"], {}, None, cluster.ports[which])
        assert "--in-cluster" in info["Config"]["Cmd"]
        volumes = {v["name"]: v for v in cluster.pod_spec(deployment)["volumes"]}
        assert {m["Destination"]: m["RW"] for m in info["Mounts"]} == {SERVICE_ACCOUNT: False, **{
            m["mountPath"]: not m.get("readOnly") for m in spec["volumeMounts"]
            if "emptyDir" not in volumes[m["name"]]}}


def test_sigterm_drains_each_server_which_exits_0_and_comes_back(cluster: Cluster) -> None:
    for which, (deployment, _, _) in OURS.items():
        comp = cluster.components[which]
        since = len(comp.log.read_text(errors="replace").splitlines())
        assert comp.stop(cluster.pod_spec(deployment)["terminationGracePeriodSeconds"]) == 0, comp.tail()
        said = []
        for line in comp.log.read_text(errors="replace").splitlines()[since:]:
            try:
                said.append(json.loads(line)["msg"])
            except ValueError:
                said.append(line)  # podman's own words, or a traceback
        assert said[-1] == "stopped" and "draining: readiness is false, finishing in-flight requests" in said, said
        comp.start()
        cluster.wait_ready(which)
