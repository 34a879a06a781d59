"""certs/: generated material is what the apiserver accepts, and rotation works over real TLS on localhost."""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import hashlib
import logging
import os
import re
import shutil
import socket
import ssl
import stat
import subprocess
import threading
import time
import warnings
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from certs import (
    ReloadError,
    ReloadingTLS,
    make_ca,
    make_client_cert,
    run_certs_command,
    server_ssl_context,
    write_bundle,
)
from tests.support.process import ROOT, ServerProcess, command
from tests.support.tls import client_context, handshakes

SERVICE = "model-placement-webhook"
NAMESPACE = "model-placement"
SERVER_NAME = f"{SERVICE}.{NAMESPACE}.svc"  # what the apiserver dials and verifies


def load_cert(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def fingerprint(path: Path) -> str:
    return load_cert(path).fingerprint(hashes.SHA256()).hex()








async def handle(request: web.Request) -> web.Response:
    body = await request.read()
    assert request.transport is not None
    peer = request.transport.get_extra_info("peercert")
    subject = dict(rdn[0] for rdn in peer["subject"]) if peer else {}
    return web.json_response(
        {
            "len": len(body),
            "client_port": request.transport.get_extra_info("peername")[1],  # identifies the connection
            "client": subject.get("commonName"),
        }
    )


@asynccontextmanager
async def serve(tls: ReloadingTLS) -> AsyncIterator[str]:
    app = web.Application()
    app.router.add_post("/mutate", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=tls.context)
    await site.start()
    try:
        yield f"https://127.0.0.1:{runner.addresses[0][1]}/mutate"
    finally:
        await runner.cleanup()


async def post(session: aiohttp.ClientSession, url: str, ctx: ssl.SSLContext) -> dict[str, Any]:
    """POST as the apiserver does (SNI and hostname check on ``<svc>.<ns>.svc``); return the JSON body."""
    async with session.post(url, data=b"payload", ssl=ctx, server_hostname=SERVER_NAME) as resp:
        assert resp.status == 200
        body: dict[str, Any] = await resp.json()
    assert body["len"] == len(b"payload")
    return body


async def post_once(url: str, ctx: ssl.SSLContext) -> dict[str, Any]:
    """POST on a fresh connection; the handshake's server certificate is appended to ``handshakes(ctx)``."""
    async with aiohttp.ClientSession() as session:
        return await post(session, url, ctx)


def test_generated_bundle(tmp_path: Path) -> None:
    bundle = write_bundle(SERVICE, NAMESPACE, tmp_path, days=30, extra_sans=["localhost", "127.0.0.1"])
    assert (bundle.cert_file, bundle.key_file, bundle.ca_file) == (
        tmp_path / "tls.crt",
        tmp_path / "tls.key",
        tmp_path / "ca.crt",
    )
    assert stat.S_IMODE(os.stat(bundle.key_file).st_mode) == 0o600
    assert base64.b64decode(bundle.ca_bundle_b64) == bundle.ca_file.read_bytes()

    ca, leaf = load_cert(bundle.ca_file), load_cert(bundle.cert_file)
    leaf.verify_directly_issued_by(ca)
    for cert in (ca, leaf):
        key = cert.public_key()
        assert isinstance(key, ec.EllipticCurvePublicKey) and isinstance(key.curve, ec.SECP256R1)

    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is True
    assert ca.extensions.get_extension_for_class(x509.KeyUsage).value.key_cert_sign is True
    assert leaf.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is False
    eku = leaf.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    # clientAuth as well: kube-scheduler presents this certificate to the extender (--client-ca).
    assert list(eku) == [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]

    san = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == [
        SERVICE,
        f"{SERVICE}.{NAMESPACE}",
        f"{SERVICE}.{NAMESPACE}.svc",
        f"{SERVICE}.{NAMESPACE}.svc.cluster.local",
        "localhost",
    ]
    assert [str(ip) for ip in san.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]

    now = dt.datetime.now(dt.UTC)
    assert now - dt.timedelta(minutes=10) < leaf.not_valid_before_utc < now - dt.timedelta(minutes=1)
    assert abs(leaf.not_valid_after_utc - (now + dt.timedelta(days=30))) < dt.timedelta(minutes=1)
    assert bundle.not_after == leaf.not_valid_after_utc


def test_client_cert_is_for_client_auth() -> None:
    ca = make_ca()
    client = make_client_cert(ca, "system:kube-scheduler")
    client.cert.verify_directly_issued_by(ca.cert)
    eku = client.cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(eku) == [ExtendedKeyUsageOID.CLIENT_AUTH]
    assert client.cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "system:kube-scheduler"


def test_certs_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run_certs_command(SERVICE, NAMESPACE, tmp_path / "out", 7) == 0
    out = capsys.readouterr().out
    line = next(line for line in out.splitlines() if line.startswith("caBundle: "))
    assert base64.b64decode(line.removeprefix("caBundle: ")) == (tmp_path / "out" / "ca.crt").read_bytes()
    assert f"{SERVICE}.{NAMESPACE}.svc" in out

    assert run_certs_command("Not_A_Service", NAMESPACE, tmp_path / "bad", 7) == 2
    assert "DNS-1123" in capsys.readouterr().err
    assert not (tmp_path / "bad").exists()


async def test_rotation_serves_new_cert_and_keeps_open_connections(tmp_path: Path) -> None:
    live = tmp_path / "live"
    old = write_bundle(SERVICE, NAMESPACE, live)
    old_ca = tmp_path / "old-ca.crt"
    shutil.copy(old.ca_file, old_ca)
    old_fp = fingerprint(old.cert_file)
    tls = server_ssl_context(old.cert_file, old.key_file, interval=0.05)
    assert tls.fingerprint == old_fp and tls.not_after == old.not_after

    async with serve(tls) as url, aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1)) as kept:
        old_ctx = client_context(old_ca)
        before = await post(kept, url, old_ctx)
        assert handshakes(old_ctx) == [old_fp]

        new = write_bundle(SERVICE, NAMESPACE, live)  # new CA and key over the same files
        new_fp = fingerprint(new.cert_file)
        assert new_fp != old_fp
        await tls.start()
        try:
            for _ in range(100):
                if tls.fingerprint == new_fp:
                    break
                await asyncio.sleep(0.02)
            assert tls.fingerprint == new_fp
            assert tls.not_after == new.not_after
        finally:
            await tls.stop()

        # The keep-alive connection opened before the swap still works and still has the old certificate.
        after = await post(kept, url, old_ctx)
        assert after["client_port"] == before["client_port"]
        assert handshakes(old_ctx) == [old_fp]  # no new handshake happened

        # New connections get the new certificate on the same listener; the old CA no longer verifies it.
        new_ctx = client_context(new.ca_file)
        fresh = await post_once(url, new_ctx)
        assert handshakes(new_ctx) == [new_fp] and fresh["client_port"] != before["client_port"]
        with pytest.raises(aiohttp.ClientConnectorCertificateError):
            await post_once(url, old_ctx)


async def test_broken_rotation_keeps_serving_old_cert(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    live = tmp_path / "live"
    old = write_bundle(SERVICE, NAMESPACE, live)
    old_ctx = client_context(old.ca_file)
    old_fp = fingerprint(old.cert_file)
    new = write_bundle(SERVICE, NAMESPACE, tmp_path / "new")
    other = write_bundle(SERVICE, NAMESPACE, tmp_path / "other")
    tls = server_ssl_context(old.cert_file, old.key_file)
    caplog.set_level(logging.WARNING, logger="model_placement.certs")

    async with serve(tls) as url:
        broken = {
            "half-written key": (new.cert_file.read_bytes(), new.key_file.read_bytes()[:60]),
            "mismatched key": (new.cert_file.read_bytes(), other.key_file.read_bytes()),
            "half-written cert": (new.cert_file.read_bytes()[:200], new.key_file.read_bytes()),
        }
        for what, (cert_pem, key_pem) in broken.items():
            caplog.clear()
            old.cert_file.write_bytes(cert_pem)
            old.key_file.write_bytes(key_pem)
            assert tls.reload() is False, what
            assert any("keeping current certificate" in r.getMessage() for r in caplog.records), what
            assert tls.fingerprint == old_fp, what
            await post_once(url, old_ctx)
            assert handshakes(old_ctx)[-1] == old_fp, what
            caplog.clear()
            assert tls.reload() is False  # same bad content: no second warning on every poll
            assert not caplog.records

        caplog.clear()
        old.key_file.unlink()
        assert tls.reload() is False  # a missing file is not a crash either
        assert tls.reload() is False
        assert len(caplog.records) == 1 and caplog.records[0].levelno == logging.WARNING

        shutil.copy(new.key_file, old.key_file)
        shutil.copy(new.cert_file, old.cert_file)
        assert tls.reload() is True
        new_ctx = client_context(new.ca_file)
        await post_once(url, new_ctx)
        assert handshakes(new_ctx) == [fingerprint(new.cert_file)]


def test_secret_volume_symlink_swap_with_unchanged_mtime(tmp_path: Path) -> None:
    """kubelet's atomic writer: files are symlinks through ``..data``, which is swapped to a new directory."""
    old = write_bundle(SERVICE, NAMESPACE, tmp_path / "..2024_01")
    new = write_bundle(SERVICE, NAMESPACE, tmp_path / "..2024_02")
    for name in ("tls.crt", "tls.key", "ca.crt"):
        st = os.stat(tmp_path / "..2024_01" / name)
        os.utime(tmp_path / "..2024_02" / name, ns=(st.st_atime_ns, st.st_mtime_ns))
        os.symlink(f"..data/{name}", tmp_path / name)
    os.symlink("..2024_01", tmp_path / "..data")

    tls = server_ssl_context(tmp_path / "tls.crt", tmp_path / "tls.key")
    assert tls.fingerprint == fingerprint(old.cert_file)
    assert tls.reload() is False

    os.symlink("..2024_02", tmp_path / "..data_tmp")
    os.replace(tmp_path / "..data_tmp", tmp_path / "..data")
    assert os.stat(tmp_path / "tls.crt").st_mtime_ns == os.stat(old.cert_file).st_mtime_ns
    assert tls.reload() is True
    assert tls.fingerprint == fingerprint(new.cert_file)


def test_unusable_files_at_startup_raise(tmp_path: Path) -> None:
    bundle = write_bundle(SERVICE, NAMESPACE, tmp_path)
    bundle.key_file.write_bytes(b"-----BEGIN PRIVATE KEY-----\n")
    with pytest.raises(ReloadError):
        server_ssl_context(bundle.cert_file, bundle.key_file)


async def _handshake(port: int, ctx: ssl.SSLContext) -> str:
    _reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=ctx, server_hostname=SERVER_NAME)
    version = writer.get_extra_info("ssl_object").version()
    writer.close()
    return version


async def test_tls_1_1_refused_tls_1_2_accepted(tmp_path: Path) -> None:
    bundle = write_bundle(SERVICE, NAMESPACE, tmp_path)
    tls = server_ssl_context(bundle.cert_file, bundle.key_file)
    assert tls.context.minimum_version == ssl.TLSVersion.TLSv1_2

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # ssl.TLSVersion.TLSv1_1 itself is deprecated
        old_client = client_context(bundle.ca_file)
        old_client.minimum_version = old_client.maximum_version = ssl.TLSVersion.TLSv1_1
        old_client.set_ciphers("DEFAULT:@SECLEVEL=0")
        # Control: this client really can speak TLS 1.1 to a server that allows it.
        lax = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        lax.minimum_version = ssl.TLSVersion.TLSv1_1
        lax.set_ciphers("DEFAULT:@SECLEVEL=0")
        lax.load_cert_chain(bundle.cert_file, bundle.key_file)

    servers = [
        await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", 0, ssl=ctx) for ctx in (lax, tls.context)
    ]
    try:
        lax_port, port = (s.sockets[0].getsockname()[1] for s in servers)
        assert await _handshake(lax_port, old_client) == "TLSv1.1"
        with pytest.raises((ssl.SSLError, ConnectionError)):  # alert or reset, depending on timing
            await _handshake(port, old_client)

        tls12 = client_context(bundle.ca_file)
        tls12.maximum_version = ssl.TLSVersion.TLSv1_2
        assert await _handshake(port, tls12) == "TLSv1.2"
    finally:
        for s in servers:
            s.close()
            await s.wait_closed()


async def test_mutual_tls_requires_client_cert_from_client_ca(tmp_path: Path) -> None:
    bundle = write_bundle(SERVICE, NAMESPACE, tmp_path)
    client_ca, other_ca = make_ca("scheduler-client-ca"), make_ca("other-ca")
    files: dict[str, tuple[Path, Path]] = {}
    for name, ca in (("scheduler", client_ca), ("stranger", other_ca)):
        issued = make_client_cert(ca, f"system:{name}")
        cert_file, key_file = tmp_path / f"{name}.crt", tmp_path / f"{name}.key"
        cert_file.write_bytes(issued.cert_pem)
        key_file.write_bytes(issued.key_pem)
        files[name] = (cert_file, key_file)
    client_ca_file = tmp_path / "client-ca.crt"
    client_ca_file.write_bytes(client_ca.cert_pem)

    tls = server_ssl_context(bundle.cert_file, bundle.key_file, client_ca_file)
    assert tls.context.verify_mode == ssl.CERT_REQUIRED
    async with serve(tls) as url:
        with pytest.raises(aiohttp.ClientError):
            await post_once(url, client_context(bundle.ca_file))
        with pytest.raises(aiohttp.ClientError):
            await post_once(url, client_context(bundle.ca_file, *files["stranger"]))
        body = await post_once(url, client_context(bundle.ca_file, *files["scheduler"]))
        assert body["client"] == "system:scheduler"

        # Rotating the client CA file changes which client certificates new connections accept.
        client_ca_file.write_bytes(other_ca.cert_pem)
        assert tls.reload() is True
        body = await post_once(url, client_context(bundle.ca_file, *files["stranger"]))
        assert body["client"] == "system:stranger"
        with pytest.raises(aiohttp.ClientError):
            await post_once(url, client_context(bundle.ca_file, *files["scheduler"]))


# -- the `certs` command and the docs' renewal and rotation, end to end --------------------------------

def certs_cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    out = subprocess.run([*command(), "certs", *args], cwd=cwd or ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out


def verifies(leaf_file: Path, ca_file: Path) -> bool:
    """Does some CA of the bundle `ca_file` sign the certificate, as a TLS client trusting the bundle checks?"""
    leaf = load_cert(leaf_file)
    for ca in x509.load_pem_x509_certificates(ca_file.read_bytes()):
        try:
            leaf.verify_directly_issued_by(ca)
        except (ValueError, TypeError, InvalidSignature):
            continue
        return True
    return False


def healthz_over_tls(port: int, ca_file: Path) -> str:
    """GET /healthz on a fresh TLS connection, verified as the apiserver verifies; the served certificate's
    fingerprint."""
    ctx = ssl.create_default_context(cafile=str(ca_file))
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw, \
            ctx.wrap_socket(raw, server_hostname=SERVER_NAME) as tls:
        tls.sendall(b"GET /healthz HTTP/1.1\r\nHost: webhook\r\nConnection: close\r\n\r\n")
        reply = b""
        while chunk := tls.recv(4096):
            reply += chunk
        assert reply.startswith(b"HTTP/1.1 200"), reply[:100]
        return hashlib.sha256(tls.getpeercert(binary_form=True) or b"").hexdigest()


def test_certs_twice_from_one_ca_and_a_running_server_takes_the_new_leaf(tmp_path: Path) -> None:
    out_dir = tmp_path / "certs"
    first = certs_cli("--service", SERVICE, "--namespace", NAMESPACE, "--out", str(out_dir), "--days", "30",
                      "--write-ca-key")
    assert "issued by: a new CA" in first.stdout
    assert stat.S_IMODE(os.stat(out_dir / "ca.key").st_mode) == 0o600
    ca_pem, first_leaf = (out_dir / "ca.crt").read_bytes(), (out_dir / "tls.crt").read_bytes()
    ca = load_cert(out_dir / "ca.crt")
    # The CA outlives its leaves: ten years against --days 30.
    assert ca.not_valid_after_utc - ca.not_valid_before_utc > dt.timedelta(days=3649)
    assert load_cert(out_dir / "tls.crt").not_valid_after_utc - dt.datetime.now(dt.UTC) \
        < dt.timedelta(days=30, minutes=1)
    shutil.copy(out_dir / "tls.crt", tmp_path / "first.crt")

    server = ServerProcess([
        "serve", "--host", "127.0.0.1", "--port", "0", "--tls-cert", str(out_dir / "tls.crt"), "--tls-key",
        str(out_dir / "tls.key"), "--cert-check-seconds", "0.2"])
    seen: list[str] = []
    failures: list[BaseException] = []
    stop = threading.Event()

    def keep_calling() -> None:
        while not stop.is_set():
            try:
                seen.append(healthz_over_tls(server.port, out_dir / "ca.crt"))
            except BaseException as exc:
                failures.append(exc)
            time.sleep(0.02)

    caller = threading.Thread(target=keep_calling, daemon=True)
    try:
        caller.start()
        while len(seen) < 5 and not failures:
            time.sleep(0.05)
        second = certs_cli("--service", SERVICE, "--namespace", NAMESPACE, "--out", str(out_dir), "--days", "30",
                           "--ca-cert", str(out_dir / "ca.crt"), "--ca-key", str(out_dir / "ca.key"))
        assert f"issued by: the existing CA {out_dir / 'ca.crt'}" in second.stdout
        new_fp = fingerprint(out_dir / "tls.crt")
        deadline = time.monotonic() + 10
        while new_fp not in seen and time.monotonic() < deadline and not failures:
            time.sleep(0.05)
        count = len(seen)
        while len(seen) < count + 5 and not failures:
            time.sleep(0.05)
    finally:
        stop.set()
        caller.join(10)
        assert server.stop() == 0
    assert not failures, failures[:3]
    old_fp = fingerprint(tmp_path / "first.crt")
    assert seen[0] == old_fp and new_fp in seen and seen[-1] == new_fp
    assert seen.index(new_fp) > seen.index(old_fp)
    assert (out_dir / "ca.crt").read_bytes() == ca_pem  # the caBundle is unchanged
    assert (out_dir / "tls.crt").read_bytes() != first_leaf
    assert verifies(tmp_path / "first.crt", out_dir / "ca.crt") and verifies(out_dir / "tls.crt", out_dir / "ca.crt")
    assert server.logged("TLS certificate reloaded") and not server.problems()


INSTALL = ROOT / "docs/install.md"


def doc_block(after: str) -> str:
    """The first ```sh block after the text `after` in docs/install.md."""
    text = INSTALL.read_text()
    start = text.index("```sh\n", text.index(after)) + len("```sh\n")
    return text[start:text.index("```", start)]


def run_doc_lines(block: str, cwd: Path) -> None:
    """The block as written, but for kubectl (there is no cluster here): `model-placement` is our console script."""
    lines = [line for line in block.replace("\\\n", " ").splitlines()
             if line.strip() and not line.lstrip().startswith(("#", "kubectl"))]
    script = "set -euo pipefail\n" + "\n".join(lines)
    shim = cwd / ".bin" / "model-placement"
    shim.parent.mkdir(exist_ok=True)
    shim.write_text(f"#!/bin/sh\nexec {' '.join(command())} \"$@\"\n")
    shim.chmod(0o755)
    env = {**os.environ, "PATH": f"{shim.parent}:{os.environ['PATH']}"}
    out = subprocess.run(["/bin/bash", "-c", script], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, (script, out.stderr)


def steps(block: str) -> list[str]:
    """A block of numbered steps (`# 1. …`) split into its steps."""
    return [part for part in re.split(r"^# \d+\. .*$", block, flags=re.M) if part.strip()]


def test_install_docs_renewal_and_ca_rotation_work_as_written(tmp_path: Path) -> None:
    certs = tmp_path / "manifests/certs"
    run_doc_lines(doc_block("## 2. Generate the certificates"), tmp_path)
    assert sorted(p.name for p in certs.iterdir()) == ["ca.crt", "ca.key", "tls.crt", "tls.key"]
    ca_pem, leaf_pem = (certs / "ca.crt").read_bytes(), (certs / "tls.crt").read_bytes()

    run_doc_lines(doc_block("**Renewing the serving certificate**"), tmp_path)
    assert (certs / "ca.crt").read_bytes() == ca_pem and (certs / "tls.crt").read_bytes() != leaf_pem
    assert verifies(certs / "tls.crt", certs / "ca.crt")
    ReloadingTLS(certs / "tls.crt", certs / "tls.key")  # a pair a server accepts

    rotation = steps(doc_block("**Changing the CA**"))
    assert len(rotation) == 4
    served = tmp_path / "served.crt"
    for n, step in enumerate(rotation, 1):
        shutil.copy(certs / "tls.crt", served)  # what the servers present until the kubelet updates the Secret
        run_doc_lines(step, tmp_path)
        # Between steps every client trusts both what was served and what is served now.
        assert verifies(served, certs / "ca.crt") or n == 4, n
        assert verifies(certs / "tls.crt", certs / "ca.crt"), n
        ReloadingTLS(certs / "tls.crt", certs / "tls.key")
        if n == 2:
            assert len(x509.load_pem_x509_certificates((certs / "ca.crt").read_bytes())) == 2
    assert (certs / "ca.crt").read_bytes() != ca_pem
    assert len(x509.load_pem_x509_certificates((certs / "ca.crt").read_bytes())) == 1
    assert not (tmp_path / "manifests/certs-next").exists()
    new_ca = (certs / "ca.crt").read_bytes()
    run_doc_lines(doc_block("**Renewing the serving certificate**"), tmp_path)  # the next renewal works again
    assert (certs / "ca.crt").read_bytes() == new_ca and verifies(certs / "tls.crt", certs / "ca.crt")
