"""The chart's objects as helm rendered them, and what a kubelet makes of one of our containers: its ConfigMap and
Secret volumes as files (mode and group as the kubelet sets them), and, to run our image, the `podman run` that
gives the container the pod's user, read-only root, capabilities, mounts and limits."""

from __future__ import annotations

import base64
import os
from pathlib import Path
from typing import Any

from tests.image.build import OWNER

# Where a pod's ServiceAccount token, CA and namespace are mounted; `--in-cluster` reads them there.
SERVICE_ACCOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"

Obj = dict[str, Any]


def _bytes(quantity: str) -> str:
    """A Kubernetes memory quantity (1Gi, 64Mi) as podman's binary units take it (1g, 64m)."""
    return quantity.replace("Gi", "g").replace("Mi", "m").replace("Ki", "k")


class Rendered:
    def __init__(self, rendered: list[Obj], root: Path) -> None:
        self.rendered = rendered
        self.root = root  # the materialized volumes go under root/volumes

    def find(self, kind: str, name: str | None = None) -> Obj:
        for doc in self.rendered:
            if doc["kind"] == kind and (name is None or doc["metadata"]["name"].startswith(name)):
                return doc
        raise AssertionError(f"the installed objects have no {kind} {name or ''}")

    def pod_spec(self, deployment: str) -> Obj:
        return self.find("Deployment", deployment)["spec"]["template"]["spec"]  # type: ignore[no-any-return]

    def container(self, deployment: str, name: str) -> Obj:
        for c in self.pod_spec(deployment)["containers"]:
            if c["name"] == name:
                return c  # type: ignore[no-any-return]
        raise AssertionError(f"Deployment {deployment} has no container {name}")

    def env(self, deployment: str, container: Obj) -> dict[str, str]:
        """The container's environment; a fieldRef (its POD_NAMESPACE) is the Deployment's namespace."""
        namespace = self.find("Deployment", deployment)["metadata"]["namespace"]
        return {e["name"]: e.get("value", namespace if "fieldRef" in e.get("valueFrom", {}) else "")
                for e in container.get("env", [])}

    def materialize_volumes(self, deployment: str, container: Obj) -> dict[str, Path]:
        """Each mounted ConfigMap/Secret volume written to a local dir, as the kubelet would (the volume's
        defaultMode, group fsGroup where root may give it): mountPath -> dir."""
        spec = self.pod_spec(deployment)
        volumes = {v["name"]: v for v in spec["volumes"]}
        group = spec.get("securityContext", {}).get("fsGroup")
        mounts: dict[str, Path] = {}
        for mount in container.get("volumeMounts", []):
            vol = volumes[mount["name"]]
            local = self.root / "volumes" / deployment / mount["name"]
            local.mkdir(parents=True, exist_ok=True)
            if "configMap" in vol:
                files = {k: v.encode() for k, v in self.find("ConfigMap", vol["configMap"]["name"])["data"].items()}
                mode = vol["configMap"].get("defaultMode", 0o644)
            elif "secret" in vol:
                files = {k: base64.b64decode(v)
                         for k, v in self.find("Secret", vol["secret"]["secretName"])["data"].items()}
                mode = vol["secret"].get("defaultMode", 0o644)
            else:
                files, mode = {}, 0
            for key, value in files.items():
                (local / key).write_bytes(value)
                (local / key).chmod(mode)
                if group is not None and os.geteuid() == 0:
                    os.chown(local / key, -1, group)
            mounts[mount["mountPath"]] = local
        return mounts

    def podman_run(self, deployment: str, container: Obj, image: str, args: list[str], *, name: str,
                   network: str, mounts: dict[str, Path], env: dict[str, str] | None = None,
                   extra: tuple[str, ...] = ()) -> list[str]:
        """`podman run` of `image` as the kubelet runs `container` of `deployment`: its pod's and its own
        securityContext (user, group, fsGroup, read-only root, capabilities, no privilege escalation), its
        resource limits, `mounts` (mountPath -> local dir, as `materialize_volumes` wrote them) read-only where
        the container mounts them so, its emptyDir volumes as tmpfs of their sizeLimit, its environment and `env`;
        `args` in place of its args (the caller says what it rewrote)."""
        spec = self.pod_spec(deployment)
        context = {**spec.get("securityContext", {}), **container.get("securityContext", {})}
        argv = ["podman", "run", "--rm", f"--name={name}", f"--label={OWNER}={os.getpid()}", f"--network={network}",
                f"--user={context['runAsUser']}:{context['runAsGroup']}", *extra]
        if "fsGroup" in context:
            argv.append(f"--group-add={context['fsGroup']}")
        if context.get("readOnlyRootFilesystem"):
            argv += ["--read-only", "--read-only-tmpfs=false"]  # a pod has no writable /run or /var/tmp either
        argv += [f"--cap-drop={cap}" for cap in context.get("capabilities", {}).get("drop", [])]
        argv += [f"--cap-add={cap}" for cap in context.get("capabilities", {}).get("add", [])]
        if context.get("allowPrivilegeEscalation") is False:
            argv.append("--security-opt=no-new-privileges")
        limits = container.get("resources", {}).get("limits", {})
        if "memory" in limits:
            argv.append(f"--memory={_bytes(limits['memory'])}")
        if "cpu" in limits:
            argv.append(f"--cpus={limits['cpu']}")
        volumes = {v["name"]: v for v in spec["volumes"]}
        declared = {m["mountPath"]: m for m in container.get("volumeMounts", [])}
        for path, mount in declared.items():
            empty = volumes[mount["name"]].get("emptyDir")
            if empty is not None:
                size = f",size={_bytes(empty['sizeLimit'])}" if "sizeLimit" in empty else ""
                argv.append(f"--tmpfs={path}:rw,mode=1777{size}")
        for path, local in mounts.items():
            if path not in declared:  # the ServiceAccount's token: the kubelet mounts it read-only
                argv.append(f"--volume={local}:{path}:ro")
            elif "emptyDir" not in volumes[declared[path]["name"]]:
                argv.append(f"--volume={local}:{path}:{'ro' if declared[path].get('readOnly') else 'rw'}")
        argv += [f"--env={key}={value}" for key, value in {**self.env(deployment, container), **(env or {})}.items()]
        return [*argv, image, *args]
