"""Structured logs: one JSON object per line, with the fields an operator greps for."""

from __future__ import annotations

import logging
import sys
import time

import orjson

# Fields callers pass with `extra=`; anything else set on a record by the logging module is noise.
FIELDS = ("component", "verb", "pod", "node", "nodes_in", "nodes_out", "decision", "check", "reason",
          "policy", "duration_ms", "uid", "kind", "error", "count", "path", "status", "assumed_node",
          "fingerprint", "serial", "not_after", "cert_file", "first_reasons", "demand", "free", "warnings")


class JSONFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "component": getattr(record, "component", record.name.removeprefix("model_placement.")),
            "msg": record.getMessage(),
        }
        for key in FIELDS[1:]:
            value = getattr(record, key, None)
            if value is not None:
                entry[key] = value
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return orjson.dumps(entry, default=str).decode()


def configure(level: str = "info") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JSONFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # aiohttp's access log duplicates ours, without the decision.
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    # urllib3 logs each of its retries; the caller's own line (the sentence, or the list's retry) says it once.
    logging.getLogger("urllib3.connectionpool").setLevel(logging.ERROR)
