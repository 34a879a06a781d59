"""A server ``ssl.SSLContext`` that picks up rotated certificate files without restarting the listener.

How: the context handed to ``web.TCPSite`` is only the *base*. Its ``sni_callback`` runs on every ClientHello
(with or without SNI, TLS 1.2 and 1.3) and moves the new connection onto the newest fully loaded context
(``SSLObject.context = ...``, i.e. ``SSL_set_SSL_CTX``). Established connections keep the certificate they
negotiated. ``reload()`` polls the files by content hash, not mtime: kubelet and cert-manager swap secret volumes
through a ``..data`` symlink, which a stat of the file path may not reveal. A new context is built off to the side;
if the files are missing, half-written or the key does not match, the old one keeps serving.

Protocol version and client-certificate requirement come from the base context (OpenSSL copies them into each
connection before the callback runs), so they are fixed at construction; the client CA *store* does follow reloads.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import hashlib
import logging
import os
import ssl
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization

log = logging.getLogger("model_placement.certs")

DEFAULT_INTERVAL = 10.0  # seconds; controller-runtime's certwatcher polls at the same rate


class ReloadError(Exception):
    """The certificate files could not be turned into a serving context."""


class ReloadingTLS:
    """Serving TLS context plus a reloader; pass ``.context`` to ``web.TCPSite(ssl_context=...)``."""

    def __init__(
        self,
        cert_file: str | os.PathLike[str],
        key_file: str | os.PathLike[str],
        client_ca_file: str | os.PathLike[str] | None = None,
        *,
        interval: float = DEFAULT_INTERVAL,
    ) -> None:
        self.cert_file = Path(cert_file)
        self.key_file = Path(key_file)
        self.client_ca_file = Path(client_ca_file) if client_ca_file is not None else None
        self.interval = interval
        self._task: asyncio.Task[None] | None = None
        self._problem: object = None  # the rotation problem last warned about
        # The first load must succeed: without a certificate there is nothing to serve.
        digest, ctx, cert = self._load()
        self._digest = digest
        self._base = ctx
        self._base.sni_callback = self._select
        self._current = ctx
        self._cert = cert
        log.info("serving TLS certificate", extra={"cert_file": str(self.cert_file), **self._describe()})

    @property
    def context(self) -> ssl.SSLContext:
        """The listener's context; stays the same object across reloads."""
        return self._base

    @property
    def not_after(self) -> dt.datetime:
        """Expiry (UTC) of the certificate new handshakes present."""
        return self._cert.not_valid_after_utc

    @property
    def fingerprint(self) -> str:
        """SHA-256 of the DER certificate new handshakes present, hex."""
        return self._cert.fingerprint(hashes.SHA256()).hex()

    def reload(self) -> bool:
        """Check the files once; install them if they changed and are valid. True when a new cert went live."""
        try:
            digest = self._digest_files()
        except OSError as exc:
            self._warn_once(("unreadable", str(exc)), "TLS files unreadable, keeping current certificate", exc)
            return False
        if digest == self._digest or digest == self._problem:
            return False
        try:
            new_digest, ctx, cert = self._load()
        except ReloadError as exc:
            with contextlib.suppress(OSError):
                if self._digest_files() != digest:
                    return False  # caught mid-rotation (e.g. new key, old cert); retry on the next poll
            self._warn_once(digest, "rotated TLS files are invalid, keeping current certificate", exc)
            return False
        if new_digest != digest:
            return False  # files changed while we read them; pick them up on the next poll
        self._digest, self._current, self._cert, self._problem = digest, ctx, cert, None
        log.info("TLS certificate reloaded", extra=self._describe())
        return True

    def _warn_once(self, problem: object, message: str, exc: Exception) -> None:
        """Log a rotation problem once, not on every poll while it persists."""
        if problem != self._problem:
            self._problem = problem
            log.warning(message, extra={"error": str(exc), "cert_file": str(self.cert_file), **self._describe()})

    def _describe(self) -> dict[str, str]:
        return {
            "fingerprint": self.fingerprint,
            "serial": format(self._cert.serial_number, "x"),
            "not_after": self.not_after.isoformat(),
        }

    async def start(self) -> None:
        """Poll every ``interval`` seconds in a background task until ``stop()``."""
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="tls-reloader")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            try:
                self.reload()
            except Exception:  # the reloader must never take the server down
                log.exception("TLS reload failed unexpectedly")

    def _select(self, conn: ssl.SSLObject | ssl.SSLSocket, server_name: str | None, ctx: ssl.SSLContext) -> None:
        current = self._current
        if current is not ctx:
            conn.context = current

    def _paths(self) -> list[Path]:
        return [self.cert_file, self.key_file, *([self.client_ca_file] if self.client_ca_file else [])]

    def _digest_files(self) -> bytes:
        h = hashlib.sha256()
        for path in self._paths():
            data = path.read_bytes()
            h.update(len(data).to_bytes(8, "big"))
            h.update(data)
        return h.digest()

    def _load(self) -> tuple[bytes, ssl.SSLContext, x509.Certificate]:
        """Build a fresh context from the files; return the content digest read *after* loading, so a caller
        can tell whether the files moved underneath it."""
        cert = check_tls_files(self.cert_file, self.key_file, self.client_ca_file)
        try:
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.minimum_version = ssl.TLSVersion.TLSv1_2
            ctx.load_cert_chain(self.cert_file, self.key_file)
            if self.client_ca_file is not None:
                ctx.load_verify_locations(cafile=self.client_ca_file)
                ctx.verify_mode = ssl.CERT_REQUIRED
            digest = self._digest_files()
        except (OSError, ValueError) as exc:  # ssl.SSLError is an OSError
            raise ReloadError(f"TLS files {self.cert_file}, {self.key_file} cannot be served: {exc}") from exc
        expiry = cert.not_valid_after_utc
        if expiry <= dt.datetime.now(dt.UTC):
            log.warning("serving certificate has expired", extra={"not_after": expiry.isoformat()})
        return digest, ctx, cert


def _read(path: Path, role: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise ReloadError(f"cannot read the {role} {path}: {exc.strerror or exc}") from None


def _pem_kinds(data: bytes) -> str:
    kinds = sorted({line[11:-5].decode("ascii", "replace") for line in data.splitlines()
                    if line.startswith(b"-----BEGIN ") and line.endswith(b"-----")})
    return ", ".join(kinds) or "no PEM block"


def check_tls_files(
    cert_file: str | os.PathLike[str] | None,
    key_file: str | os.PathLike[str] | None,
    client_ca_file: str | os.PathLike[str] | None = None,
) -> x509.Certificate:
    """The serving certificate, once the files are known to be a certificate and its own private key;
    otherwise a ReloadError that names the file and what is wrong with it (the classic mis-mounted Secret:
    a CA certificate where the key should be, or the key of an earlier certificate)."""
    if cert_file is None or key_file is None:
        raise ReloadError("TLS needs both --tls-cert and --tls-key (or --insecure-http for plain HTTP)")
    cert_path, key_path = Path(cert_file), Path(key_file)
    cert_pem, key_pem = _read(cert_path, "TLS certificate (--tls-cert)"), _read(key_path, "TLS key (--tls-key)")
    try:
        cert = x509.load_pem_x509_certificates(cert_pem)[0]
    except (ValueError, IndexError):
        raise ReloadError(f"TLS certificate (--tls-cert) {cert_path} holds no PEM certificate "
                          f"(found: {_pem_kinds(cert_pem)})") from None
    try:
        key = serialization.load_pem_private_key(key_pem, password=None)
    except (ValueError, TypeError, UnsupportedAlgorithm):
        raise ReloadError(f"TLS key (--tls-key) {key_path} holds no unencrypted PEM private key "
                          f"(found: {_pem_kinds(key_pem)})") from None
    same = serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    if key.public_key().public_bytes(*same) != cert.public_key().public_bytes(*same):
        raise ReloadError(f"TLS key (--tls-key) {key_path} is not the key of the certificate in {cert_path} "
                          f"(subject {cert.subject.rfc4514_string()}): the two files are from different pairs")
    if client_ca_file is not None:
        ca_path = Path(client_ca_file)
        ca_pem = _read(ca_path, "client CA (--client-ca)")
        try:
            x509.load_pem_x509_certificates(ca_pem)
        except ValueError:
            raise ReloadError(f"client CA (--client-ca) {ca_path} holds no PEM certificate "
                              f"(found: {_pem_kinds(ca_pem)})") from None
    return cert


def server_ssl_context(
    cert_file: str | os.PathLike[str],
    key_file: str | os.PathLike[str],
    client_ca_file: str | os.PathLike[str] | None = None,
    *,
    interval: float = DEFAULT_INTERVAL,
) -> ReloadingTLS:
    """Load the files (raises ``ReloadError`` if they are unusable) and return the reloading context."""
    return ReloadingTLS(cert_file, key_file, client_ca_file, interval=interval)
