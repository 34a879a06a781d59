"""Settings: defaults < file < environment; a bad value names key, value and what is allowed."""

from __future__ import annotations

from pathlib import Path
from typing import get_args

import pytest

from placement.config import ConfigError, Profile
from placement.topology import PROFILE_RESERVED_CPUS
from server.inputs import load_settings


def test_defaults() -> None:
    s = load_settings(None, env={})
    assert (s.kubernetes_cpu_policy, s.nri_enabled, s.preflight, s.nri_deployment_profile) == \
        ("nri-balloons", True, "enforce", "standard")
    assert (s.nri_balloon_prefix, s.mm_kubelet_threads_per_core, s.require_amx, s.scoring_strategy) == \
        ("vllm-balloon-tp", 2, True, "MostAllocated")


def test_every_profile_has_its_reserved_count() -> None:
    assert set(PROFILE_RESERVED_CPUS) == set(get_args(Profile))


def test_environment_beats_file(tmp_path: Path) -> None:
    cfg = tmp_path / "config.yaml"
    cfg.write_text("kubernetes_cpu_policy: kubelet-static\npreflight: warn\nscheduler_name: mp\n")
    s = load_settings(cfg, env={"MM_CPU_POLICY": "best-effort", "MM_KUBELET_THREADS_PER_CORE": "1"})
    assert (s.kubernetes_cpu_policy, s.preflight, s.scheduler_name, s.mm_kubelet_threads_per_core) == \
        ("best-effort", "warn", "mp", 1)
    assert load_settings(cfg, env={"MM_NRI_SKIP_PREFLIGHT": "1"}).preflight == "skip"
    assert load_settings(cfg, env={"MM_NRI_PREFLIGHT": "enforce"}).preflight == "enforce"
    assert load_settings(None, env={"MM_NRI_ENABLED": "false"}).nri_enabled is False


def test_a_key_already_named_mm_is_not_prefixed_twice() -> None:
    assert load_settings(None, env={"MM_KUBELET_THREADS_PER_CORE": "4"}).mm_kubelet_threads_per_core == 4
    with pytest.raises(ConfigError) as err:
        load_settings(None, env={"MM_MM_KUBELET_THREADS_PER_CORE": "4"})
    assert "MM_MM_KUBELET_THREADS_PER_CORE is not a setting" in str(err.value)
    assert "MM_MM_" not in str(err.value).split("known variables:")[1]


@pytest.mark.parametrize("text,words", [
    ("kubernetes_cpu_policy: pinned\n", ["kubernetes_cpu_policy", "'pinned'", "nri-balloons", "kubelet-static"]),
    ("mm_kubelet_threads_per_core: 0\n", ["mm_kubelet_threads_per_core", "0"]),
    ("scoring_strategy: Random\n", ["scoring_strategy", "MostAllocated"]),
    ("nri_reserved_cpu_list: 0-x\n", ["nri_reserved_cpu_list", "0-x"]),
    ("native_sidecar_cpu: lots\n", ["native_sidecar_cpu", "lots"]),
    ("native_sidecar_cpu: '0'\n", ["native_sidecar_cpu", "positive quantity such as 100m"]),
    ("native_sidecar_memory: -1Mi\n", ["native_sidecar_memory", "-1Mi"]),
    ("nri_deplyment_profile: full\n", ["nri_deplyment_profile", "known keys"]),
])
def test_invalid_values_fail_naming_key_value_and_allowed(tmp_path: Path, text: str, words: list[str]) -> None:
    cfg = tmp_path / "config.yaml"
    cfg.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_settings(cfg, env={})
    for word in words:
        assert word in str(err.value)


def test_invalid_environment_value_is_named_too() -> None:
    with pytest.raises(ConfigError) as err:
        load_settings(None, env={"MM_NRI_PREFLIGHT": "maybe"})
    assert "MM_NRI_PREFLIGHT='maybe' (setting preflight)" in str(err.value) and "enforce, warn, skip" in str(err.value)
