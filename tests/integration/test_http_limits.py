"""Bounded connections (`serve`, a real uvicorn server): a head too large is refused before it is read to the
end, slow, idle and stalled clients are cut off at the configured time while others are served, and the
connection cap refuses one connection too many. Slow clients are raw sockets on the loopback address."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.integration.serve_helpers import Served, scrape, serving
from tests.polling import wait_until

API = "/v1/sentiment"
CUT_OFF_S = 1.0  # the head, body and keep-alive timeouts of these tests
READ_BOUND_S = 20.0  # a test fails (times out reading) if a slow client is never cut off


@pytest.fixture(scope="module")
def served(tiny_classifier: Any) -> Iterator[Served]:
    with serving(
        tiny_classifier,
        http_header_timeout_s=CUT_OFF_S,
        http_body_timeout_s=CUT_OFF_S,
        http_keep_alive_s=CUT_OFF_S,
        http_max_body_bytes=4096,
    ) as served:
        yield served


def _address(url: str) -> tuple[str, int]:
    host, port = url.removeprefix("http://").split(":")
    return host, int(port)


def _status(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/1.") else 0


def _error(answer: bytes) -> str:
    return str(json.loads(answer.split(b"\r\n\r\n", 1)[1])["error"])


def test_a_head_over_the_limit_gets_431_before_it_is_read_to_the_end(served: Served) -> None:
    # 2 MB of one header value that never ends: the server answers once the limit (16 KiB) is passed,
    # without waiting for (and holding) the rest.
    series = "sentiment_http_connections_refused_total{reason=header_too_large}"
    before = scrape(served.url).get(series, 0)
    with socket.create_connection(_address(served.url), timeout=READ_BOUND_S) as sock:
        try:
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: test\r\nX-Big: ")
            for _ in range(32):
                sock.sendall(b"a" * 65536)
        except OSError:
            pass  # the server closed while we were still sending; its answer is read below
        answer = _read_to_end(sock)
    assert _status(answer) == 431 and _error(answer) == "header_too_large"
    assert b"connection: close" in answer.lower()
    # A head under the limit is served, on the API too.
    assert httpx.get(served.url + "/healthz", headers={"X-Pad": "a" * 12_000}).status_code == 200
    big = httpx.post(served.url + API, json={"text": "很好"}, headers={"X-Pad": "a" * 20_000})
    assert big.status_code == 431 and big.json()["error"] == "header_too_large"
    assert scrape(served.url)[series] - before == 2


def _read_to_end(sock: socket.socket) -> bytes:
    answer = b""
    while chunk := sock.recv(65536):
        answer += chunk
    return answer


# What each slow client sends at once, then one byte at a time (every 0.2 s), and the statuses of the
# answers it gets before the server closes its connection, with the last one's error.
HEAD = b"POST /v1/sentiment HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
GET = b"GET /healthz HTTP/1.1\r\nHost: test\r\n\r\n"
DRIP_S = 0.2
SLOW_CLIENTS: dict[str, tuple[bytes, bytes, list[int], str | None]] = {
    "partial head": (HEAD, b"", [408], "header_timeout"),
    "head one byte at a time": (b"", HEAD * 20, [408], "header_timeout"),
    "nothing at all": (b"", b"", [], None),
    "idle after an answer": (GET, b"", [200], None),
    "after an answer, part of the next head": (GET, b"GET /healthz", [200, 408], "header_timeout"),
    "stalled body": (HEAD + b"Content-Length: 100\r\n\r\n" + b'{"text": "', b"", [408], "body_timeout"),
    "body dripping after a 413": (
        HEAD + b"Content-Length: 99999\r\n\r\n",
        b"a" * 100,
        [413],
        "body_too_large",
    ),
}


async def _slow_client(address: tuple[str, int], kind: str) -> tuple[str, bytes]:
    sent, dripped, _, _ = SLOW_CLIENTS[kind]
    reader, writer = await asyncio.open_connection(*address)
    writer.write(sent)

    async def drip() -> None:
        for byte in dripped:
            await asyncio.sleep(DRIP_S)
            if writer.is_closing() or reader.at_eof():
                return
            writer.write(bytes([byte]))

    dripping = asyncio.create_task(drip())
    try:
        return kind, await asyncio.wait_for(reader.read(), READ_BOUND_S)  # to the end: the server closed
    except (ConnectionResetError, BrokenPipeError):
        return kind, b"reset"
    finally:
        dripping.cancel()
        writer.close()


def _answers(stream: bytes) -> list[bytes]:
    """The HTTP answers in what a connection received, in order (each with its Content-Length body)."""
    answers = []
    while stream.startswith(b"HTTP/1."):
        head, _, rest = stream.partition(b"\r\n\r\n")
        fields = dict(line.lower().split(b": ", 1) for line in head.split(b"\r\n")[1:])
        length = int(fields[b"content-length"])
        answers.append(head + b"\r\n\r\n" + rest[:length])
        stream = rest[length:]
    assert stream == b"", f"not an HTTP answer: {stream[:200]!r}"
    return answers


def test_fifty_slow_clients_are_cut_off_while_others_are_served(served: Served) -> None:
    kinds = [kind for _ in range(8) for kind in SLOW_CLIENTS][:50]

    async def main() -> tuple[list[tuple[str, bytes]], list[httpx.Response]]:
        slow = [asyncio.create_task(_slow_client(_address(served.url), kind)) for kind in kinds]
        await asyncio.sleep(0.2)  # the slow ones are connected and stalling
        async with httpx.AsyncClient(base_url=served.url, timeout=10) as client:
            others = [await client.post(API, json={"texts": ["很好", "太差了"], "ids": ["a", "b"]})]
            others += [await client.get("/healthz") for _ in range(5)]
        return list(await asyncio.gather(*slow)), others

    before = scrape(served.url)
    cut_off, others = asyncio.run(main())
    after = scrape(served.url)

    assert [r.status_code for r in others] == [200] * 6
    assert [r["id"] for r in others[0].json()["results"]] == ["a", "b"]
    assert len(cut_off) == 50
    for kind, stream in cut_off:
        _, _, statuses, error = SLOW_CLIENTS[kind]
        answers = _answers(stream)
        assert [_status(a) for a in answers] == statuses, kind
        if error is not None:
            assert _error(answers[-1]) == error, kind
        if statuses and statuses[-1] == 408:
            assert b"connection: close" in answers[-1].lower(), kind
    # Each cut-off counted by its reason (the idle ones are not refusals).
    expected = {"header_timeout": 0, "body_timeout": 0}
    for kind, _ in cut_off:
        error = SLOW_CLIENTS[kind][3]
        reason = "body_timeout" if error == "body_too_large" else error
        if reason is not None:
            expected[reason] += 1
    for reason, count in expected.items():
        series = f"sentiment_http_connections_refused_total{{reason={reason}}}"
        assert after[series] - before.get(series, 0) == count, reason


def test_the_connection_cap_refuses_one_more_while_the_others_are_served(tiny_classifier: Any) -> None:
    cap = 4
    with serving(tiny_classifier, http_max_connections=cap, http_keep_alive_s=60) as served:
        address = _address(served.url)
        refused: list[int] = []  # 503s while opening them (connections closed just before still counted)
        held = [_open_served(address, refused) for _ in range(cap)]  # cap connections open, answered once
        try:
            over = httpx.get(served.url + "/healthz")  # one more
            assert over.status_code == 503 and over.json()["error"] == "too_many_connections"
            assert over.headers["Retry-After"] == "1"
            for sock in held:  # the ones within the cap are still served
                sock.sendall(GET)
                assert _status(sock.recv(65536)) == 200
        finally:
            for sock in held:
                sock.close()
        assert _get_once_served(served.url, refused) == 200  # once they closed, new ones are served again
        counted = scrape(served.url)["sentiment_http_connections_refused_total{reason=too_many_connections}"]
        assert counted == 1 + len(refused)


def _open_served(address: tuple[str, int], refused: list[int]) -> socket.socket:
    """A keep-alive connection the server answered once (retried while the server still counts
    connections closed just before: the readiness probes'); each 503 is added to `refused`."""
    for _ in range(100):
        sock = socket.create_connection(address, timeout=READ_BOUND_S)
        sock.sendall(GET)
        status = _status(sock.recv(65536))
        if status == 200:
            return sock
        refused.append(status)
        sock.close()
        time.sleep(0.05)
    raise AssertionError("no connection within the cap was served")


def _get_once_served(url: str, refused: list[int]) -> int:
    for _ in range(100):
        status = httpx.get(url + "/healthz").status_code
        if status != 503:
            return status
        refused.append(status)
        time.sleep(0.05)
    return 503


def test_a_client_gone_mid_body_counts_as_499_and_a_body_cut_off_as_408(served: Served) -> None:
    """Before: both were counted as `code="500"`, as if the server had failed."""
    series = "sentiment_http_requests_total{code=%s}"
    before = scrape(served.url)
    with socket.create_connection(_address(served.url)) as sock:
        sock.sendall(HEAD + b"Content-Length: 100\r\n\r\n" + b'{"text": "')
    wait_until(
        lambda: scrape(served.url).get(series % 499, 0) - before.get(series % 499, 0) == 1,
        READ_BOUND_S,
        "the request whose client left to be counted as 499",
    )
    with socket.create_connection(_address(served.url)) as sock:
        sock.sendall(HEAD + b"Content-Length: 100\r\n\r\n" + b'{"text": "')
        assert _status(_read_to_end(sock)) == 408  # the body bound (CUT_OFF_S) answers, then closes
    counted = wait_until(
        lambda: (now := scrape(served.url)).get(series % 408, 0) - before.get(series % 408, 0) == 1 and now,
        READ_BOUND_S,
        "the request cut off by the body timeout to be counted as 408",
    )
    assert counted.get(series % 500, 0) == before.get(series % 500, 0)
    assert counted.get(series % 499, 0) - before.get(series % 499, 0) == 1
