"""charts/model-placement: the real helm (helm.sh/helm/v4, built under tests/peers/helm) lints it and renders, with
the default values, the same objects as `kubectl kustomize manifests/` (the kube peer's kubectl); each value does
what values.yaml says."""

from __future__ import annotations

import base64
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509

from certs import write_bundle
from server.inputs import load_settings
from tests.peers.build import build

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "charts" / "model-placement"
Obj = dict[str, Any]
_HASHED = re.compile(r"\b(model-placement(?:-scheduler)?-config)-[a-z0-9]{10}\b")


@pytest.fixture(scope="module")
def helm() -> str:
    return str(build("helm"))


def template(helm: str, *sets: str) -> list[Obj]:
    args = [a for s in sets for a in ("--set", s)]
    out = subprocess.run([helm, "template", "model-placement", str(CHART), *args], capture_output=True, text=True,
                         timeout=120, check=True).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def by_key(docs: list[Obj]) -> dict[tuple[str, str, str], Obj]:
    return {(d["kind"], d["metadata"].get("namespace", ""), d["metadata"]["name"]): d for d in docs}


def normalized(docs: list[Obj]) -> dict[tuple[str, str, str], Obj]:
    """What may differ by design: kustomize's hash suffix on generated ConfigMaps (the chart rolls pods with a
    checksum annotation instead), a config file's comments, and the TLS material (each install makes its own:
    checked separately to be a CA and the caBundle of every webhook)."""
    text = _HASHED.sub(r"\1", yaml.safe_dump_all(docs))
    out = by_key([d for d in yaml.safe_load_all(text) if d])
    for d in out.values():
        meta = d.get("spec", {}).get("template", {}).get("metadata", {})
        meta.get("annotations", {}).pop("checksum/config", None)
        if meta.get("annotations") == {}:
            del meta["annotations"]
        if d["kind"] == "ConfigMap":
            d["data"] = {k: yaml.safe_load(v) for k, v in d["data"].items()}
        if d["kind"] == "Secret":
            d["data"] = sorted(d["data"])
        for hook in d.get("webhooks", []):
            hook["clientConfig"].pop("caBundle", None)
    return out


def test_default_values_render_the_same_objects_as_the_manifests(helm: str, tmp_path: Path) -> None:
    work = tmp_path / "manifests"
    shutil.copytree(ROOT / "manifests", work)
    write_bundle("model-placement-webhook", "model-placement", work / "certs")
    kustomized = subprocess.run([str(build("kube")), "kubectl", "kustomize", str(work)], capture_output=True,
                                text=True, timeout=120, check=True).stdout
    ours = template(helm)
    assert normalized(ours) == normalized([d for d in yaml.safe_load_all(kustomized) if d])
    objects = by_key(ours)
    assert objects["Deployment", "model-placement", "model-placement-webhook"]["spec"]["replicas"] == 3
    # The generated TLS: a CA whose certificate is every webhook's caBundle, signing a serving certificate for
    # the name the apiserver calls.
    tls = objects["Secret", "model-placement", "model-placement-tls"]["data"]
    ca = x509.load_pem_x509_certificate(base64.b64decode(tls["ca.crt"]))
    serving = x509.load_pem_x509_certificate(base64.b64decode(tls["tls.crt"]))
    serving.verify_directly_issued_by(ca)
    sans = serving.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "model-placement-webhook.model-placement.svc" in sans.get_values_for_type(x509.DNSName)
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        hooks = objects[kind, "", "model-placement"]["webhooks"]
        assert hooks and all(h["clientConfig"]["caBundle"] == tls["ca.crt"] for h in hooks)


def test_helm_lint(helm: str) -> None:
    done = subprocess.run([helm, "lint", str(CHART)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 chart(s) failed" in done.stdout


def test_values_set_replicas_placement_and_the_cpu_policy(helm: str) -> None:
    objects = by_key(template(helm, "webhook.replicas=5", "webhook.antiAffinity=required",
                              "webhook.priorityClassName=system-cluster-critical", "webhook.pdb.minAvailable=2",
                              "config.kubernetes_cpu_policy=kubelet-static", "config.preflight=warn",
                              "image.repository=registry.example/model-placement", "image.tag=1.2.3"))
    dep = objects["Deployment", "model-placement", "model-placement-webhook"]
    pod = dep["spec"]["template"]["spec"]
    assert dep["spec"]["replicas"] == 5 and pod["priorityClassName"] == "system-cluster-critical"
    [term] = pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert term["topologyKey"] == "kubernetes.io/hostname"
    assert pod["containers"][0]["image"] == "registry.example/model-placement:1.2.3"
    assert objects["PodDisruptionBudget", "model-placement", "model-placement-webhook"]["spec"]["minAvailable"] == 2
    config = yaml.safe_load(objects["ConfigMap", "model-placement", "model-placement-config"]["data"]["config.yaml"])
    settings = load_settings_from(config)
    assert settings.kubernetes_cpu_policy == "kubelet-static" and settings.preflight == "warn"
    assert settings.scheduler_name == "model-placement-scheduler"


def load_settings_from(config: Obj) -> Any:
    import tempfile

    with tempfile.NamedTemporaryFile("w", suffix=".yaml") as f:
        yaml.safe_dump(config, f)
        f.flush()
        return load_settings(f.name, env={})


def test_scheduler_off_and_cert_manager(helm: str) -> None:
    objects = by_key(template(helm, "scheduler.enabled=false", "certs.mode=certManager"))
    assert not any(kind == "Deployment" and name == "model-placement-scheduler" for kind, _, name in objects)
    assert ("ConfigMap", "model-placement", "model-placement-scheduler-config") not in objects
    config = yaml.safe_load(objects["ConfigMap", "model-placement", "model-placement-config"]["data"]["config.yaml"])
    assert load_settings_from(config).scheduler_name == ""  # model pods keep the default scheduler
    assert ("Secret", "model-placement", "model-placement-tls") not in objects
    assert objects["Certificate", "model-placement", "model-placement-serving"]["spec"]["secretName"] == \
        "model-placement-tls"
    hook = objects["MutatingWebhookConfiguration", "", "model-placement"]
    assert (hook["metadata"]["annotations"]["cert-manager.io/inject-ca-from"]
            == "model-placement/model-placement-serving")
    assert all("caBundle" not in h["clientConfig"] for h in hook["webhooks"])


def test_a_bad_value_is_one_sentence(helm: str) -> None:
    done = subprocess.run([helm, "template", "x", str(CHART), "--set", "certs.mode=vault"], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode != 0 and 'certs.mode "vault": use selfSigned, certManager or existing' in done.stderr
