"""What the extender must know of the KubeSchedulerConfiguration that calls it: how long kube-scheduler
waits for one call (`httpTimeout` of the extender that binds; 5 s when unset, `DefaultExtenderTimeout` in
pkg/scheduler/extender.go), so that /bind and /preempt answer before the caller gives up on them.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from placement.config import ConfigError

DEFAULT_HTTP_TIMEOUT = 5.0  # kube-scheduler's DefaultExtenderTimeout, used when httpTimeout is 0 or absent
# What loopback, our own event loop and the answer's serialisation may take after the budget is spent.
MARGIN = 0.5
MIN_BUDGET = 0.2

_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h)")


class SchedulerConfigError(ConfigError):
    """The KubeSchedulerConfiguration given to the extender cannot be read; names the file and the problem."""


def _not_duration(text: str) -> SchedulerConfigError:
    return SchedulerConfigError(f"httpTimeout {text!r} is not a Go duration such as 5s, 1500ms or 1m30s")


def go_duration(text: str) -> float:
    """Seconds of a Go `time.Duration` string as metav1.Duration reads it ("5s", "1m30s", "1.5s", "0")."""
    body = text.strip()
    sign = -1.0 if body.startswith("-") else 1.0
    body = body.lstrip("+-")
    if body == "0":
        return 0.0
    if not body:
        raise _not_duration(text)
    pos, total = 0, 0.0
    while pos < len(body):
        match = _PART.match(body, pos)
        if match is None:
            raise _not_duration(text)
        total += float(match.group(1)) * _UNITS[match.group(2)]
        pos = match.end()
    return sign * total


def http_timeout(config: Any) -> float:
    """httpTimeout of the extender that binds (the one whose calls we answer), in seconds."""
    if not isinstance(config, dict) or config.get("kind") != "KubeSchedulerConfiguration":
        raise SchedulerConfigError("not a KubeSchedulerConfiguration (kind: KubeSchedulerConfiguration)")
    extenders = config.get("extenders") or []
    if not isinstance(extenders, list):
        raise SchedulerConfigError("extenders must be a list")
    binders = [e for e in extenders if isinstance(e, dict) and e.get("bindVerb")]
    if not binders:
        raise SchedulerConfigError("no extender with a bindVerb: this configuration does not call our /bind")
    raw = binders[0].get("httpTimeout")
    seconds = DEFAULT_HTTP_TIMEOUT if raw in (None, "", 0) else go_duration(str(raw))
    return seconds if seconds > 0 else DEFAULT_HTTP_TIMEOUT


def call_budget(timeout: float) -> float:
    """How long one /bind or /preempt may spend, all API calls included, for kube-scheduler's `timeout`."""
    return max(MIN_BUDGET, timeout - MARGIN)


def budget_from_file(path: str | Path) -> float:
    try:
        config = yaml.safe_load(Path(path).read_text())
    except OSError as exc:
        raise SchedulerConfigError(f"cannot read the KubeSchedulerConfiguration {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise SchedulerConfigError(f"{path} is not YAML: {exc}") from None
    try:
        return call_budget(http_timeout(config))
    except SchedulerConfigError as exc:
        raise SchedulerConfigError(f"{path}: {exc}") from None
