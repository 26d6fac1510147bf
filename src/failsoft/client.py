"""The Python SDK of a failsoft gateway: inference over KServe v2, and failover notifications.

::

    from failsoft.client import Client

    with Client("http://127.0.0.1:8000") as client:
        result = client.infer("cam-1", batch, timeout=2.0)   # batch: (N, 64) float32, or one (64,) row
        print(result.predictions, result.server, result.variant, result.degraded)
        top = client.infer("cam-1", batch, classification=3)  # the gateway ranks the classes
        print(top.classes[0])                                 # ((7, 11.2), (1, 4.0), (9, 2.5)): row 0
        for event in client.events(app="cam-1"):              # failure / failover / upgrade / restore
            print(event["type"], event["server"], event["variant"])

:class:`AsyncClient` has the same methods as coroutines (``async for event in client.events()``).

An answer says how it was served: ``variant`` and ``server``, ``degraded`` (a smaller variant than
the primary stands in, FailLite's accuracy-for-availability trade), ``reconstructed`` (decoded by
ParM from parity instead of computed by the app's own model), ``dropped`` (the request was shed by a
lazy drop and not computed at all) and ``attempts`` (more than one when a failover happened under the
request).

The admin API (``status``, ``admin`` for chaos, ``recoveries``) lives on its own port: give its URL
as ``admin_url`` (``Session.client()`` and ``failsoft.runtime.discovery`` know it) and the admin
token as ``token``, which is sent to the admin URL only. ``verify`` / ``admin_verify`` are httpx's:
``True`` (the system's CAs), or a CA bundle or self-signed certificate file for an HTTPS gateway.

``classification=K`` asks for Triton's classification extension: the gateway answers with the ``K``
best classes of each row instead of the logits (an output of datatype ``BYTES``, shape ``[N, K]``,
each string ``"score:index"``), and the answer's ``classes`` holds them as ``(index, score)`` pairs,
best first; ``outputs`` is then ``None``. Errors are
failsoft errors: a refused request is :class:`~failsoft.errors.InvalidRequestError` (with the
gateway's message and ``status``), no route before the deadline :class:`~failsoft.errors.NoRouteError`,
a timeout :class:`~failsoft.errors.DeadlineExceededError`, an unreachable gateway
:class:`~failsoft.errors.ServerUnavailableError`.
"""

from __future__ import annotations

import json
import ssl
import time
from collections.abc import AsyncIterator, Generator, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import numpy as np

from failsoft.errors import (
    ConfigError,
    DeadlineExceededError,
    InvalidRequestError,
    NoRouteError,
    ServerUnavailableError,
    ServingError,
)

DEFAULT_URL = "http://127.0.0.1:8000"
SLACK_S = 5.0
# Idle connections are given up after this long, before a server closes them (uvicorn's default
# keep-alive is 5 s, httpx's expiry 5 s too): with both at 5 s, a request sent on a connection the
# server is closing that instant fails with a reset, which a POST cannot safely retry.
KEEPALIVE_EXPIRY_S = 2.0
BINARY_ABOVE = 4096  # tensors with this many values or more travel as raw bytes (Triton's extension)
OUTPUT = "output"  # the output the classification parameter is attached to


Classes = tuple[tuple[tuple[int, float], ...], ...]  # per row: (class index, score), best first


@dataclass(frozen=True)
class InferResult:
    """One answer: what the model said, and how the gateway served it.

    ``outputs`` are the logits (shape ``[N, classes]``), or ``None`` when the request asked for
    ``classification=K``: ``classes`` then holds each row's ``K`` best ``(index, score)`` pairs.
    """

    app: str
    outputs: np.ndarray | None
    variant: str | None  # None only from a gateway that does not say
    server: str | None
    degraded: bool
    reconstructed: bool
    accuracy: float | None
    kind: str | None
    attempts: int
    latency_ms: float
    raw: dict[str, Any] = field(repr=False)
    classes: Classes | None = None
    dropped: bool = False

    @property
    def predictions(self) -> np.ndarray:
        """The predicted class of each row."""
        if self.classes is not None:
            return np.asarray([row[0][0] for row in self.classes], dtype=np.int64)
        assert self.outputs is not None
        return self.outputs.argmax(axis=1)


def request_kwargs(
    array: Any,
    timeout: float | None,
    request_id: str | None,
    classification: int | None = None,
    parameters: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """httpx keyword arguments for an infer request: JSON, or Triton's binary form for big tensors."""
    arr = np.asarray(array, dtype=np.float32)
    if arr.ndim == 1:
        arr = arr[None, :]
    tensor: dict[str, Any] = {"name": "input", "shape": list(arr.shape), "datatype": "FP32"}
    header: dict[str, Any] = {"inputs": [tensor]}
    if classification is not None:
        header["outputs"] = [{"name": OUTPUT, "parameters": {"classification": _top_k(classification)}}]
    params = dict(parameters or {})
    if timeout is not None:
        params["timeout"] = timeout
    if params:
        header["parameters"] = params
    if request_id is not None:
        header["id"] = request_id
    if arr.size < BINARY_ABOVE:
        tensor["data"] = arr.ravel().tolist()
        return {"json": header}
    raw = np.ascontiguousarray(arr, dtype="<f4").tobytes()
    tensor["parameters"] = {"binary_data_size": len(raw)}
    head = json.dumps(header).encode()
    headers = {"Inference-Header-Content-Length": str(len(head)), "Content-Type": "application/octet-stream"}
    return {"content": head + raw, "headers": headers}


def _top_k(k: Any) -> int:
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ConfigError(f"classification must be a whole number of classes >= 1, got {k!r}")
    return k


def _result(app: str, response: httpx.Response, started: float) -> InferResult:
    body = checked_body(response)
    try:
        params = body.get("parameters") or {}
        if params.get("dropped") and not body["outputs"]:  # shed to keep others in their SLO: no outputs
            classes, outputs = None, None
        else:
            out = body["outputs"][0]
            classes = parse_classification(out) if out.get("datatype") == "BYTES" else None
            outputs = None
            if classes is None:
                outputs = np.asarray(out["data"], np.float32).reshape(out["shape"])
    except (KeyError, IndexError, TypeError, ValueError, AttributeError) as exc:
        raise ServingError(f"gateway answered with a malformed infer response: {exc!r}") from exc
    return InferResult(
        app=app,
        outputs=outputs,
        variant=params.get("variant", body.get("model_version")),
        server=params.get("server"),
        degraded=bool(params.get("degraded", False)),
        reconstructed=bool(params.get("reconstructed", False)),
        accuracy=params.get("accuracy"),
        kind=params.get("kind"),
        attempts=int(params.get("attempts", 1)),
        latency_ms=(time.perf_counter() - started) * 1000.0,
        raw=body,
        classes=classes,
        dropped=bool(params.get("dropped", False)),
    )


def parse_classification(output: dict[str, Any]) -> Classes:
    """Triton's classification output (``BYTES``, shape ``[N, K]``, each ``"score:index"``, or
    ``"score:index:label"``) as ``(index, score)`` pairs per row, best first."""
    rows, k = (int(d) for d in output["shape"])
    data = output["data"]
    if len(data) != rows * k:
        raise ValueError(f"classification output of shape [{rows}, {k}] holds {len(data)} strings")
    pairs = []
    for entry in data:
        score, index, *_label = str(entry).split(":")
        pairs.append((int(index), float(score)))
    return tuple(tuple(sorted(pairs[r * k : (r + 1) * k], key=lambda p: -p[1])) for r in range(rows))


def checked_body(response: httpx.Response) -> Any:
    """The JSON body of a 2xx response; the failsoft error a non-2xx one stands for."""
    try:
        body = response.json()
    except json.JSONDecodeError:
        body = {"error": response.text[:200]}
    if response.is_success:
        return body
    message = body.get("error", str(body)) if isinstance(body, dict) else str(body)
    status = response.status_code
    if status == 503:
        raise NoRouteError(message)
    if status == 504:
        raise DeadlineExceededError(message)
    if 400 <= status < 500:
        raise InvalidRequestError(message, status)
    raise ServingError(f"gateway error {status}: {message}")


def _ws_url(url: str, app: str | None) -> str:
    base = url.replace("https://", "wss://", 1).replace("http://", "ws://", 1).rstrip("/")
    return f"{base}/v2/events" + (f"?app={app}" if app else "")


Verify = bool | str


def _ssl(verify: Verify) -> bool | ssl.SSLContext:
    """httpx's ``verify``: a file names the CA bundle (or self-signed certificate) to trust."""
    return ssl.create_default_context(cafile=verify) if isinstance(verify, str) else verify


def _admin_headers(token: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"} if token else {}


def _no_admin(url: str) -> ConfigError:
    return ConfigError(
        f"no admin URL for the gateway at {url}: the admin API has its own port; pass admin_url "
        "(Session.client() and failsoft.runtime.discovery.find_gateway() give it)"
    )


IDEMPOTENT = frozenset({"GET", "HEAD", "OPTIONS"})


def _request(http: httpx.Client, method: str, path: str, **kwargs: Any) -> httpx.Response:
    """One request; an idempotent one is sent once more when the server closed the kept-alive
    connection before answering (the request never reached the app: a busy server's idle timeout
    met our reuse of the connection), so a status poll does not fail for it."""
    try:
        return http.request(method, path, **kwargs)
    except httpx.RemoteProtocolError:
        if method not in IDEMPOTENT:
            raise
        return http.request(method, path, **kwargs)


async def _arequest(http: httpx.AsyncClient, method: str, path: str, **kwargs: Any) -> httpx.Response:
    """:func:`_request` for the asyncio client."""
    try:
        return await http.request(method, path, **kwargs)
    except httpx.RemoteProtocolError:
        if method not in IDEMPOTENT:
            raise
        return await http.request(method, path, **kwargs)


def _transport_error(exc: httpx.HTTPError, url: str) -> Exception:
    if isinstance(exc, httpx.TimeoutException):
        return DeadlineExceededError(f"no answer from the gateway at {url}: {exc}")
    return ServerUnavailableError(f"cannot reach the gateway at {url}: {exc}")


class Client:
    """A synchronous client (httpx) of one gateway: its inference plane, and its admin plane."""

    def __init__(
        self,
        url: str = DEFAULT_URL,
        timeout: float = 30.0,
        token: str | None = None,
        admin_url: str | None = None,
        verify: Verify = True,
        admin_verify: Verify | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        self.admin_url = None if admin_url is None else admin_url.rstrip("/")
        self.timeout = timeout
        limits = httpx.Limits(keepalive_expiry=KEEPALIVE_EXPIRY_S)
        self._http = httpx.Client(
            base_url=self.url, timeout=timeout + SLACK_S, limits=limits, verify=_ssl(verify)
        )
        self._admin = None
        if self.admin_url is not None:
            self._admin = httpx.Client(
                base_url=self.admin_url,
                timeout=timeout + SLACK_S,
                headers=_admin_headers(token),
                verify=_ssl(verify if admin_verify is None else admin_verify),
            )

    def _send(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            return _request(self._http, method, path, **kwargs)
        except httpx.TransportError as exc:  # timeouts included
            raise _transport_error(exc, self.url) from exc

    def _send_admin(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        if self._admin is None:
            raise _no_admin(self.url)
        try:
            return _request(self._admin, method, path, **kwargs)
        except httpx.TransportError as exc:  # timeouts included
            raise _transport_error(exc, str(self.admin_url)) from exc

    def infer(
        self,
        app: str,
        array: Any,
        timeout: float | None = None,
        request_id: str | None = None,
        classification: int | None = None,
        parameters: dict[str, Any] | None = None,
    ) -> InferResult:
        """Ask ``app`` about ``array``; ``classification=K``: its ``K`` best classes per row;
        ``parameters``: the request's further parameters (an slo service's ``client``, ...)."""
        started = time.perf_counter()
        extra = {"timeout": timeout + SLACK_S} if timeout else {}
        request = request_kwargs(array, timeout, request_id, classification, parameters)
        return _result(app, self._send("POST", f"/v2/models/{app}/infer", **request, **extra), started)

    def generate(self, model: str, text: str, **parameters: Any) -> dict[str, Any]:
        """Triton's generate extension (an ``llm`` service): the whole ``text_output`` and its
        ``parameters`` (worker, finish_reason, ttft_ms, tpot_ms, recoveries)."""
        body = {"text_input": text, "parameters": parameters}
        return checked_body(self._send("POST", f"/v2/models/{model}/generate", json=body))

    def generate_stream(
        self, model: str, text: str, **parameters: Any
    ) -> Generator[dict[str, Any], None, None]:
        """The generation as it streams (Server-Sent Events): dicts with ``text_output`` (a chunk);
        the last one also has ``parameters``. Leaving the loop early closes the stream, which frees
        the request's KV on its worker. Bad input raises before the first chunk."""
        body = {"text_input": text, "parameters": parameters}
        try:
            with self._http.stream("POST", f"/v2/models/{model}/generate_stream", json=body) as response:
                if not response.is_success:
                    response.read()
                    checked_body(response)
                for line in response.iter_lines():
                    if line.startswith("data:"):
                        event = json.loads(line[5:])
                        if "error" in event:
                            raise ServingError(f"generation failed: {event['error']}")
                        yield event
        except httpx.TransportError as exc:  # timeouts included
            raise _transport_error(exc, self.url) from exc

    def live(self) -> bool:
        return self._send("GET", "/v2/health/live").is_success

    def ready(self) -> bool:
        return self._send("GET", "/v2/health/ready").is_success

    def model(self, app: str) -> dict[str, Any]:
        return checked_body(self._send("GET", f"/v2/models/{app}"))

    def repository_index(self) -> list[dict[str, Any]]:
        return checked_body(self._send("POST", "/v2/repository/index", json={}))

    def status(self) -> dict[str, Any]:
        """The cluster's state (admin: needs the token)."""
        return checked_body(self._send_admin("GET", "/admin/status"))

    def admin(self, action: str, **body: Any) -> dict[str, Any]:
        """``/admin/chaos/<action>`` (kill, hang, resume, slow, break, evict), a JSON body; admin
        token needed."""
        return checked_body(self._send_admin("POST", f"/admin/chaos/{action}", json=body))

    def recoveries(self) -> dict[str, Any]:
        """Measured recoveries (detection to first answer) and recent events (admin token needed)."""
        return checked_body(self._send_admin("GET", "/admin/recoveries"))

    def deploy(
        self,
        config: dict[str, Any],
        source: str = "deploy",
        base_dir: str | None = None,
        dry_run: bool = False,
    ) -> dict[str, Any]:
        """Deploy a config (parsed YAML) to the running cluster (admin token needed): its plan and
        the new config version; a config that cannot be applied raises ConfigError, nothing changed."""
        body = {"config": config, "source": source, "base_dir": base_dir, "dry_run": dry_run}
        return checked_body(self._send_admin("POST", "/admin/deploy", json=body))

    def deploy_status(self) -> dict[str, Any]:
        """The config version served and the last deploy, under way or done (admin token needed)."""
        return checked_body(self._send_admin("GET", "/admin/deploy"))

    def load_model(self, app: str, version: int | None = None) -> dict[str, Any]:
        """Triton's repository load (admin plane): roll ``app`` out to ``version`` of its variant
        (the latest in the repository when None); answered once the rolling update is accepted."""
        body = {"parameters": {} if version is None else {"version": version}}
        return checked_body(self._send_admin("POST", f"/v2/repository/models/{app}/load", json=body))

    def unload_model(self, app: str) -> dict[str, Any]:
        """Triton's repository unload (admin plane): ``app`` is drained, then unloaded and removed."""
        return checked_body(self._send_admin("POST", f"/v2/repository/models/{app}/unload", json={}))

    def events(self, app: str | None = None, open_timeout: float = 10.0) -> Iterator[dict[str, Any]]:
        """Events as they happen (blocking iterator); ``app`` keeps that app's (and cluster) events."""
        from websockets.exceptions import WebSocketException
        from websockets.sync.client import connect

        try:
            with connect(_ws_url(self.url, app), open_timeout=open_timeout) as ws:
                for message in ws:
                    yield json.loads(message)
        except (OSError, WebSocketException) as exc:
            raise ServerUnavailableError(f"event stream of {self.url} closed: {exc}") from exc

    def close(self) -> None:
        self._http.close()
        if self._admin is not None:
            self._admin.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncClient:
    """The asyncio twin of :class:`Client` (httpx.AsyncClient), for many requests in flight."""

    def __init__(
        self,
        url: str = DEFAULT_URL,
        timeout: float = 30.0,
        token: str | None = None,
        max_connections: int = 64,
        admin_url: str | None = None,
        verify: Verify = True,
        admin_verify: Verify | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        self.admin_url = None if admin_url is None else admin_url.rstrip("/")
        self.timeout = timeout
        limits = httpx.Limits(
            max_connections=max_connections,
            max_keepalive_connections=max_connections,
            keepalive_expiry=KEEPALIVE_EXPIRY_S,
        )
        self._http = httpx.AsyncClient(
            base_url=self.url, timeout=timeout + SLACK_S, limits=limits, verify=_ssl(verify)
        )
        self._admin = None
        if self.admin_url is not None:
            self._admin = httpx.AsyncClient(
                base_url=self.admin_url,
                timeout=timeout + SLACK_S,
                headers=_admin_headers(token),
                verify=_ssl(verify if admin_verify is None else admin_verify),
            )

    async def _send(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            return await _arequest(self._http, method, path, **kwargs)
        except httpx.TransportError as exc:  # timeouts included
            raise _transport_error(exc, self.url) from exc

    async def _send_admin(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        if self._admin is None:
            raise _no_admin(self.url)
        try:
            return await _arequest(self._admin, method, path, **kwargs)
        except httpx.TransportError as exc:  # timeouts included
            raise _transport_error(exc, str(self.admin_url)) from exc

    async def infer(
        self,
        app: str,
        array: Any,
        timeout: float | None = None,
        request_id: str | None = None,
        classification: int | None = None,
        parameters: dict[str, Any] | None = None,
    ) -> InferResult:
        started = time.perf_counter()
        extra = {"timeout": timeout + SLACK_S} if timeout else {}
        request = request_kwargs(array, timeout, request_id, classification, parameters)
        return _result(app, await self._send("POST", f"/v2/models/{app}/infer", **request, **extra), started)

    async def live(self) -> bool:
        return (await self._send("GET", "/v2/health/live")).is_success

    async def ready(self) -> bool:
        return (await self._send("GET", "/v2/health/ready")).is_success

    async def status(self) -> dict[str, Any]:
        return checked_body(await self._send_admin("GET", "/admin/status"))

    async def admin(self, action: str, **body: Any) -> dict[str, Any]:
        return checked_body(await self._send_admin("POST", f"/admin/chaos/{action}", json=body))

    async def recoveries(self) -> dict[str, Any]:
        return checked_body(await self._send_admin("GET", "/admin/recoveries"))

    async def events(
        self, app: str | None = None, open_timeout: float = 10.0
    ) -> AsyncIterator[dict[str, Any]]:
        from websockets.asyncio.client import connect
        from websockets.exceptions import WebSocketException

        try:
            async with connect(_ws_url(self.url, app), open_timeout=open_timeout) as ws:
                async for message in ws:
                    yield json.loads(message)
        except (OSError, WebSocketException) as exc:
            raise ServerUnavailableError(f"event stream of {self.url} closed: {exc}") from exc

    async def aclose(self) -> None:
        await self._http.aclose()
        if self._admin is not None:
            await self._admin.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
