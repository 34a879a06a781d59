"""Build a Go program of ours under tests/peers/ once per machine and hand back its path.

The binary is cached outside the repository, keyed by the Go toolchain and every file of its module
(go.mod, go.sum, *.go), so a changed pin or main rebuilds and an unchanged one is reused across checkouts.
A missing toolchain or a failed build raises: tests that need a real peer must fail, never skip.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

PEERS = Path(__file__).resolve().parent
# A module's optional `ldflags` file: one line for `go build -ldflags`, e.g. the version a release build stamps.
LDFLAGS = "ldflags"


class BuildError(RuntimeError):
    pass


def cache_root() -> Path:
    explicit = os.environ.get("MODEL_PLACEMENT_PEERS_CACHE")
    xdg_cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    base = Path(explicit) if explicit else xdg_cache / "model-placement" / "peers"
    base.mkdir(parents=True, exist_ok=True)
    return base


def _go() -> str:
    go = shutil.which("go") or ("/usr/local/go/bin/go" if Path("/usr/local/go/bin/go").exists() else None)
    if go is None:
        raise BuildError("the Go toolchain (go) is not on PATH; the real peers are built with it")
    return go


def _key(module: Path, go: str) -> str:
    digest = hashlib.sha256(subprocess.run([go, "version"], capture_output=True, text=True, check=True).stdout.encode())
    for path in sorted(module.rglob("*")):
        if path.is_file() and (path.suffix == ".go" or path.name in ("go.mod", "go.sum", LDFLAGS)):
            digest.update(str(path.relative_to(module)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def module_source(peer: str, module: str) -> Path:
    """The source of `module` (its charts, CRDs, manifests) at the version tests/peers/<peer>/go.mod pins, from
    the Go module cache, downloaded if this machine lacks it: on a fresh module cache `go list -m` prints an
    empty Dir until something downloads it."""
    done = subprocess.run([_go(), "mod", "download", "-json", module], cwd=PEERS / peer, capture_output=True,
                          text=True, timeout=600)
    found = json.loads(done.stdout or "{}").get("Dir") if done.returncode == 0 else None
    if not found:
        raise BuildError(f"go mod download of {module} (pinned by tests/peers/{peer}/go.mod) failed: "
                         f"{(done.stdout + done.stderr)[-400:]}")
    return Path(found)


def build(name: str, package: str = ".", timeout: float = 1800) -> Path:
    """The binary of tests/peers/<name> (package relative to that module), built if this machine lacks it."""
    module = PEERS / name
    go = _go()
    target = cache_root() / f"{name}-{_key(module, go)}"
    binary = target / (Path(package).name or name)  # Path(".").name is ""
    if binary.exists():
        return binary
    target.mkdir(parents=True, exist_ok=True)
    with open(target / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one build per key, however many test sessions ask at once
        if binary.exists():
            return binary
        print(f"building peer {name} into {target} (first use on this machine)", file=sys.stderr, flush=True)
        env = {**os.environ, "CGO_ENABLED": os.environ.get("CGO_ENABLED", "0"),
               "GOFLAGS": "-mod=readonly -buildvcs=false"}
        partial = binary.with_suffix(".partial")
        ldflags = module / LDFLAGS
        extra = [f"-ldflags={ldflags.read_text().strip()}"] if ldflags.exists() else []
        done = subprocess.run([go, "build", "-trimpath", *extra, "-o", str(partial), package], cwd=module, env=env,
                              capture_output=True, text=True, timeout=timeout)
        if done.returncode != 0:
            log = target / "build.log"
            log.write_text(done.stdout + done.stderr)
            raise BuildError(f"go build of tests/peers/{name} failed (exit {done.returncode}); log {log}:\n"
                             + (done.stdout + done.stderr)[-4000:])
        partial.rename(binary)
    return binary


if __name__ == "__main__":
    # `python3 tests/peers/build.py NAME…`: build ahead of the tests (CI does this so a build error reads plainly).
    for arg in sys.argv[1:] or sorted(p.name for p in PEERS.iterdir() if (p / "go.mod").exists()):
        try:
            print(build(arg))
        except (BuildError, subprocess.TimeoutExpired) as exc:
            print(f"error: {exc}", file=sys.stderr)
            sys.exit(1)
