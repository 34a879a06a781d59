"""A TLS client context that records the server certificate of every handshake it completes."""

from __future__ import annotations

import hashlib
import ssl
from pathlib import Path


class _RecordingSSLObject(ssl.SSLObject):
    """Records the server certificate of every completed client handshake on its context."""

    def do_handshake(self) -> None:
        super().do_handshake()  # raises SSLWantReadError until the handshake is done
        der = self.getpeercert(binary_form=True)
        self.context.handshakes.append(hashlib.sha256(der).hexdigest())  # type: ignore[attr-defined]


def client_context(ca_file: Path, cert_file: Path | None = None, key_file: Path | None = None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(ca_file))
    ctx.verify_flags |= ssl.VERIFY_X509_STRICT  # closer to Go's crypto/x509 than OpenSSL's lenient default
    if cert_file is not None:
        ctx.load_cert_chain(cert_file, key_file)
    ctx.sslobject_class = _RecordingSSLObject
    ctx.handshakes = []  # type: ignore[attr-defined]
    return ctx


def handshakes(ctx: ssl.SSLContext) -> list[str]:
    return ctx.handshakes  # type: ignore[attr-defined, no-any-return]
