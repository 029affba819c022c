"""The upstream hop to the backends, on aiohttp (keep-alive pool, the body read as bytes as they arrive): `Upstream`
and its answer, `UpstreamResponse`; what failed, `UpstreamFailed` (before an answer) and `UpstreamError`.

It is the gateway's hot path; `/v1/models` uses httpx. It replaced a hand-written HTTP/1.1 client (httptools parser,
own pool); measured side by side (benchmarks/gateway_overhead.py, 8 alternating runs each, 2 shared cores), aiohttp
adds 0.96 ms p50 against 0.78 ms and reaches 0.78× the direct throughput against 0.84×: within the noise of a run
(0.66-1.07×), and not worth owning an HTTP client for.
"""

from __future__ import annotations

import asyncio

import aiohttp
import httpx
import yarl
from aiohttp.helpers import get_env_proxy_for_url
from starlette.responses import Response


class UpstreamFailed(Exception):
    """The backend failed before producing any output; `kind` is the `UpstreamError` kind when the hop broke."""

    def __init__(self, detail: str, kind: str = "") -> None:
        super().__init__(detail)
        self.kind = kind


class UpstreamError(Exception):
    """The upstream hop failed: `kind` names how (ConnectError, ConnectTimeout, ReadTimeout, ReadError,
    RemoteProtocolError)."""

    def __init__(self, kind: str, detail: str = "") -> None:
        super().__init__(f"{kind}: {detail}" if detail else kind)
        self.kind = kind


def _kind(e: BaseException, answered: bool) -> str:
    """The `UpstreamError` kind of an aiohttp failure (`answered`: the status line and headers were in)."""
    if isinstance(e, aiohttp.ConnectionTimeoutError):
        return "ConnectTimeout"
    if isinstance(e, aiohttp.ClientConnectorError | aiohttp.ClientSSLError):
        return "ConnectError"
    if isinstance(e, TimeoutError):  # aiohttp.SocketTimeoutError, or the relay's shortened read
        return "ReadTimeout"
    if isinstance(e, aiohttp.ServerDisconnectedError) and not answered:
        return "RemoteProtocolError"
    if isinstance(e, aiohttp.ClientResponseError):  # not HTTP (the parser's errors)
        return "RemoteProtocolError"
    return "ReadError"


class UpstreamResponse:
    """A backend's answer: status and headers at once, the body as it arrives."""

    def __init__(self, resp: aiohttp.ClientResponse, first_byte_at: float, read_timeout: float) -> None:
        self.resp = resp
        self.status_code = resp.status
        self.headers = resp.raw_headers
        self.first_byte_at = first_byte_at  # (loop time) the body's first piece is due by then
        self.read_timeout = read_timeout  # between pieces; the relay shortens it to drain after [DONE]
        self._started = False
        self._content = resp.content
        self.closed = False

    def header(self, name: bytes) -> bytes | None:
        for k, v in self.headers:
            if k.lower() == name:
                return v
        return None

    async def next_chunk(self) -> bytes | None:
        """The next piece of the body (all that has arrived), or None at its end."""
        if self._started:
            timeout = self.read_timeout
        else:
            timeout = max(0.0, self.first_byte_at - asyncio.get_running_loop().time())
        self._started = True
        content = self._content
        try:
            if content.is_eof() or getattr(content, "_buffer", None):  # NOTE: it has arrived: nothing waits, no timer
                data = await content.readany()
            else:
                async with asyncio.timeout(timeout):
                    data = await content.readany()
        except (aiohttp.ClientError, TimeoutError) as e:
            raise UpstreamError(_kind(e, True), str(e)) from None
        return data or None

    async def read(self) -> bytes:
        parts = []
        while (chunk := await self.next_chunk()) is not None:
            parts.append(chunk)
        return b"".join(parts)

    def close(self) -> None:
        """Back to the pool if the answer was read to its end on a reusable connection, else closed."""
        if not self.closed:
            self.closed = True
            if self._content.at_eof():
                self.resp.release()
            else:
                self.resp.close()


class Upstream:
    """The gateway's client for the backends (aiohttp, keep-alive pool): `await post(url, path, body, headers)`.
    A backend behind an HTTP(S) proxy named in the environment (HTTP(S)_PROXY, NO_PROXY) is reached through it."""

    def __init__(
        self,
        connect_timeout: float,
        read_timeout: float,
        max_connections: int = 0,
        first_byte_timeout: float | None = None,
    ) -> None:
        """Timeouts: `connect_timeout` to open a connection, `first_byte_timeout` (default: `read_timeout`) from
        sending until the status line, headers and the body's first piece are in (a non-streamed answer comes whole),
        `read_timeout` between pieces."""
        self.connect_timeout, self.read_timeout = connect_timeout, read_timeout
        self.first_byte_timeout = read_timeout if first_byte_timeout is None else first_byte_timeout
        self.max_connections = max_connections  # 0: no limit
        self._session: aiohttp.ClientSession | None = None
        self._retired: list[aiohttp.ClientSession] = []  # replaced by `configure`, closed at `aclose`
        self._timeout = aiohttp.ClientTimeout(
            total=None, connect=connect_timeout, sock_connect=connect_timeout, sock_read=None
        )
        self._proxies: dict[str, tuple[yarl.URL | None, aiohttp.BasicAuth | None]] = {}

    def configure(
        self, connect_timeout: float, read_timeout: float, first_byte_timeout: float, max_connections: int
    ) -> None:
        """New settings for the requests sent from now on (a live reload); those in flight keep theirs. A new
        connect timeout or connection limit takes a new connection pool: the old one's requests finish on it, its idle
        connections expire, and it is closed at `aclose`."""
        self.read_timeout, self.first_byte_timeout = read_timeout, first_byte_timeout
        if (connect_timeout, max_connections) != (self.connect_timeout, self.max_connections):
            self.connect_timeout, self.max_connections = connect_timeout, max_connections
            self._timeout = aiohttp.ClientTimeout(
                total=None, connect=connect_timeout, sock_connect=connect_timeout, sock_read=None
            )
            if self._session is not None:
                self._retired.append(self._session)
                self._session = None

    def session(self) -> aiohttp.ClientSession:
        """Made on first use: it belongs to the running loop."""
        if self._session is None:
            # NOTE: httpx's TLS context, so backends are verified as /v1/models (httpx) verifies them (certifi,
            # SSL_CERT_FILE/DIR)
            connector = aiohttp.TCPConnector(
                limit=self.max_connections, limit_per_host=0, ssl=httpx.create_ssl_context()
            )
            # NOTE: no cookie jar: a backend's cookies must not travel to other tenants' requests
            self._session = aiohttp.ClientSession(
                connector=connector, timeout=self._timeout, auto_decompress=False, cookie_jar=aiohttp.DummyCookieJar()
            )
        return self._session

    def proxy(self, url: str) -> tuple[yarl.URL | None, aiohttp.BasicAuth | None]:
        """The environment's proxy for a backend, looked up once per backend.

        NOTE: not `trust_env=True`: aiohttp then reads the proxy settings and ~/.netrc again in a worker thread on
        every request (two thread hops), which multiplied the hop's CPU time by 4."""
        found = self._proxies.get(url)
        if found is None:
            try:
                found = get_env_proxy_for_url(yarl.URL(url))
            except LookupError:
                found = (None, None)
            self._proxies[url] = found
        return found

    async def post(self, url: str, path: str, body: bytes, headers: list[tuple[str, str]]) -> UpstreamResponse:
        """Send; return once the status line and headers are in.

        aiohttp retries a kept-alive connection that the backend closed in the meantime only for idempotent
        methods; a POST that meets a closed connection before any answer (ServerDisconnectedError, or a reset) is
        retried here, once, on a new connection."""
        session = self.session()
        proxy, proxy_auth = self.proxy(url)
        retried = False
        sent = asyncio.get_running_loop().time()
        while True:
            try:
                async with asyncio.timeout(self.first_byte_timeout):
                    resp = await session.post(
                        url + path, data=body, headers=headers, proxy=proxy, proxy_auth=proxy_auth
                    )
            except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError, aiohttp.ClientConnectionResetError) as e:
                if retried or isinstance(e, aiohttp.ClientConnectorError):
                    raise UpstreamError(_kind(e, False), str(e)) from None
                retried = True
                continue
            except (aiohttp.ClientError, TimeoutError) as e:
                raise UpstreamError(_kind(e, False), str(e)) from None
            return UpstreamResponse(resp, sent + self.first_byte_timeout, self.read_timeout)

    async def aclose(self) -> None:
        for session in [*self._retired, self._session]:
            if session is not None:
                await session.close()


def passthrough(resp: UpstreamResponse, content: bytes, request_id: str) -> Response:
    """The backend's answer as it came, with the request's id."""
    media = resp.header(b"content-type")
    return Response(
        content,
        status_code=resp.status_code,
        media_type=media.decode("latin-1") if media is not None else "application/json",
        headers={"X-Request-Id": request_id},
    )
