"""TLS material: generate a CA + serving certificate, and serve it with hot reload on rotation."""

from certs.generate import (
    Bundle,
    Issued,
    load_ca,
    make_ca,
    make_client_cert,
    make_serving_cert,
    run_certs_command,
    service_dns_names,
    write_bundle,
)
from certs.reload import ReloadError, ReloadingTLS, check_tls_files, server_ssl_context

__all__ = [
    "Bundle",
    "Issued",
    "ReloadError",
    "ReloadingTLS",
    "check_tls_files",
    "load_ca",
    "make_ca",
    "make_client_cert",
    "make_serving_cert",
    "run_certs_command",
    "server_ssl_context",
    "service_dns_names",
    "write_bundle",
]
