"""The TLS policy of the real command, `model-placement serve | webhook | extender` run as a subprocess:
TLS 1.2 and 1.3 only; no plaintext listener unless `--insecure-http` (without TLS flags it refuses to
start); with `--client-ca` the extender refuses clients without a certificate from that CA (kube-scheduler
authenticates to extenders only with client certificates) and serves those with one."""

from __future__ import annotations

import asyncio
import json
import ssl
import warnings
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from certs import make_ca, make_client_cert, write_bundle
from tests.support.extender import DEMO_NODES, FILTER_KEYS, model_pod
from tests.support.payloads import fixture_text
from tests.support.process import ServerProcess
from tests.support.servers import NAMESPACE, SERVER_NAME, SERVICE

LOCAL = ["--host", "127.0.0.1", "--port", "0", "--drain-seconds", "0"]


@pytest.fixture(scope="module")
def tls_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tls")
    write_bundle(SERVICE, NAMESPACE, out, extra_sans=("127.0.0.1",))
    return out


@pytest.fixture
def started() -> Iterator[list[ServerProcess]]:
    servers: list[ServerProcess] = []
    yield servers
    for server in servers:
        server.kill()


def start(servers: list[ServerProcess], *args: str, wait: bool = True) -> ServerProcess:
    server = ServerProcess([*args, *LOCAL], wait=wait)
    servers.append(server)
    return server


def tls_args(tls_dir: Path) -> list[str]:
    return ["--tls-cert", str(tls_dir / "tls.crt"), "--tls-key", str(tls_dir / "tls.key")]


def client(ca: Path, version: ssl.TLSVersion | None = None, cert: tuple[Path, Path] | None = None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(ca))
    if version is not None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # TLSv1 and TLSv1_1 themselves are deprecated
            ctx.minimum_version = ctx.maximum_version = version
        if version < ssl.TLSVersion.TLSv1_2:
            ctx.set_ciphers("DEFAULT:@SECLEVEL=0")  # let OpenSSL offer the old protocol at all
    if cert is not None:
        ctx.load_cert_chain(*cert)
    return ctx


async def negotiated(port: int, ctx: ssl.SSLContext) -> str:
    """The protocol of a completed handshake, after one HTTP exchange on it (a TLS 1.3 server checks the
    client certificate after the client thinks the handshake is over)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=ctx, server_hostname=SERVER_NAME)
    try:
        version = writer.get_extra_info("ssl_object").version()
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        await writer.drain()
        head = await asyncio.wait_for(reader.read(64), 10)
        if not head.startswith(b"HTTP/1.1 200"):
            raise ConnectionError(f"no answer over {version}: {head!r}")
        return str(version)
    finally:
        writer.close()


async def refused(port: int, ctx: ssl.SSLContext) -> None:
    with pytest.raises((ssl.SSLError, ConnectionError)):
        await negotiated(port, ctx)


async def plaintext(port: int) -> bytes:
    """What a plain HTTP request to the port gets back (b"" when the peer just closes)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        await writer.drain()
        return await asyncio.wait_for(reader.read(), 10)
    except ConnectionError:
        return b""
    finally:
        writer.close()


# ------------------------------------------------------------------------------------------- tests


@pytest.mark.parametrize("flags", [[], ["--tls-cert", "x.crt"], ["--tls-key", "x.key"]],
                         ids=["no-tls-flags", "cert-only", "key-only"])
def test_without_tls_material_or_insecure_http_nothing_listens(started: list[ServerProcess],
                                                               flags: list[str]) -> None:
    server = start(started, "webhook", *flags, wait=False)
    assert server.wait(30) == 2
    assert server.logged("listening") == []
    # The CLI's one sentence, as for any other bad flag (not a JSON log line: nothing was started yet).
    said = [e["msg"].strip() for e in server.lines if e.get("level") == "raw"]
    assert "model-placement: TLS is required: give --tls-cert and --tls-key (or --insecure-http for plain HTTP)" \
        in said, server.lines


async def test_tls_1_2_and_1_3_only_and_no_plaintext_on_the_port(started: list[ServerProcess],
                                                                  tls_dir: Path) -> None:
    server = start(started, "serve", *tls_args(tls_dir))
    assert [e["path"] for e in server.logged("listening")] == [f"https://127.0.0.1:{server.port}"]
    ca = tls_dir / "ca.crt"
    assert await negotiated(server.port, client(ca, ssl.TLSVersion.TLSv1_2)) == "TLSv1.2"
    assert await negotiated(server.port, client(ca, ssl.TLSVersion.TLSv1_3)) == "TLSv1.3"
    assert await negotiated(server.port, client(ca)) == "TLSv1.3"  # what a modern client gets
    for old in (ssl.TLSVersion.TLSv1, ssl.TLSVersion.TLSv1_1):
        await refused(server.port, client(ca, old))

    answer = await plaintext(server.port)
    assert not answer.startswith(b"HTTP/"), answer  # nothing speaks HTTP without TLS here
    async with aiohttp.ClientSession() as session:
        with pytest.raises(aiohttp.ClientError):
            async with session.get(f"http://127.0.0.1:{server.port}/healthz"):
                pass
    assert server.stop() == 0


async def test_the_old_protocols_are_refused_by_the_server_not_by_this_client(tls_dir: Path) -> None:
    """Control for the test above: this client does complete TLS 1.0/1.1 with a server that allows them."""
    lax = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        lax.minimum_version = ssl.TLSVersion.TLSv1
    lax.set_ciphers("DEFAULT:@SECLEVEL=0")
    lax.load_cert_chain(tls_dir / "tls.crt", tls_dir / "tls.key")

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0, ssl=lax)
    try:
        port = server.sockets[0].getsockname()[1]
        for old, name in ((ssl.TLSVersion.TLSv1, "TLSv1"), (ssl.TLSVersion.TLSv1_1, "TLSv1.1")):
            assert await negotiated(port, client(tls_dir / "ca.crt", old)) == name
    finally:
        server.close()
        await server.wait_closed()


async def test_insecure_http_is_plain_http_only_when_asked(started: list[ServerProcess], tls_dir: Path) -> None:
    server = start(started, "webhook", "--insecure-http", *tls_args(tls_dir))
    assert [e["path"] for e in server.logged("listening")] == [f"http://127.0.0.1:{server.port}"]
    assert any("ignoring --tls-cert" in e["msg"] for e in server.lines if e.get("level") == "warning")
    assert (await plaintext(server.port)).startswith(b"HTTP/1.1 200")
    await refused(server.port, client(tls_dir / "ca.crt"))
    assert server.stop() == 0


@pytest.mark.parametrize("host, warned", [("127.0.0.1", False), ("0.0.0.0", True)])
def test_plain_http_off_loopback_is_warned_of(started: list[ServerProcess], host: str, warned: bool) -> None:
    # The manifests' extender sidecar runs plain HTTP on loopback; the same flag on another address is reachable
    # from outside the pod, which the operator must hear about.
    server = ServerProcess(["extender", "--insecure-http", "--host", host, "--port", "0", "--drain-seconds", "0"])
    started.append(server)
    warnings = [e for e in server.lines if e.get("level") == "warning" and "non-loopback" in e["msg"]]
    assert bool(warnings) is warned, server.lines
    if warned:
        assert warnings[0]["reason"] == "--insecure-http with --host 0.0.0.0"
    assert server.stop() == 0


async def test_extender_with_client_ca_admits_only_certificates_from_that_ca(
        started: list[ServerProcess], tls_dir: Path, tmp_path: Path) -> None:
    scheduler_ca, stranger_ca = make_ca("kube-scheduler-client-ca"), make_ca("some-other-ca")
    (tmp_path / "client-ca.crt").write_bytes(scheduler_ca.cert_pem)
    certs: dict[str, tuple[Path, Path]] = {}
    for name, ca in (("scheduler", scheduler_ca), ("stranger", stranger_ca)):
        issued = make_client_cert(ca, f"system:{name}")
        certs[name] = (tmp_path / f"{name}.crt", tmp_path / f"{name}.key")
        certs[name][0].write_bytes(issued.cert_pem)
        certs[name][1].write_bytes(issued.key_pem)
    server = start(started, "extender", *tls_args(tls_dir), "--client-ca", str(tmp_path / "client-ca.crt"))
    ca = tls_dir / "ca.crt"

    for version in (ssl.TLSVersion.TLSv1_2, ssl.TLSVersion.TLSv1_3):
        await refused(server.port, client(ca, version))  # no client certificate
        await refused(server.port, client(ca, version, certs["stranger"]))  # not from the client CA
        assert await negotiated(server.port, client(ca, version, certs["scheduler"])) == \
            {ssl.TLSVersion.TLSv1_2: "TLSv1.2", ssl.TLSVersion.TLSv1_3: "TLSv1.3"}[version]

    # kube-scheduler's own call, with its certificate: the extender answers in the wire format.
    body = json.dumps({"Pod": model_pod(), "Nodes": None, "NodeNames": DEMO_NODES}).encode()
    url = f"https://127.0.0.1:{server.port}/filter"
    async with aiohttp.ClientSession() as session:
        async with session.post(url, data=body, headers={"Content-Type": "application/json"},
                                ssl=client(ca, cert=certs["scheduler"]), server_hostname=SERVER_NAME) as resp:
            assert resp.status == 200
            assert set(await resp.json()) == FILTER_KEYS
        with pytest.raises(aiohttp.ClientError):
            async with session.post(url, data=body, headers={"Content-Type": "application/json"},
                                    ssl=client(ca), server_hostname=SERVER_NAME) as resp:
                await resp.read()
    assert server.stop() == 0
    assert server.problems() == []


async def test_webhook_without_client_ca_needs_no_client_certificate(started: list[ServerProcess],
                                                                     tls_dir: Path) -> None:
    """The apiserver presents no client certificate to webhooks by default: without --client-ca none is asked."""
    server = start(started, "webhook", *tls_args(tls_dir))
    assert await negotiated(server.port, client(tls_dir / "ca.crt")) == "TLSv1.3"
    body = fixture_text("ar-pod-kserve-rs.json").encode()
    async with (aiohttp.ClientSession() as session,
                session.post(f"https://127.0.0.1:{server.port}/mutate?timeout=10s", data=body,
                             headers={"Content-Type": "application/json"},
                             ssl=client(tls_dir / "ca.crt"), server_hostname=SERVER_NAME) as resp):
        assert resp.status == 200 and (await resp.json())["response"]["allowed"] is True
    assert server.stop() == 0
