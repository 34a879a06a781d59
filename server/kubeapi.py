"""Kubernetes API access through the official client: its configuration, auth and TLS; bodies as raw JSON.

The generated model classes are bypassed on purpose (``param_serialize`` + ``call_api`` give the urllib3 response
unread, the ``_preload_content=False`` path): deserializing a pod list into models costs ~8x ``orjson.loads``.
The client is synchronous, so the watches run it in threads; calls made while serving a request (``LoopApi``) go
through aiohttp on the event loop instead, with the same host, credentials and TLS.
"""

from __future__ import annotations

import ssl
import time
from collections.abc import Callable
from typing import Any, Protocol
from urllib.parse import quote

import aiohttp
import orjson
import urllib3
from kubernetes import client, config

DEFAULT_TIMEOUT = (10.0, 60.0)  # (connect, read) seconds
AUTH_SECONDS = 10.0  # how long LoopApi sends one credential before asking the client for it again


class _Answer(Protocol):
    status: int
    reason: str | None


class KubeApiError(Exception):
    """A non-2xx answer from the apiserver, carrying its ``Status`` (code, reason, message) when it sent one."""

    def __init__(self, status: int, reason: str, message: str, *, context: str = "") -> None:
        self.status = status
        self.reason = reason
        self.message = message
        text = f"{status} {reason}: {message}" if message else f"{status} {reason}"
        super().__init__(f"{context}: {text}" if context else text)

    @classmethod
    def from_response(cls, resp: _Answer, body: bytes, *, context: str = "") -> KubeApiError:
        reason, message = resp.reason or "", ""
        try:
            doc = orjson.loads(body)
        except orjson.JSONDecodeError:
            message = body[:500].decode("utf-8", "replace").strip()
        else:
            if isinstance(doc, dict):
                reason = doc.get("reason") or reason
                message = doc.get("message") or ""
        return cls(resp.status, reason, message, context=context)


class BindError(KubeApiError):
    """The apiserver refused a pod binding (409: already assigned / UID mismatch / being deleted; 404: no pod)."""


class EvictionError(KubeApiError):
    """The apiserver refused an eviction (429: a PodDisruptionBudget allows no disruption now; 404: no pod;
    409: the uid precondition failed, the pod was re-created)."""


def make_api_client(
    kubeconfig: str | None = None, in_cluster: bool = False, *, context: str | None = None
) -> client.ApiClient:
    """An ``ApiClient`` from a kubeconfig (``None``: ``$KUBECONFIG``, ``~/.kube/config``) or the service account."""
    cfg = client.Configuration()
    if in_cluster:
        config.load_incluster_config(client_configuration=cfg)
    else:
        config.load_kube_config(config_file=kubeconfig, context=context, client_configuration=cfg)
    cfg.keep_alive = True  # TCP keepalive: notice a vanished apiserver on an idle watch
    # four long-lived watches plus lists and binds share one pool
    cfg.connection_pool_maxsize = max(cfg.connection_pool_maxsize or 0, 16)
    return client.ApiClient(cfg)


def request(
    api_client: client.ApiClient,
    method: str,
    path: str,
    *,
    query: dict[str, Any] | None = None,
    body: Any = None,
    timeout: float | tuple[float, float] | None = DEFAULT_TIMEOUT,
) -> urllib3.BaseHTTPResponse:
    """Send one request with the client's host, auth and TLS; return the urllib3 response unread, any status.

    The caller reads (or streams) the body and then calls ``release_conn()`` (fully read) or ``close()``.
    """
    headers = {"Accept": "application/json"}
    if body is not None:
        headers["Content-Type"] = "application/json"
    params = [(k, _query_value(v)) for k, v in (query or {}).items() if v is not None]
    serialized = api_client.param_serialize(
        method=method, resource_path=path, query_params=params, header_params=headers, body=body,
        auth_settings=["BearerToken"],
    )
    return api_client.call_api(*serialized, _request_timeout=timeout).response


def _ssl_context(cfg: client.Configuration) -> ssl.SSLContext:
    """What the client's urllib3 pool verifies and presents, for aiohttp."""
    ctx = ssl.create_default_context(cafile=cfg.ssl_ca_cert, cadata=cfg.ca_cert_data)
    if cfg.cert_file:
        ctx.load_cert_chain(cfg.cert_file, cfg.key_file)
    if not cfg.verify_ssl:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    elif cfg.assert_hostname is False:
        ctx.check_hostname = False
    return ctx


class LoopApi:
    """The apiserver from the event loop: ``api_client``'s host, credentials and TLS, over one aiohttp pool of
    keep-alive connections. kube-scheduler waits on /bind's API call; in a worker thread it paid the hop and the
    thread contended for the GIL with the loop answering /filter and /prioritize. Create and use on the loop."""

    def __init__(self, api_client: client.ApiClient, clock: Callable[[], float] = time.monotonic) -> None:
        cfg = api_client.configuration
        self._clock = clock
        self._config = cfg
        # Read once: the client's `host` and `param_serialize` scan the environment for proxies on every call.
        self._host = cfg.host.rstrip("/")
        self._default_headers = dict(api_client.default_headers)
        self._proxy = cfg.proxy or None
        self._server_name = cfg.tls_server_name or None
        self._auth: dict[str, str] = {}
        self._auth_until = 0.0
        self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(
            ssl=_ssl_context(cfg) if self._host.startswith("https:") else False,
            limit=cfg.connection_pool_maxsize or 16))

    def _headers(self, content_type: str | None) -> dict[str, str]:
        now = self._clock()
        if now >= self._auth_until:
            # A rotated ServiceAccount token is re-read here (the loaders' refresh hooks), at most every
            # AUTH_SECONDS: each refresh also re-sets the client's host, which scans the environment for proxies,
            # a millisecond per call at a bind per scheduling cycle. The in-cluster loader itself re-reads the token
            # file at most once a minute, and the kubelet rotates it long before the old one expires.
            self._auth = {a["key"]: str(a["value"]) for a in self._config.auth_settings().values()}
            self._auth_until = now + AUTH_SECONDS
        headers = {**self._default_headers, "Accept": "application/json", **self._auth}
        if content_type:
            headers["Content-Type"] = content_type
        return headers

    async def call(self, method: str, path: str, *, body: Any = None, error: type[KubeApiError] = KubeApiError,
                   context: str = "", timeout: float, connect_timeout: float,
                   content_type: str = "application/json") -> bytes:
        """The body of a 2xx answer within `timeout` seconds; otherwise `error` with the apiserver's message.
        TimeoutError when it did not answer in time (it may still act on the request); ConnectionError when the
        connection failed."""
        try:
            async with self._session.request(
                    method, self._host + path, headers=self._headers(content_type if body is not None else None),
                    data=None if body is None else orjson.dumps(body), proxy=self._proxy,
                    server_hostname=self._server_name,
                    timeout=aiohttp.ClientTimeout(total=timeout, sock_connect=min(connect_timeout, timeout))) as resp:
                data = await resp.read()
        except aiohttp.ConnectionTimeoutError as exc:  # a TimeoutError, but nothing was sent
            raise ConnectionError(f"cannot reach the apiserver at {self._host}: {exc}") from None
        except TimeoutError:
            raise
        except aiohttp.ClientConnectionError as exc:
            raise ConnectionError(f"cannot reach the apiserver at {self._host}: {exc or type(exc).__name__}") from None
        if not 200 <= resp.status < 300:
            raise error.from_response(resp, data, context=context or f"{method} {path}")
        return data

    async def close(self) -> None:
        await self._session.close()


def _query_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


def _body(resp: urllib3.BaseHTTPResponse, error: type[KubeApiError], context: str) -> bytes:
    """The whole body of a 2xx answer; otherwise `error` carrying the apiserver's Status message."""
    try:
        data = resp.read()
    finally:
        resp.release_conn()
    if not 200 <= resp.status < 300:
        raise error.from_response(resp, data, context=context)
    return data


def get_json(api_client: client.ApiClient, path: str, *, query: dict[str, Any] | None = None,
             timeout: float | tuple[float, float] | None = DEFAULT_TIMEOUT) -> Any:
    """GET ``path`` and return the parsed JSON; raise ``KubeApiError`` on a non-2xx answer."""
    resp = request(api_client, "GET", path, query=query, timeout=timeout)
    return orjson.loads(_body(resp, KubeApiError, f"GET {path}"))


def pod_path(namespace: str, name: str) -> str:
    return f"/api/v1/namespaces/{quote(namespace, safe='')}/pods/{quote(name, safe='')}"


async def bind_pod(api: LoopApi, namespace: str, name: str, uid: str | None, node: str,
                   annotations: dict[str, str] | None = None, *, timeout: float, connect_timeout: float) -> None:
    """Bind a pod to a node (``POST pods/{name}/binding``), as kube-scheduler's DefaultBinder does.

    ``uid`` (``metadata.uid`` of the Binding) is a precondition the apiserver checks, so a pod deleted and
    re-created under the same name since it was scheduled is not bound by mistake. Raises ``BindError`` with the
    apiserver's message, e.g. 409 ``Operation cannot be fulfilled on pods/binding "p": pod p is already assigned
    to node "n"``.

    ``annotations`` land on the pod in the same write: the apiserver merges a Binding's metadata.annotations into
    the pod's (BindingREST.setPodNodeAndMetadata in pkg/registry/core/pod/storage), so what the binding records
    costs no second request and can never be missing from a bound pod.
    """
    meta: dict[str, Any] = {"name": name, "namespace": namespace}
    if uid:
        meta["uid"] = uid
    if annotations:
        meta["annotations"] = annotations
    binding = {"apiVersion": "v1", "kind": "Binding", "metadata": meta,
               "target": {"apiVersion": "v1", "kind": "Node", "name": node}}
    await api.call("POST", pod_path(namespace, name) + "/binding", body=binding, error=BindError,
                   context=f"binding pod {namespace}/{name} to node {node} failed", timeout=timeout,
                   connect_timeout=connect_timeout)


async def patch_pod_status(api: LoopApi, namespace: str, name: str, uid: str, status: dict[str, Any], *,
                           timeout: float, connect_timeout: float) -> None:
    """Merge ``status`` into the pod's (``PATCH pods/{name}/status``, a strategic merge patch: conditions merge by
    type, the others are kept), as kube-scheduler writes its PodScheduled condition. ``uid`` must be the pod's:
    one re-created under the same name is refused, not patched."""
    await api.call("PATCH", pod_path(namespace, name) + "/status",
                   body={"metadata": {"uid": uid}, "status": status}, context=f"patching the status of pod "
                   f"{namespace}/{name}", timeout=timeout, connect_timeout=connect_timeout,
                   content_type="application/strategic-merge-patch+json")


def evict_pod(api_client: client.ApiClient, namespace: str, name: str, uid: str, *,
              timeout: float | tuple[float, float] | None = DEFAULT_TIMEOUT) -> None:
    """Evict a pod through the Eviction API (``POST pods/{name}/eviction``, policy/v1), which honours its
    PodDisruptionBudgets and its termination grace period, unlike a plain delete; ``uid`` is a precondition, so a
    pod re-created under the same name is not evicted instead. Raises ``EvictionError`` with the apiserver's
    message, e.g. 429 ``Cannot evict pod as it would violate the pod's disruption budget.``"""
    eviction = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name, "namespace": namespace},
                "deleteOptions": {"preconditions": {"uid": uid}}}
    resp = request(api_client, "POST", pod_path(namespace, name) + "/eviction", body=eviction, timeout=timeout)
    _body(resp, EvictionError, f"evicting pod {namespace}/{name}")
