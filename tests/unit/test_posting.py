"""The direct client's HTTP/1.1 wire (model/posting.py) against a server that writes scripted bytes.

A raw asyncio server reads each request (head and Content-Length body) and answers with the next
scripted bytes, so every framing, coding and connection rule is exercised as a server sends it, not as
aiohttp's own server happens to; the request matrix against the SDK is in test_direct_client.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import ssl
import zlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import uvloop
from yarl import URL

from agentrun.posting import Answer, IncompleteAnswer, Poster, Timeouts
from tests.support.tls import make_pki

NO_TIMEOUTS = Timeouts(pool=None, connect=5.0, read=5.0)
HEADERS = {"content-type": "application/json", "x-api-key": "k"}


def _answer(body: bytes, *head: str, status: str = "200 OK") -> bytes:
    lines = [f"HTTP/1.1 {status}", *head]
    if not any(h.lower().startswith(("content-length", "transfer-encoding")) for h in head):
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


@dataclass
class Script:
    """Answers in order; a callable answers by writing itself (slowly, partly, or not at all)."""

    answers: list[bytes | Callable[[asyncio.StreamWriter], object]]
    close_after: bool = False  # the server closes each connection after one answer
    requests: list[bytes] = field(default_factory=list)
    connections: int = 0
    open_now: int = 0
    most_open: int = 0


@contextlib.asynccontextmanager
async def scripted(script: Script, tls: ssl.SSLContext | None = None) -> AsyncIterator[URL]:
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        script.connections += 1
        script.open_now += 1
        script.most_open = max(script.most_open, script.open_now)
        try:
            while script.answers:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(
                    int(line.split(b":", 1)[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length:")
                )
                script.requests.append(head + await reader.readexactly(length))
                answer = script.answers.pop(0)
                if callable(answer):
                    await answer(writer)  # type: ignore[misc]
                else:
                    writer.write(answer)
                await writer.drain()
                if script.close_after:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            script.open_now -= 1
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0, ssl=tls)
    port = server.sockets[0].getsockname()[1]
    try:
        yield URL(f"{'https' if tls else 'http'}://{'localhost' if tls else '127.0.0.1'}:{port}")
    finally:
        server.close()


def _poster(url: URL, *, limit: int = 10, keepalive: float | None = 10.0, **kwargs: object) -> Poster:
    options: dict[str, object] = {"tls": None, "server_hostname": None, "timeouts": NO_TIMEOUTS}
    options.update(kwargs)
    return Poster(url, limit=limit, keepalive=keepalive, **options)  # type: ignore[arg-type]


async def _post(poster: Poster, body: bytes = b'{"q":1}') -> Answer:
    return await poster.post("/v1/messages?beta=true", HEADERS, body)


async def test_a_request_goes_out_as_one_http_1_1_post_and_its_connection_is_reused() -> None:
    script = Script([_answer(b'{"a":1}', "Request-Id: req_1"), _answer(b'{"a":2}')])
    async with scripted(script) as url:
        poster = _poster(url)
        first, second = await _post(poster), await _post(poster, b"{}")
        await poster.close()
    assert (first.status, first.body, first.headers["request-id"]) == (200, b'{"a":1}', "req_1")
    assert second.body == b'{"a":2}'
    assert script.connections == 1
    assert (
        script.requests[0]
        == (
            f"POST /v1/messages?beta=true HTTP/1.1\r\nHost: 127.0.0.1:{url.port}\r\n"
            "content-type: application/json\r\nx-api-key: k\r\nContent-Length: 7\r\n\r\n"
            '{"q":1}'
        ).encode()
    )


async def test_a_chunked_answer_is_joined_past_extensions_and_trailers() -> None:
    body = b'4;ext=1\r\n{"a"\r\n3\r\n:1}\r\n0\r\nX-Trailer: t\r\n\r\n'
    script = Script([_answer(body, "Transfer-Encoding: chunked"), _answer(b"next")])
    async with scripted(script) as url:
        poster = _poster(url)
        answer, after = await _post(poster), await _post(poster)
        await poster.close()
    assert (answer.body, after.body, script.connections) == (b'{"a":1}', b"next", 1)


@pytest.mark.parametrize(
    ("coding", "encoded"),
    [
        ("gzip", gzip.compress(b'{"long":"' + b"x" * 500 + b'"}')),
        ("deflate", zlib.compress(b'{"long":"' + b"x" * 500 + b'"}')),
        ("deflate", zlib.compress(b'{"long":"' + b"x" * 500 + b'"}')[2:-4]),  # raw, as some servers send it
    ],
    ids=["gzip", "deflate", "raw deflate"],
)
async def test_a_compressed_answer_is_decoded(coding: str, encoded: bytes) -> None:
    async with scripted(Script([_answer(encoded, f"Content-Encoding: {coding}")])) as url:
        answer = await _post(_poster(url))
    assert answer.body == b'{"long":"' + b"x" * 500 + b'"}'


async def test_interim_answers_are_skipped() -> None:
    interim = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </x>\r\n\r\n"
    async with scripted(Script([interim + _answer(b"{}", status="201 Created")])) as url:
        answer = await _post(_poster(url))
    assert (answer.status, answer.body, "link" in answer.headers) == (201, b"{}", False)


@pytest.mark.parametrize(
    "answer",
    [
        b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n{}",  # framed by the connection's end
        _answer(b"{}", "Connection: close"),
        b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\n{}",  # HTTP/1.0 without keep-alive
    ],
    ids=["until the end", "connection close", "HTTP/1.0"],
)
async def test_a_connection_the_server_does_not_keep_is_not_reused(answer: bytes) -> None:
    script = Script([answer, _answer(b"again")], close_after=True)
    async with scripted(script) as url:
        poster = _poster(url)
        first, second = await _post(poster), await _post(poster)
    assert (first.body, second.body, script.connections) == (b"{}", b"again", 2)


async def test_an_idle_connection_past_the_keep_alive_expiry_is_not_reused() -> None:
    script = Script([_answer(b"1"), _answer(b"2"), _answer(b"3")])
    async with scripted(script) as url:
        poster = _poster(url, keepalive=1.0)
        await _post(poster)
        await asyncio.sleep(1.5)  # idle past the expiry (not a poll: the gap is the point)
        await _post(poster)
        await _post(poster)  # straight after: the second one's connection
    assert script.connections == 2


@pytest.mark.parametrize(
    ("answer", "says"),
    [
        (b'HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{"cut', "95 bytes short"),
        (b'HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\n{"cut', "before its last chunk"),
        (b"SSH-2.0-OpenSSH_9.2\r\n\r\n", "not an HTTP/1.1 status line"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: two\r\n\r\n", "not a Content-Length"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n", "transfer coding"),
        (_answer(b"x", "Content-Encoding: br"), "content coding this client does not read: br"),
        (_answer(b"not gzip", "Content-Encoding: gzip"), "does not decode"),
        (b"", "closed the connection before answering"),
    ],
    ids=[
        "short body",
        "short chunks",
        "not http",
        "bad length",
        "transfer coding",
        "br",
        "bad gzip",
        "nothing",
    ],
)
async def test_an_answer_that_cannot_be_read_whole_is_an_incomplete_answer(answer: bytes, says: str) -> None:
    async with scripted(Script([answer], close_after=True)) as url:
        with pytest.raises(IncompleteAnswer, match=says) as caught:
            await _post(_poster(url))
    assert isinstance(caught.value, OSError)  # what the caller translates as a connection failure


async def test_the_read_timeout_is_a_silence_not_a_deadline() -> None:
    async def steady(writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        for _ in range(12):  # 3 s in all, never silent for the 1.5 s of the timeout
            await writer.drain()
            await asyncio.sleep(0.25)
            writer.write(b"1\r\nx\r\n")
        writer.write(b"0\r\n\r\n")

    async def silent(writer: asyncio.StreamWriter) -> None:
        await asyncio.sleep(10)

    timeouts = Timeouts(pool=None, connect=5.0, read=1.5)
    async with scripted(Script([steady, silent])) as url:
        poster = _poster(url, timeouts=timeouts)
        assert (await _post(poster)).body == b"x" * 12
        with pytest.raises(TimeoutError):
            await _post(poster)


async def test_no_more_than_the_limit_of_connections_is_open_at_once() -> None:
    release = asyncio.Event()

    async def held(writer: asyncio.StreamWriter) -> None:
        await release.wait()
        writer.write(_answer(b"{}"))

    script = Script([held] * 5)
    async with scripted(script) as url:
        poster = _poster(url, limit=2)
        posts = [asyncio.create_task(_post(poster)) for _ in range(5)]
        release.set()
        answers = await asyncio.gather(*posts)
        await poster.close()
    assert [a.body for a in answers] == [b"{}"] * 5
    assert script.most_open == 2


async def test_a_request_that_waits_for_a_connection_past_the_pool_timeout_gives_up_and_takes_no_slot() -> (
    None
):
    release = asyncio.Event()

    async def held(writer: asyncio.StreamWriter) -> None:
        await release.wait()
        writer.write(_answer(b"first"))

    script = Script([held, _answer(b"third"), _answer(b"fourth")])
    async with scripted(script) as url:
        poster = _poster(url, limit=1, timeouts=Timeouts(pool=0.2, connect=5.0, read=5.0))
        first = asyncio.create_task(_post(poster))
        await asyncio.sleep(0)  # its first step takes the one slot
        with pytest.raises(TimeoutError):
            await _post(poster)  # the one connection stays busy past the pool timeout
        third = asyncio.create_task(_post(poster))  # in line now: gets the slot the first gives back
        release.set()
        assert [(await first).body, (await third).body] == [b"first", b"third"]
        assert (await _post(poster)).body == b"fourth"  # no slot was lost to the request that gave up
        await poster.close()
    assert script.most_open == 1 and script.connections == 1


async def test_a_refused_connection_is_the_systems_error() -> None:
    async with scripted(Script([])) as url:
        pass  # the port is free again
    with pytest.raises(ConnectionRefusedError):  # an OSError, translated as a connection failure
        await _post(_poster(url))


async def test_a_header_that_would_split_the_request_is_refused_before_sending() -> None:
    script = Script([_answer(b"{}")])
    async with scripted(script) as url:
        with pytest.raises(ValueError, match="cannot be sent"):
            await _poster(url).post("/v1/messages", {"x-bad": "a\r\nInjected: 1"}, b"{}")
    assert script.requests == []


async def test_https_verifies_the_server_against_the_given_context(tmp_path: Path) -> None:
    pki = make_pki()
    server = pki.server_context(tmp_path, require_client_certificate=False)
    trusting = ssl.create_default_context(cadata=pki.ca.decode())
    async with scripted(Script([_answer(b"{}"), _answer(b"{}")]), tls=server) as url:
        assert (await _post(_poster(url, tls=trusting))).body == b"{}"
        with pytest.raises(ssl.SSLCertVerificationError):
            await _post(_poster(url, tls=ssl.create_default_context()))


def test_the_client_works_on_uvloop_the_operators_event_loop() -> None:
    """The operator runs on uvloop (cli/main.py), whose transports are not asyncio's classes."""

    async def main() -> Answer:
        chunked = b'HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nf\r\n{"on":"uvloop"}\r\n0\r\n\r\n'
        async with scripted(Script([chunked, _answer(b"{}")])) as url:
            poster = _poster(url)
            answer = await _post(poster)
            await _post(poster)
            await poster.close()
            return answer

    assert uvloop.run(main()).body == b'{"on":"uvloop"}'
