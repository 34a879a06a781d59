"""Run `model-placement serve | webhook | extender` as a real subprocess: its port from the `listening` log
line, every JSON log line kept (a full stderr pipe would stall it), SIGTERM to stop."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def command() -> list[str]:
    """The installed console script when it sits next to this interpreter and runs this checkout's code,
    else the module (an editable install of another worktree would test that worktree's code)."""
    script = Path(sys.executable).with_name("model-placement")
    if script.exists() and _installed_from_here():
        return [str(script)]
    return ["env", f"PYTHONPATH={ROOT}", sys.executable, "-m", "cli"]  # this checkout, from any directory


def _installed_from_here() -> bool:
    from importlib import metadata

    try:
        direct = json.loads(metadata.distribution("model-placement").read_text("direct_url.json") or "{}")
    except metadata.PackageNotFoundError:
        return False
    if not (direct.get("dir_info") or {}).get("editable"):
        return True  # a built install: the code an operator runs
    return bool(direct.get("url") == ROOT.as_uri())


class ServerProcess:
    """`argv0` runs the server some other way than `command()` (our image: `podman run … IMAGE`)."""

    def __init__(self, args: list[str], *, env: dict[str, str] | None = None, wait: bool = True,
                 argv0: list[str] | None = None) -> None:
        self.proc = subprocess.Popen([*(argv0 or command()), *args], cwd=ROOT, stderr=subprocess.PIPE,
                                     stdout=subprocess.DEVNULL, env={**os.environ, **(env or {})})
        self.lines: list[dict[str, Any]] = []
        self.listening = threading.Event()
        self.url = ""
        self.port = 0
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()
        if wait and not self.listening.wait(30):
            self.kill()
            raise AssertionError(f"server never said it was listening; last lines: {self.lines[-5:]}")

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for raw in self.proc.stderr:
            try:
                entry = json.loads(raw)
            except ValueError:
                entry = {"level": "raw", "msg": raw.decode(errors="replace")}
            self.lines.append(entry)
            if entry.get("msg") == "listening":
                self.url = entry["path"]
                self.port = int(self.url.rsplit(":", 1)[1])
                self.listening.set()
        self.listening.set()  # the process ended

    def logged(self, msg: str) -> list[dict[str, Any]]:
        return [e for e in self.lines if e.get("msg") == msg]

    def problems(self) -> list[dict[str, Any]]:
        """Error lines, tracebacks and anything that is not a JSON log line."""
        return [e for e in self.lines if e.get("level") in ("error", "critical", "raw") or "Traceback" in str(e)]

    def wait(self, timeout: float = 20) -> int:
        code = self.proc.wait(timeout)
        self.reader.join(5)
        return code

    def stop(self, timeout: float = 30) -> int:
        """SIGTERM, then its exit code within `timeout`: by default the manifests' terminationGracePeriodSeconds,
        what the kubelet allows before SIGKILL."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"still running {timeout:g} s after SIGTERM; last lines: {self.lines[-8:]}") from None

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5)
