"""vLLM's CPU backend settings checked against the placement a model pod gets (warnings, never refusals).

vLLM binds its own threads: each rank's OpenMP threads to `VLLM_CPU_OMP_THREADS_BIND` (default `auto`: one NUMA node
of the CPUs the container may use, per rank), less `VLLM_CPU_NUM_OF_RESERVED_CPU` per rank; each rank holds
`VLLM_CPU_KVCACHE_SPACE` GiB of KV cache; and it moves its memory to the rank's NUMA node with migrate_pages /
mbind, which the container runtime's default seccomp profile allows only with CAP_SYS_NICE. A pod that sets none
of the VLLM_CPU_* variables is not told anything: it runs vLLM's defaults, which follow the balloon.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from placement.demand import ModelDemand, model_container

BIND = "VLLM_CPU_OMP_THREADS_BIND"
RESERVED = "VLLM_CPU_NUM_OF_RESERVED_CPU"
KVCACHE = "VLLM_CPU_KVCACHE_SPACE"
EXCLUSIVE = ("nri-balloons", "kubelet-static")


def _env(container: Mapping[str, Any]) -> dict[str, str]:
    """The literal env values (a valueFrom is not known at admission)."""
    return {str(e.get("name")): str(e["value"]) for e in container.get("env") or ()
            if isinstance(e, Mapping) and e.get("value") is not None}


def _gib(value: str) -> float | None:
    try:
        gib = float(value)
    except ValueError:
        return None
    return gib if gib >= 0 else None


def vllm_notes(demand: ModelDemand, pod: Mapping[str, Any], threads_per_rank: int) -> tuple[str, ...]:
    """What in the model container's vLLM settings disagrees with its ranks, its `threads_per_rank` (the CPUs each
    rank's NUMA node gives it) and its memory request; one short sentence each."""
    if demand.policy not in EXCLUSIVE:
        return ()
    spec = pod.get("spec") or {}
    container, _ = model_container(spec, (pod.get("metadata") or {}).get("annotations") or {})
    if container is None:
        return ()
    env = _env(container)
    if not any(name.startswith("VLLM_CPU_") for name in env):
        return ()
    who, ranks, notes = f"{demand.pod}: vLLM", demand.numa_nodes, []
    bind = env.get(BIND, "auto").strip()
    if bind not in ("auto", "nobind"):
        lists = [part for part in bind.split("|") if part.strip()]
        if len(lists) != ranks:
            notes.append(f"{who} {BIND} has {len(lists)} CPU list(s) for {ranks} rank(s); set it to auto.")
        else:
            notes.append(f"{who} {BIND}={bind} names fixed CPU ids, but the balloon's CPUs are chosen on the node "
                         "and may differ; set it to auto (one NUMA node per rank).")
    elif bind == "nobind":
        notes.append(f"{who} {BIND}=nobind leaves its threads unbound inside the balloon; set it to auto.")
    reserved = env.get(RESERVED)
    if reserved is not None and reserved.strip().isdigit() and int(reserved) >= threads_per_rank:
        notes.append(f"{who} {RESERVED}={reserved} leaves no CPU for the OpenMP threads of a rank with "
                     f"{threads_per_rank} CPUs; lower it or request more.")
    kv = _gib(env.get(KVCACHE, "")) if KVCACHE in env else None
    if kv is not None and demand.memory_bytes:
        needed = kv * ranks * 2**30
        if needed > demand.memory_bytes:
            notes.append(f"{who} {KVCACHE}={env[KVCACHE]} GiB × {ranks} rank(s) = {kv * ranks:g} GiB of KV cache, "
                         f"more than the memory request ({demand.memory_bytes / 2**30:g} GiB); raise it.")
    notes.extend(_numa_binding(who, container, spec))
    return tuple(notes)


def _numa_binding(who: str, container: Mapping[str, Any], spec: Mapping[str, Any]) -> list[str]:
    """vLLM's NUMA memory binding (migrate_pages) silently does nothing without CAP_SYS_NICE, or under a seccomp
    profile that refuses the call; the runtime's default profile allows it only with the capability."""
    context = container.get("securityContext") or {}
    caps = context.get("capabilities") or {}
    added = {str(c).upper().removeprefix("CAP_") for c in caps.get("add") or ()}
    if "SYS_NICE" not in added:
        return [f"{who} cannot bind its memory to its NUMA nodes without capability SYS_NICE; add it to the "
                "model container's securityContext.capabilities.add."]
    profile = (context.get("seccompProfile") or (spec.get("securityContext") or {}).get("seccompProfile") or {})
    if profile.get("type") == "Localhost":
        return [f"{who}: seccomp profile {profile.get('localhostProfile')} must allow migrate_pages and mbind for "
                "its NUMA memory binding."]
    return []

