"""Self-signed TLS material for the webhook and the extender.

A throwaway ECDSA P-256 CA signs one serving certificate valid for the in-cluster Service names. The apiserver
verifies the webhook against ``clientConfig.caBundle`` and the name ``<svc>.<ns>.svc``; kube-scheduler verifies
the extender the same way and can authenticate itself with a client certificate (``make_client_cert``).
"""

from __future__ import annotations

import base64
import datetime as dt
import ipaddress
import logging
import os
import re
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

log = logging.getLogger("model_placement.certs")

CERT_FILE = "tls.crt"
KEY_FILE = "tls.key"
CA_FILE = "ca.crt"
CA_KEY_FILE = "ca.key"
CA_DAYS = 3650  # the CA outlives many serving certificates: renewing one must not change the caBundle

# Clock skew between this host and the apiserver must not make a fresh certificate "not yet valid".
_BACKDATE = dt.timedelta(minutes=5)
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


@dataclass(frozen=True)
class Issued:
    """A certificate and its private key."""

    cert: x509.Certificate
    key: ec.EllipticCurvePrivateKey

    @property
    def cert_pem(self) -> bytes:
        return self.cert.public_bytes(serialization.Encoding.PEM)

    @property
    def key_pem(self) -> bytes:
        return self.key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )


@dataclass(frozen=True)
class Bundle:
    """What ``write_bundle`` wrote, and the value for ``clientConfig.caBundle``."""

    cert_file: Path
    key_file: Path
    ca_file: Path
    ca_bundle_b64: str
    not_after: dt.datetime


def service_dns_names(service: str, namespace: str) -> list[str]:
    """The names a client may use for a Service; the apiserver uses ``<svc>.<ns>.svc``."""
    return [
        service,
        f"{service}.{namespace}",
        f"{service}.{namespace}.svc",
        f"{service}.{namespace}.svc.cluster.local",
    ]


def _general_names(names: Iterable[str]) -> list[x509.GeneralName]:
    out: list[x509.GeneralName] = []
    for name in dict.fromkeys(names):  # de-duplicate, keep order
        try:
            out.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            out.append(x509.DNSName(name))
    return out


def _validity(days: int) -> tuple[dt.datetime, dt.datetime]:
    if days < 1:
        raise ValueError(f"days must be >= 1, got {days}")
    now = dt.datetime.now(dt.UTC)
    return now - _BACKDATE, now + dt.timedelta(days=days)


def _leaf(
    ca: Issued,
    common_name: str,
    days: int,
    usages: list[x509.ObjectIdentifier],
    sans: Iterable[str],
) -> Issued:
    key = ec.generate_private_key(ec.SECP256R1())
    not_before, not_after = _validity(days)
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
        .issuer_name(ca.cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(signs_certificates=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca.key.public_key()), critical=False
        )
    )
    general_names = _general_names(sans)
    if general_names:
        builder = builder.add_extension(x509.SubjectAlternativeName(general_names), critical=False)
    return Issued(builder.sign(ca.key, hashes.SHA256()), key)


def _key_usage(signs_certificates: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=True, content_commitment=False, key_encipherment=False, data_encipherment=False,
        key_agreement=False, key_cert_sign=signs_certificates, crl_sign=signs_certificates,
        encipher_only=False, decipher_only=False,
    )


def make_ca(common_name: str = "model-placement-ca", days: int = CA_DAYS) -> Issued:
    """A self-signed ECDSA P-256 CA (basicConstraints CA:true, keyCertSign)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    not_before, not_after = _validity(days)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(signs_certificates=True), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return Issued(cert, key)


def make_serving_cert(
    ca: Issued,
    service: str,
    namespace: str,
    days: int = 365,
    extra_sans: Iterable[str] = (),
) -> Issued:
    """A certificate for the Service's DNS names plus ``extra_sans`` (DNS names or IP addresses). It
    carries clientAuth too: the secondary kube-scheduler presents the same Secret to the extender."""
    names = service_dns_names(service, namespace)
    return _leaf(ca, names[2], days, [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH],
                 [*names, *extra_sans])


def make_client_cert(ca: Issued, common_name: str, days: int = 365) -> Issued:
    """A clientAuth certificate, e.g. for kube-scheduler calling the extender over mutual TLS."""
    return _leaf(ca, common_name, days, [ExtendedKeyUsageOID.CLIENT_AUTH], ())


def write_file_atomic(path: Path, data: bytes, mode: int = 0o644) -> None:
    """Write via a temporary file and rename, so a reader never sees a half-written file."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        os.fchmod(fd, mode)  # O_CREAT's mode is masked by the umask and ignored if tmp already existed
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def load_ca(cert_file: str | os.PathLike[str], key_file: str | os.PathLike[str]) -> Issued:
    """An existing CA, to issue a new serving certificate under the same caBundle. ValueError names the file."""
    paths = Path(cert_file), Path(key_file)
    data = []
    for role, path in zip(("--ca-cert", "--ca-key"), paths):
        try:
            data.append(path.read_bytes())
        except OSError as exc:
            raise ValueError(f"cannot read the CA {role[5:]} ({role}) {path}: {exc.strerror or exc}") from None
    try:
        cert = x509.load_pem_x509_certificate(data[0])
    except ValueError:
        raise ValueError(f"--ca-cert {paths[0]} holds no PEM certificate") from None
    try:
        key = serialization.load_pem_private_key(data[1], password=None)
    except (ValueError, TypeError):
        raise ValueError(f"--ca-key {paths[1]} holds no unencrypted PEM private key") from None
    if not isinstance(key, (ec.EllipticCurvePrivateKey, rsa.RSAPrivateKey)):
        raise ValueError(f"--ca-key {paths[1]} is a {type(key).__name__}; an ECDSA or RSA key can sign")
    spki = serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    if key.public_key().public_bytes(*spki) != cert.public_key().public_bytes(*spki):
        raise ValueError(f"--ca-key {paths[1]} is not the key of the CA certificate {paths[0]}")
    try:
        is_ca = cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    except x509.ExtensionNotFound:
        is_ca = False
    if not is_ca:
        raise ValueError(f"--ca-cert {paths[0]} is not a CA certificate (no basicConstraints CA:true)")
    if cert.not_valid_after_utc <= dt.datetime.now(dt.UTC):
        raise ValueError(f"--ca-cert {paths[0]} expired on {cert.not_valid_after_utc:%Y-%m-%d}: make a new CA "
                         "(and roll the caBundle as docs/install.md describes)")
    return Issued(cert, key)  # type: ignore[arg-type]


def write_bundle(
    service: str,
    namespace: str,
    out_dir: str | os.PathLike[str],
    days: int = 365,
    extra_sans: Iterable[str] = (),
    ca: Issued | None = None,
    write_ca_key: bool = False,
    ca_days: int = CA_DAYS,
) -> Bundle:
    """Issue a serving certificate from `ca` (else from a new CA, valid `ca_days`); write ``tls.crt``,
    ``tls.key`` (0600) and ``ca.crt``, and a new CA's key as ``ca.key`` (0600) only with `write_ca_key`."""
    for what, value in (("service", service), ("namespace", namespace)):
        if not _DNS_LABEL.match(value):
            raise ValueError(f"{what} {value!r} is not a DNS-1123 label")
    new_ca = ca is None
    if ca is None:
        ca = make_ca(days=ca_days)
    leaf = make_serving_cert(ca, service, namespace, days, extra_sans)
    if leaf.cert.not_valid_after_utc > ca.cert.not_valid_after_utc:
        raise ValueError(f"a {days}-day serving certificate would outlive its CA (valid until "
                         f"{ca.cert.not_valid_after_utc:%Y-%m-%d}): lower --days or make a new CA")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    bundle = Bundle(
        cert_file=out / CERT_FILE,
        key_file=out / KEY_FILE,
        ca_file=out / CA_FILE,
        ca_bundle_b64=base64.b64encode(ca.cert_pem).decode("ascii"),
        not_after=leaf.cert.not_valid_after_utc,
    )
    # Each file is replaced atomically; between the renames a reloader sees a key that does not match the
    # certificate, refuses it and retries on its next poll.
    if new_ca and write_ca_key:
        write_file_atomic(out / CA_KEY_FILE, ca.key_pem, 0o600)
    write_file_atomic(bundle.key_file, leaf.key_pem, 0o600)
    write_file_atomic(bundle.cert_file, leaf.cert_pem)
    write_file_atomic(bundle.ca_file, ca.cert_pem)
    log.info(
        "wrote TLS bundle",
        extra={
            "service": service,
            "namespace": namespace,
            "dir": str(out),
            "not_after": bundle.not_after.isoformat(),
        },
    )
    return bundle


def run_certs_command(
    service: str,
    namespace: str,
    out_dir: str | os.PathLike[str],
    days: int = 365,
    *,
    ca_cert: str | None = None,
    ca_key: str | None = None,
    write_ca_key: bool = False,
    ca_days: int = CA_DAYS,
    extra_sans: Iterable[str] = (),
) -> int:
    """``model-placement certs``: write the bundle, print a summary and the ``caBundle`` line; exit status."""
    try:
        ca = load_ca(ca_cert, ca_key) if ca_cert and ca_key else None
        bundle = write_bundle(service, namespace, out_dir, days, extra_sans, ca=ca, write_ca_key=write_ca_key,
                              ca_days=ca_days)
    except ValueError as exc:
        print(f"model-placement: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"model-placement: cannot write the TLS bundle to {out_dir}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    ca_text = f"the existing CA {ca_cert}" if ca_cert else "a new CA"
    print(f"wrote {bundle.cert_file}, {bundle.key_file} (0600), {bundle.ca_file}"
          + (f", {Path(out_dir) / CA_KEY_FILE} (0600)" if write_ca_key and not ca_cert else ""))
    print(f"issued by: {ca_text}" + ("" if ca_cert or write_ca_key else
                                     " (its key was not kept: renew with --write-ca-key next time, "
                                     "or the caBundle changes)"))
    print(f"valid for: {', '.join(dict.fromkeys([*service_dns_names(service, namespace), *extra_sans]))}")
    print(f"expires: {bundle.not_after.isoformat()}")
    print(f"caBundle: {bundle.ca_bundle_b64}")
    return 0
