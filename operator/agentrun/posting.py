"""HTTP/1.1 requests with a body on kept-alive connections of asyncio's own transports.

Why: for every request aiohttp builds a ClientRequest with its header multidict, URL, timers, trace
hooks, payload writer and ClientResponse; measured alone against one local server that is ~250 µs of
the client's CPU per POST, against ~80 µs here (docs/benchmarks.md, #32), and the model request and
the API writes (a status patch, a transcript Secret) are the largest costs of an iteration. This
client does the part of HTTP/1.1 those requests need: the request as one write, a response framed by
Content-Length, chunked transfer coding or the connection's end, gzip or deflate content coding,
interim 1xx answers skipped, connections kept alive and reused up to a limit and an idle expiry,
addresses resolved once per ten seconds as aiohttp's resolver caches them. What it does not do
(proxies, other content codings) stays on aiohttp: the callers (model/direct_calling.py,
kube/writing.py) choose.

Failures are the builtin ones the caller translates once: TimeoutError (connect, pool or read
timeout), OSError (refused, reset, closed early: ConnectionError and IncompleteAnswer among them).
"""

from __future__ import annotations

import asyncio
import collections
import socket
import ssl
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import cast

from yarl import URL

#: Content codings a response may come in (what the SDK's accept-encoding asks for).
CODINGS = frozenset({"gzip", "x-gzip", "deflate", "identity"})
#: Seconds a resolved address list is used before it is resolved again (aiohttp's default DNS cache).
RESOLVED_SECONDS = 10.0
#: The longest status line and header block read before the answer is refused.
MAX_HEAD = 64 * 1024


class IncompleteAnswer(ConnectionError):
    """The connection ended, or sent what is not HTTP/1.1, before the answer was whole."""


@dataclass(frozen=True)
class Answer:
    status: int
    reason: str
    headers: Mapping[str, str]
    """Names lower-cased; a repeated header's values joined with ", " (how a Mapping can hold them)."""
    body: bytes
    """Decoded from its content coding."""

    @property
    def charset(self) -> str | None:
        for part in self.headers.get("content-type", "").split(";")[1:]:
            name, _, value = part.strip().partition("=")
            if name.lower() == "charset":
                return value.strip().strip('"') or None
        return None


@dataclass(frozen=True)
class Timeouts:
    """aiohttp's phases, as the SDK's aiohttp transport sets them from the client's timeout."""

    pool: float | None  # waiting for a free connection, and opening one
    connect: float | None  # opening one
    read: float | None  # the longest silence while the answer arrives


class _Connection(asyncio.Protocol):
    """One connection; one request on it at a time, its answer parsed as it arrives."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.used_at = 0.0
        self._buffer = bytearray()
        self._answer: asyncio.Future[Answer] | None = None
        # The read timeout is a silence: one timer per answer, moved on only when it fires (a timer
        # rescheduled on every chunk was 2% of the operator's CPU at 1000 runs).
        self._silence: asyncio.TimerHandle | None = None
        self._read_timeout = 0.0
        self._heard_at = 0.0
        self._reset()

    def _reset(self) -> None:
        self._status = 0
        self._reason = ""
        self._headers: dict[str, str] = {}
        self._reusable = True
        self._length: int | None = None  # bytes of body still to come (framed by Content-Length)
        self._chunked = False
        self._chunks: list[bytes] = []  # neither chunked nor a length: framed by the connection's end
        self._eof = False

    # asyncio.Protocol ---------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's are not asyncio.Transport's subclasses

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        if self._answer is None or self._answer.done():
            return
        if self._silence is not None:
            self._heard_at = asyncio.get_running_loop().time()
        try:
            self._parse()
        except IncompleteAnswer as exc:
            self._fail(exc)

    def eof_received(self) -> bool:
        self._eof = True
        if self._answer is not None and not self._answer.done():
            try:
                self._parse()
            except IncompleteAnswer as exc:
                self._fail(exc)
        return False  # the transport closes itself

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self._answer is not None and not self._answer.done():
            self._eof = True
            try:
                self._parse()
            except IncompleteAnswer as failure:
                self._fail(failure)
            if not self._answer.done():
                self._fail(IncompleteAnswer("the connection was lost before the answer was whole"))

    # One exchange --------------------------------------------------------------------------------

    async def exchange(self, request: tuple[bytes, bytes], read_timeout: float | None) -> Answer:
        loop = asyncio.get_running_loop()
        if self.closed or self.transport is None or self.transport.is_closing():
            raise IncompleteAnswer("the connection closed before the request was sent")
        self._reset()
        answer: asyncio.Future[Answer] = loop.create_future()
        self._answer = answer
        self.transport.writelines(request)
        if read_timeout is not None:
            self._read_timeout, self._heard_at = read_timeout, loop.time()
            self._silence = loop.call_at(self._heard_at + read_timeout, self._silent)
        try:
            if self._buffer:
                self._parse()
            return await answer
        finally:
            if self._silence is not None:
                self._silence.cancel()
                self._silence = None

    def _silent(self) -> None:
        """The silence timer fired: the answer failed if nothing came for the whole read timeout."""
        if self._answer is None or self._answer.done():
            return
        loop = asyncio.get_running_loop()
        due = self._heard_at + self._read_timeout
        if due > loop.time():
            self._silence = loop.call_at(due, self._silent)
        else:
            self._silence = None
            self._fail(TimeoutError())

    @property
    def reusable(self) -> bool:
        return self._reusable and not self.closed and not self._buffer and self.transport is not None

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.abort()

    def _fail(self, exc: Exception) -> None:
        self._reusable = False
        if self._answer is not None and not self._answer.done():
            self._answer.set_exception(exc)

    def _parse(self) -> None:
        buffer = self._buffer
        while not self._status:
            end = buffer.find(b"\r\n\r\n")
            if end < 0:
                if self._eof and not buffer:
                    raise IncompleteAnswer("the server closed the connection before answering")
                if len(buffer) > MAX_HEAD or self._eof:
                    raise IncompleteAnswer("no HTTP/1.1 status line and headers")
                return
            head = bytes(buffer[:end])
            del buffer[: end + 4]
            self._read_head(head)
        if self._chunked:
            self._parse_chunks()
        elif self._length is not None:
            if len(buffer) >= self._length:
                self._finish(bytes(buffer[: self._length]))
                del buffer[: self._length]
            elif self._eof:
                raise IncompleteAnswer(f"the body ended {self._length - len(buffer)} bytes short")
        elif self._eof:  # framed by the connection's end
            self._finish(bytes(buffer))
            buffer.clear()

    def _read_head(self, head: bytes) -> None:
        lines = head.decode("latin-1").split("\r\n")
        version, _, rest = lines[0].partition(" ")
        code = rest[:3]
        if not version.startswith("HTTP/1.") or not code.isdigit():
            raise IncompleteAnswer(f"not an HTTP/1.1 status line: {lines[0][:80]!r}")
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, colon, value = line.partition(":")
            if not colon or not name or name != name.strip():
                raise IncompleteAnswer(f"not a header line: {line[:80]!r}")
            key = name.lower()
            value = value.strip()
            headers[key] = f"{headers[key]}, {value}" if key in headers else value
        status = int(code)
        if 100 <= status < 200 and status != 101:
            return  # an interim answer (100 Continue, 103 Early Hints): the real one follows
        self._status, self._reason, self._headers = status, rest[4:], headers
        connection = headers.get("connection", "").lower()
        self._reusable = "close" not in connection and (version == "HTTP/1.1" or "keep-alive" in connection)
        coding = headers.get("transfer-encoding", "").lower()
        if coding:
            if coding.rsplit(",", 1)[-1].strip() != "chunked":
                raise IncompleteAnswer(f"a transfer coding this client does not read: {coding}")
            self._chunked = True
        elif status in (204, 304):
            self._length = 0
        elif "content-length" in headers:
            length = headers["content-length"]
            if not length.isdigit():
                raise IncompleteAnswer(f"not a Content-Length: {length!r}")
            self._length = int(length)
        else:
            self._reusable = False

    def _parse_chunks(self) -> None:
        buffer = self._buffer
        while True:
            end = buffer.find(b"\r\n")
            if end < 0:
                break
            size_text = bytes(buffer[:end]).split(b";", 1)[0].strip()
            try:
                size = int(size_text, 16)
            except ValueError:
                raise IncompleteAnswer(f"not a chunk size: {size_text[:20]!r}") from None
            if size == 0:  # the last chunk; then trailers (ignored) up to an empty line
                trailers = buffer.find(b"\r\n\r\n", end)
                if trailers < 0 and buffer[end : end + 4] != b"\r\n\r\n":
                    break
                del buffer[: (trailers if trailers >= 0 else end) + 4]
                self._finish(b"".join(self._chunks))
                return
            if len(buffer) < end + 2 + size + 2:
                break
            self._chunks.append(bytes(buffer[end + 2 : end + 2 + size]))
            del buffer[: end + 2 + size + 2]
        if self._eof:
            raise IncompleteAnswer("the chunked body ended before its last chunk")

    def _finish(self, body: bytes) -> None:
        coding = self._headers.get("content-encoding", "identity").lower().strip()
        try:
            if coding in ("gzip", "x-gzip"):
                body = zlib.decompress(body, 16 + zlib.MAX_WBITS)
            elif coding == "deflate":
                body = _inflate(body)
            elif coding != "identity":
                raise IncompleteAnswer(f"a content coding this client does not read: {coding}")
        except zlib.error as exc:
            raise IncompleteAnswer(f"the {coding} body does not decode: {exc}") from None
        assert self._answer is not None
        self._answer.set_result(Answer(self._status, self._reason, self._headers, body))


def _inflate(body: bytes) -> bytes:
    """'deflate' as servers send it: zlib-wrapped as the RFC says, or raw as some do (aiohttp reads both)."""
    try:
        return zlib.decompress(body)
    except zlib.error:
        return zlib.decompress(body, -zlib.MAX_WBITS)


class Poster:
    """Requests with a body to one origin (scheme, host, port) over at most ``limit`` connections."""

    def __init__(
        self,
        origin: URL,
        *,
        tls: ssl.SSLContext | None,
        server_hostname: str | None,
        limit: int,
        keepalive: float | None,
        timeouts: Timeouts,
    ) -> None:
        if origin.host is None or origin.port is None:
            raise ValueError(f"not an absolute URL: {origin}")
        self._host, self._port = origin.host, origin.port
        self._tls = tls if origin.scheme == "https" else None
        self._server_hostname = (server_hostname or origin.host) if self._tls is not None else None
        self._keepalive = keepalive
        self._timeouts = timeouts
        # Connections that may be open at once: free slots, and the requests waiting for one in order.
        self._free = limit
        self._waiting: collections.deque[asyncio.Future[None]] = collections.deque()
        self._idle: collections.deque[_Connection] = collections.deque()
        self._addresses: list[tuple[str, int]] = []
        self._resolved_at = float("-inf")
        self._host_header = f"Host: {origin.host_port_subcomponent}\r\n".encode()

    async def post(self, path: str, headers: Mapping[str, str], body: bytes) -> Answer:
        return await self.send("POST", path, headers, body)

    async def send(self, method: str, path: str, headers: Mapping[str, str], body: bytes) -> Answer:
        """The answer to one request; the connection goes back to the pool when it may be used again.
        ``path`` is sent as it is (already encoded, with its query)."""
        head = self._head(method, path, headers, len(body))
        if self._free > 0 and not self._waiting:
            self._free -= 1
        else:
            await self._wait_for_slot()
        try:
            connection = self._reused() or await self._connect()
            try:
                answer = await connection.exchange((head, body), self._timeouts.read)
            except BaseException:
                connection.close()
                raise
            if connection.reusable:
                connection.used_at = asyncio.get_running_loop().time()
                self._idle.append(connection)
            else:
                connection.close()
            return answer
        finally:
            self._release_slot()

    async def _wait_for_slot(self) -> None:
        """In line for a slot, for at most the pool timeout; a slot given to a request that left the
        line meanwhile (its timeout, a cancel) goes on to the next."""
        turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.append(turn)
        try:
            async with asyncio.timeout(self._timeouts.pool):
                await turn
        except BaseException:
            if turn.done() and not turn.cancelled():
                self._release_slot()
            else:
                turn.cancel()
            raise

    def _release_slot(self) -> None:
        while self._waiting:
            turn = self._waiting.popleft()
            if not turn.done():
                turn.set_result(None)
                return
        self._free += 1

    async def close(self) -> None:
        while self._idle:
            self._idle.pop().close()

    def _head(self, method: str, path: str, headers: Mapping[str, str], length: int) -> bytes:
        lines = [f"{method} {path} HTTP/1.1\r\n".encode(), self._host_header]
        for name, value in headers.items():
            if not name or "\n" in name or "\r" in name or "\n" in value or "\r" in value:
                raise ValueError(f"a header that cannot be sent: {name!r}")
            lines.append(f"{name}: {value}\r\n".encode("latin-1"))
        lines.append(f"Content-Length: {length}\r\n\r\n".encode())
        return b"".join(lines)

    def _reused(self) -> _Connection | None:
        """The most recently used idle connection still open and within the idle expiry; older ones
        past it are closed on the way."""
        now = asyncio.get_running_loop().time()
        while self._idle:
            connection = self._idle.pop()
            if not connection.reusable or self._expired(connection, now):
                connection.close()
                continue
            while self._idle and self._expired(self._idle[0], now):
                self._idle.popleft().close()
            return connection
        return None

    def _expired(self, connection: _Connection, now: float) -> bool:
        return self._keepalive is not None and now - connection.used_at > self._keepalive

    async def _connect(self) -> _Connection:
        loop = asyncio.get_running_loop()
        async with asyncio.timeout(self._timeouts.connect):
            failure: OSError | None = None
            for host, port in await self._resolve():
                try:
                    _, connection = await loop.create_connection(
                        _Connection, host, port, ssl=self._tls, server_hostname=self._server_hostname
                    )
                    return connection
                except OSError as exc:  # the next address, as aiohttp tries them in turn
                    failure = exc
            raise failure or OSError(f"no address for {self._host}")

    async def _resolve(self) -> list[tuple[str, int]]:
        loop = asyncio.get_running_loop()
        if loop.time() - self._resolved_at > RESOLVED_SECONDS:
            infos = await loop.getaddrinfo(self._host, self._port, type=socket.SOCK_STREAM)
            self._addresses = list(dict.fromkeys((str(info[4][0]), int(info[4][1])) for info in infos))
            self._resolved_at = loop.time()
        return self._addresses
