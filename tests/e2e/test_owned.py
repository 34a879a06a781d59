"""Only model-placement writes where a pod sits (issue 42), against the real apiserver running the install's
ValidatingAdmissionPolicies: our own bind writes the placement and the ledger holds the pod there; `kubectl annotate
--overwrite` on that running pod, a patch (and a status patch, and a Binding) by another ServiceAccount, and `kubectl
apply` of a pod carrying a placement each get the documented answer, and the extender's ledger of the node does not
move. A pod that is no model pod may not carry a model balloon type, unless its namespace is exempted."""

from __future__ import annotations

import json
from typing import Any

import yaml

from placement.demand import BALLOON_PREFIX
from placement.ledger import PLACEMENT, Placed
from tests.e2e.cluster import Cluster, node, wait_until
from tests.e2e.fleet import MODEL_NS, POOL, model_pod
from tests.e2e.test_placement import debug_node, held_numa

NODE = "owned-0"
TENANT = "tenant"
SELECTOR = {POOL: "owned"}
OWNED = "ValidatingAdmissionPolicy 'model-placement-owned-annotations'"
TYPES = "ValidatingAdmissionPolicy 'model-placement-model-balloon-types'"
EXTENDER = "extender (ServiceAccount model-placement/model-placement-scheduler)"


def tenant_kubeconfig(cluster: Cluster) -> Any:
    """Another ServiceAccount of the model namespace, allowed by RBAC to do to pods all that is tried here."""
    cluster.kubectl("-n", MODEL_NS, "create", "serviceaccount", TENANT)
    cluster.kubectl("-n", MODEL_NS, "create", "role", TENANT, "--verb=get,list,create,update,patch",
                    "--resource=pods,pods/status,pods/binding")
    cluster.kubectl("-n", MODEL_NS, "create", "rolebinding", TENANT, f"--role={TENANT}",
                    f"--serviceaccount={MODEL_NS}:{TENANT}")
    return cluster.service_account_kubeconfig(TENANT, MODEL_NS)


def refused(done: Any, policy: str, *said: str) -> str:
    """The apiserver's refusal by `policy`, which says all of `said`."""
    text = " ".join(done.stderr.split())
    assert done.returncode != 0 and policy in text and "denied request" in text, text
    for part in said:
        assert part in text, (part, text)
    return text


def annotations(cluster: Cluster, name: str) -> dict[str, str]:
    got: dict[str, str] = cluster.kubectl_json("-n", MODEL_NS, "get", "pod", name)["metadata"]["annotations"]
    return got


def test_only_model_placement_writes_where_a_pod_sits(cluster: Cluster) -> None:
    # The API server type-checked every expression against the pods and Bindings they see.
    for name in ("model-placement-owned-annotations", "model-placement-model-balloon-types"):
        status = cluster.kubectl_json("get", "validatingadmissionpolicy", name).get("status", {})
        assert not status.get("typeChecking", {}).get("expressionWarnings"), status
    cluster.create_nodes([node(NODE, numa=2, cores_per_numa=32, labels=SELECTOR)])
    try:
        tenant = tenant_kubeconfig(cluster)

        # Our own bind: the extender's Binding writes the placement (its ServiceAccount is the one exempted), and the
        # ledger holds the pod where it says.
        empty = wait_until("the extender to know the node", lambda: cluster.get_ours(
            "extender", f"/debug/nodes/{NODE}")[0] == 200 and debug_node(cluster, NODE), timeout=30)
        assert not held_numa(empty)
        keeper = model_pod("keeper", MODEL_NS, tp=1, cpu="8", memory="16Gi", node_selector=SELECTOR)
        cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(keeper))
        placed = wait_until("keeper bound with its placement", lambda: (
            p := cluster.kubectl_json("-n", MODEL_NS, "get", "pod", "keeper"))["spec"].get("nodeName")
            and p["metadata"]["annotations"].get(PLACEMENT), timeout=90)
        where = Placed.parse(placed)
        assert where is not None and where.node == NODE and where.cores == 8, placed
        def confirmed() -> dict[str, Any] | None:
            got = debug_node(cluster, NODE)
            return got if held_numa(got) and not any(h["assumed"] for n in got["numa"] for h in n["held"]) else None

        ledger = wait_until("the watch to confirm keeper's binding", confirmed, timeout=30)
        assert held_numa(ledger) == {f"{MODEL_NS}/keeper": list(where.per_numa)}, ledger
        # A status write by someone else that leaves the owned annotations alone passes (the kubelet's, say).
        cluster.kubectl("-n", MODEL_NS, "patch", "pod", "keeper", "--subresource=status", "--type=merge",
                        "-p", json.dumps({"status": {"phase": "Running"}}))
        before = annotations(cluster, "keeper")
        other = Placed(NODE, ((1 - where.per_numa[0][0], 8),), ("vllm-balloon-tp1",)).annotation()

        # kubectl annotate --overwrite on the running model pod, as the cluster's admin: refused, naming the annotation
        # and its owner; the balloon annotation and our outputs alike; any other annotation is the user's.
        done = cluster.kubectl("-n", MODEL_NS, "annotate", "pod", "keeper", "--overwrite", f"{PLACEMENT}={other}",
                               check=False)
        print("kubectl annotate:", done.stderr)
        refused(done, OWNED, f"pod {MODEL_NS}/keeper: annotation {PLACEMENT} is model-placement's", EXTENDER,
                "nobody else may add, change or remove it")
        done = cluster.kubectl("-n", MODEL_NS, "annotate", "pod", "keeper", "--overwrite",
                               f"{BALLOON_PREFIX}main=vllm-balloon-tp2", check=False)
        refused(done, OWNED, f"annotation {BALLOON_PREFIX}main routes containers to NRI balloons",
                "it cannot change on an existing pod")
        done = cluster.kubectl("-n", MODEL_NS, "annotate", "pod", "keeper", "cpu-policy.model-manager.io/type-",
                               check=False)
        refused(done, OWNED, "annotation cpu-policy.model-manager.io/type is model-placement's: its webhook writes it")
        done = cluster.kubectl("-n", MODEL_NS, "annotate", "pod", "keeper", "model-manager.io/tensor-parallel-size=2",
                               check=False)
        refused(done, OWNED, "annotation model-manager.io/tensor-parallel-size is the pod creator's input")
        cluster.kubectl("-n", MODEL_NS, "annotate", "pod", "keeper", "example.com/owner=team-a")
        # Nor may it stop being a model pod while it carries a model balloon type.
        done = cluster.kubectl("-n", MODEL_NS, "label", "pod", "keeper", "model-manager.io/model-", check=False)
        refused(done, TYPES, "routes a container to a model balloon type")

        # Another ServiceAccount: a patch, a status patch and a Binding carrying the placement are refused alike.
        patch = json.dumps({"metadata": {"annotations": {PLACEMENT: other}}})
        for extra in ((), ("--subresource=status",)):
            done = cluster.kubectl("-n", MODEL_NS, "patch", "pod", "keeper", *extra, "--type=merge", "-p", patch,
                                   kubeconfig=tenant, check=False)
            refused(done, OWNED, f"annotation {PLACEMENT} is model-placement's")
        cluster.kubectl("-n", MODEL_NS, "patch", "pod", "keeper", "--type=merge", "-p",
                        json.dumps({"metadata": {"annotations": {"example.com/owner": "team-b"}}}), kubeconfig=tenant)
        # A pod no scheduler will take (no such scheduler runs), so that only the tenant could bind it.
        waiting = model_pod("waiting", MODEL_NS, tp=1, cpu="8", memory="16Gi", node_selector=SELECTOR)
        waiting["spec"]["schedulerName"] = "nobody"
        cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(waiting))
        binding = {"apiVersion": "v1", "kind": "Binding",
                   "metadata": {"name": "waiting", "namespace": MODEL_NS, "annotations": {PLACEMENT: other}},
                   "target": {"apiVersion": "v1", "kind": "Node", "name": NODE}}
        path = cluster.root / "binding.json"
        path.write_text(json.dumps(binding))
        done = cluster.kubectl("create", "--raw", f"/api/v1/namespaces/{MODEL_NS}/pods/waiting/binding",
                               "-f", str(path), kubeconfig=tenant, check=False)
        refused(done, OWNED, f"pod {MODEL_NS}/waiting: annotation {PLACEMENT} is model-placement's")
        assert not cluster.kubectl_json("-n", MODEL_NS, "get", "pod", "waiting")["spec"].get("nodeName")

        # kubectl apply of a model pod carrying a placement: our webhook drops it, with a warning that names it.
        planted = model_pod("planted", MODEL_NS, tp=1, cpu="8", memory="16Gi", node_selector=SELECTOR,
                            annotations={PLACEMENT: other})
        planted["spec"]["schedulerName"] = "nobody"
        applied = cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(planted))
        print("kubectl apply:", applied.stderr)
        warned = " ".join(line.removeprefix("Warning: ").removeprefix("… ") for line in applied.stderr.splitlines())
        assert f"model-placement removed annotation {PLACEMENT} from {MODEL_NS}/planted" in warned, warned
        assert PLACEMENT not in annotations(cluster, "planted")
        # ... and a pod no webhook of ours sees (no model label) is refused by the API server itself.
        plain = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "plain", "namespace": MODEL_NS,
                                                                 "annotations": {PLACEMENT: other}},
                 "spec": {"nodeName": NODE, "containers": [{"name": "c", "image": "busybox"}]}}
        done = cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(plain), check=False)
        refused(done, OWNED, f"pod {MODEL_NS}/plain: annotation {PLACEMENT} is written only by", EXTENDER)

        # None of it moved the ledger, and the pod kept what our bind wrote.
        after = annotations(cluster, "keeper")
        assert {k: v for k, v in after.items() if k != "example.com/owner"} == before and after[PLACEMENT] == placed
        assert debug_node(cluster, NODE) == ledger

        # A model balloon type on a pod that is no model pod: refused, unless the namespace is exempted.
        squatter = {"apiVersion": "v1", "kind": "Pod",
                    "metadata": {"name": "squatter", "namespace": MODEL_NS,
                                 "annotations": {BALLOON_PREFIX + "c": "vllm-balloon-tp1"}},
                    "spec": {"containers": [{"name": "c", "image": "busybox",
                                             "resources": {"requests": {"cpu": "32"}, "limits": {"cpu": "32"}}}]}}
        done = cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(squatter), kubeconfig=tenant, check=False)
        print("kubectl apply:", done.stderr)
        refused(done, TYPES, f"pod {MODEL_NS}/squatter: annotation {BALLOON_PREFIX}c: vllm-balloon-tp1 routes a "
                "container to a model balloon type", "label model-manager.io/model")
        # Nor in a namespace no webhook of ours serves; its pods may once an operator labels it so.
        cluster.create_namespace("infra", enabled=False, labels={})
        elsewhere = yaml.safe_dump({**squatter, "metadata": {**squatter["metadata"], "namespace": "infra"}})
        refused(cluster.kubectl("apply", "-f", "-", input=elsewhere, check=False), TYPES, "pod infra/squatter")
        cluster.kubectl("label", "namespace", "infra", "model-placement.io/model-balloon-types=any-pod")
        cluster.kubectl("apply", "-f", "-", input=elsewhere)
    finally:
        # Gone again, as the other tests expect the fleet (no kubelet: a pod delete must be forced).
        cluster.kubectl("-n", MODEL_NS, "delete", "pod", "keeper", "waiting", "planted", "--ignore-not-found",
                        "--grace-period=0", "--force", check=False)
        cluster.kubectl("delete", "namespace", "infra", "--ignore-not-found", "--wait=false", check=False)
        cluster.kubectl("delete", "node", NODE, "--ignore-not-found", check=False)
