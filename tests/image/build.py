"""Build the Dockerfile into an image with podman, on a base made from Debian's own packages, and hand back its name.

There is no registry here, so the official base (`PYTHON_IMAGE` in the Dockerfile, `python:<minor>-slim-<codename>`)
has a stand-in: `mmdebstrap --variant=minbase` of that Debian release with its python3 (the same minor; the tests
hold it so) and venv module, imported into podman. The Dockerfile is then built unchanged with `--pull=never`.

What it installs and where its state lives:
- podman, runc, netavark and mmdebstrap from the machine's apt sources, if missing (root; CI runs as root). runc,
  not crun: crun refuses the mixed cgroup v1/v2 layout of the project's machines.
- podman's configuration (containers.conf, storage.conf) and its whole store (images, layers, its run state) under
  `~/.cache/model-placement/image/`, never /etc: the machine's own podman setup is not touched. The ulimits are the
  machine's own hard limits (podman's defaults exceed them here, and every container would fail to start).
- Builds reach PyPI through the host's network with the host's CA bundle mounted for the build only (outgoing TLS
  here passes a proxy the host trusts); nothing of the host is copied into the image.

The stand-in is built once per machine (keyed by the release and its package list), the image once per source
state (keyed by every file the build context holds); podman's layer cache makes a changed source a short rebuild.
`MODEL_PLACEMENT_IMAGE` names an image built already (`.ci/run` builds once and sets it for the whole run).

    python3 tests/image/build.py      # prints the image's name; progress on stderr
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import resource
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
REPOSITORY = "localhost/model-placement"
BASE_REPOSITORY = "localhost/model-placement-base"
# What the official python:<minor>-slim image has that the build and the servers use.
BASE_PACKAGES = ("python3", "python3-venv", "ca-certificates")
TOOLS = {"podman": "podman", "runc": "runc", "mmdebstrap": "mmdebstrap", "/usr/lib/podman/netavark": "netavark"}
MIRROR = "http://deb.debian.org"
HOST_CA = Path("/etc/ssl/certs/ca-certificates.crt")
OWNER = "model-placement.tests.owner"  # the label with the pid of the test process that ran a container
KEEP = 3  # images of other source states kept for the next runs (each holds its own ~110 MB virtualenv layer)


class BuildError(RuntimeError):
    pass


def official_base() -> tuple[str, str]:
    """The Python minor and Debian codename of the Dockerfile's default base, `python:3.13-slim-trixie`."""
    found = re.search(r"^ARG PYTHON_IMAGE=python:(\d+\.\d+)-slim-([a-z]+)$", DOCKERFILE.read_text(), re.M)
    if found is None:
        raise BuildError("the Dockerfile's ARG PYTHON_IMAGE default is not python:<minor>-slim-<debian codename>, "
                         "so no stand-in base can be made for it")
    return found.group(1), found.group(2)


def cache_root() -> Path:
    base = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "model-placement" / "image"
    base.mkdir(parents=True, exist_ok=True)
    return base


def ensure_tools() -> None:
    """apt-get the tools that are missing; the apt lists are refreshed only when something is."""
    missing = [package for tool, package in TOOLS.items() if not (shutil.which(tool) or Path(tool).exists())]
    if not missing:
        return
    if os.geteuid() != 0:
        raise BuildError(f"{', '.join(missing)} missing, and installing them needs root: "
                         f"apt-get install {' '.join(missing)}")
    print(f"installing {', '.join(missing)} (apt-get)", file=sys.stderr, flush=True)
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for argv in (["apt-get", "update", "-q"],
                 ["apt-get", "install", "-y", "-q", "--no-install-recommends", *missing]):
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=900)
        if done.returncode != 0:
            raise BuildError(f"{' '.join(argv)} exited {done.returncode}:\n{(done.stdout + done.stderr)[-3000:]}")


def _write(path: Path, text: str) -> None:
    if not path.exists() or path.read_text() != text:
        partial = path.with_suffix(".partial")
        partial.write_text(text)
        partial.replace(path)


def _cap(limit: int, kernel: Path) -> int:
    hard = resource.getrlimit(limit)[1]
    return min(int(kernel.read_text()), hard if hard != resource.RLIM_INFINITY else sys.maxsize)


def env() -> dict[str, str]:
    """The environment every podman call of the tests runs in: their own configuration and store."""
    cache = cache_root()
    # The hard limits of this process, within what the kernel grants a container's init (runc cannot set nproc
    # above pid_max here, nor nofile above nr_open).
    limits = [f'"{name}={n}:{n}"' for name, n in (
        ("nofile", _cap(resource.RLIMIT_NOFILE, Path("/proc/sys/fs/nr_open"))),
        ("nproc", _cap(resource.RLIMIT_NPROC, Path("/proc/sys/kernel/pid_max"))))]
    _write(cache / "containers.conf", "\n".join([
        "[containers]",
        f"default_ulimits = [{', '.join(limits)}]",
        "[engine]",
        'runtime = "runc"',
        'cgroup_manager = "cgroupfs"',
        'events_logger = "none"',
        f'tmp_dir = "{cache}/run/libpod"',
        f'volume_path = "{cache}/volumes"',
        "[network]",
        f'network_config_dir = "{cache}/networks"',
        "",
    ]))
    _write(cache / "storage.conf", "\n".join([
        "[storage]",
        'driver = "overlay"',
        f'graphroot = "{cache}/storage"',
        f'runroot = "{cache}/run/storage"',
        "",
    ]))
    return {**os.environ, "CONTAINERS_CONF": str(cache / "containers.conf"),
            "CONTAINERS_STORAGE_CONF": str(cache / "storage.conf")}


def podman(*args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(["podman", *args], env=env(), capture_output=True, text=True, timeout=timeout)
    if check and done.returncode != 0:
        raise BuildError(f"podman {' '.join(args)} exited {done.returncode}:\n{(done.stdout + done.stderr)[-4000:]}")
    return done


def exists(name: str) -> bool:
    return podman("image", "exists", name, check=False).returncode == 0


def once(name: str, make: Callable[[], None]) -> str:
    """The image `name`, made by `make` if this machine lacks it: one build at a time, however many test sessions
    ask at once."""
    if not exists(name):
        with open(cache_root() / ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not exists(name):
                make()
    return name


def base() -> str:
    """The stand-in for the official base: Debian's minbase of the same release with its python3."""
    ensure_tools()
    _minor, codename = official_base()
    key = hashlib.sha256(" ".join([codename, *BASE_PACKAGES]).encode()).hexdigest()[:12]
    name = f"{BASE_REPOSITORY}:{codename}-{key}"

    def make() -> None:
        print(f"building the stand-in base {name} (mmdebstrap {codename}; first use on this machine)",
              file=sys.stderr, flush=True)
        sources = [f"deb {MIRROR}/debian {codename} main", f"deb {MIRROR}/debian {codename}-updates main",
                   f"deb {MIRROR}/debian-security {codename}-security main"]
        tarball = cache_root() / f"{codename}.tar"
        try:
            done = subprocess.run(["mmdebstrap", "--variant=minbase", "--mode=root", "--quiet",
                                   f"--include={','.join(BASE_PACKAGES)}", codename, str(tarball), *sources],
                                  capture_output=True, text=True, timeout=900)
            if done.returncode != 0:
                raise BuildError(f"mmdebstrap {codename} exited {done.returncode}:\n{done.stderr[-4000:]}")
            podman("import", "--change", 'CMD ["/bin/sh"]', str(tarball), name, timeout=300)
        finally:
            tarball.unlink(missing_ok=True)

    return once(name, make)


def context_files() -> list[Path]:
    """What the build context holds: .dockerignore's allow-list, less the bytecode and build leftovers it drops."""
    allowed = [line[1:].rstrip("/") for line in (ROOT / ".dockerignore").read_text().splitlines()
               if line.startswith("!")]
    files = []
    for entry in allowed:
        path = ROOT / entry
        for file in sorted(path.rglob("*")) if path.is_dir() else [path]:
            rel = file.relative_to(ROOT)
            if file.is_file() and file.suffix not in (".pyc", ".pyo", ".pyd") and not any(
                    part == "__pycache__" or part.endswith(".egg-info") for part in rel.parts):
                files.append(file)
    return files


def image() -> str:
    """The Dockerfile built on the stand-in base: `MODEL_PLACEMENT_IMAGE` when set, else built if this source
    state has no image yet."""
    given = os.environ.get("MODEL_PLACEMENT_IMAGE")
    if given:
        sweep()
        return given
    parent = base()
    sweep()
    digest = hashlib.sha256(podman("image", "inspect", "--format", "{{.Id}}", parent).stdout.encode())
    for file in [DOCKERFILE, ROOT / ".dockerignore", *context_files()]:
        digest.update(str(file.relative_to(ROOT)).encode() + b"\0" + file.read_bytes() + b"\0")
    name = f"{REPOSITORY}:{digest.hexdigest()[:16]}"

    def make() -> None:
        print(f"building {name} from the Dockerfile on {parent}", file=sys.stderr, flush=True)
        mounts = ["--volume", f"{HOST_CA}:{HOST_CA}:ro"] if HOST_CA.exists() else []
        # Host network: the default bridge needs iptables rules on the host, and the build only reaches PyPI.
        podman("build", "--pull=never", "--layers", "--network=host", *mounts, "--build-arg",
               f"PYTHON_IMAGE={parent}", "--file", str(DOCKERFILE), "--tag", name, str(ROOT), timeout=1200)
        _prune(name)

    return once(name, make)


def sweep() -> None:
    """Containers of test processes that are gone (killed before they could stop them) are removed: each carries
    the pid of the process that started it (OWNER)."""
    listed = podman("ps", "--all", "--filter", f"label={OWNER}",
                    "--format", f'{{{{.ID}}}} {{{{index .Labels "{OWNER}"}}}}')
    for line in listed.stdout.splitlines():
        container, pid = line.split()
        if not Path(f"/proc/{pid}").exists():
            podman("rm", "--force", "--ignore", container, check=False)


def _prune(keep: str) -> None:
    """Images of older source states beyond the newest KEEP go (one in use by a container stays)."""
    listed = podman("images", "--format", "{{.Repository}}:{{.Tag}} {{.CreatedAt}}", "--filter",
                    f"reference={REPOSITORY}").stdout.split("\n")
    names = [line.split(" ", 1)[0] for line in sorted(filter(None, listed), key=lambda s: s.split(" ", 1)[1],
                                                     reverse=True)]
    for name in [n for n in names if n != keep][KEEP:]:
        podman("rmi", name, check=False)


if __name__ == "__main__":
    try:
        built = image()
        size = int(podman("image", "inspect", "--format", "{{.Size}}", built).stdout)
        print(f"image {built}: {size / 1e6:.0f} MB", file=sys.stderr)
        print(built)
    except (BuildError, subprocess.TimeoutExpired) as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(1)
