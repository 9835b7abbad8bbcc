"""The load generator of `bench --http`: closed-loop clients (each sends its next request when the previous
one is answered) and an open-loop offered rate, over aiohttp; what each load level measured (`LoadResult`)."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import numpy as np


@dataclass
class LoadResult:
    """One load level: answers by status, latencies of the 200s, wall time."""

    concurrency: int
    sent: int
    seconds: float
    codes: Counter[str] = field(default_factory=Counter)
    latencies_ms: list[float] = field(default_factory=list)
    hung: int = 0
    server_cpu_s: float | None = None
    """CPU seconds the server process used during the level (all threads, model included)."""
    client_cpu_s: float | None = None
    """CPU seconds this process (the load generator) used during the level."""

    @property
    def ok(self) -> int:
        return self.codes.get("200", 0)

    def as_json(self) -> dict[str, Any]:
        return {
            "concurrency": self.concurrency,
            "sent": self.sent,
            "seconds": round(self.seconds, 3),
            "requests_per_second": round(self.ok / self.seconds, 1) if self.seconds else 0.0,
            "codes": dict(self.codes),
            "hung": self.hung,
            "server_cpu_ms_per_request": _per_request_ms(self.server_cpu_s, self.sent),
            "client_cpu_ms_per_request": _per_request_ms(self.client_cpu_s, self.sent),
            **{
                k: (round(v, 2) if v is not None else None) for k, v in percentiles(self.latencies_ms).items()
            },
        }


def _per_request_ms(cpu_s: float | None, requests: int) -> float | None:
    return round(cpu_s * 1000 / requests, 4) if cpu_s is not None and requests else None


def percentiles(values: Sequence[float]) -> dict[str, float | None]:
    """p50 / p95 / p99 of `values` (None when empty)."""
    if not values:
        return {"p50_ms": None, "p95_ms": None, "p99_ms": None}
    p50, p95, p99 = np.percentile(np.asarray(values), [50, 95, 99])
    return {"p50_ms": float(p50), "p95_ms": float(p95), "p99_ms": float(p99)}


# aiohttp, not httpx: at concurrency 64 httpx's client alone held the measured rate to a third.
async def closed_loop(
    url: str, path: str, bodies: Sequence[dict[str, Any]], concurrency: int, *, timeout_s: float = 60.0
) -> LoadResult:
    """`concurrency` clients, each sending its next request as soon as the previous one is answered."""
    result = LoadResult(concurrency=concurrency, sent=len(bodies), seconds=0.0)
    pending = iter(bodies)
    connector = aiohttp.TCPConnector(limit=concurrency)
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    async with aiohttp.ClientSession(url, connector=connector, timeout=timeout) as session:

        async def one_client() -> None:
            for body in pending:  # the shared iterator hands each request to one client
                await _post(session, path, body, result)

        started = time.perf_counter()
        await asyncio.gather(*(one_client() for _ in range(concurrency)))
        result.seconds = time.perf_counter() - started
    return result


async def _post(session: aiohttp.ClientSession, path: str, body: dict[str, Any], result: LoadResult) -> None:
    started = time.perf_counter()
    try:
        async with session.post(path, json=body) as response:
            await response.read()
            status = response.status
    except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
        result.codes[type(exc).__name__] += 1
        return
    result.codes[str(status)] += 1
    if status == 200:
        result.latencies_ms.append((time.perf_counter() - started) * 1000)


async def open_loop(
    url: str,
    path: str,
    bodies: Sequence[dict[str, Any]],
    rate_per_s: float,
    duration_s: float,
    *,
    timeout_s: float = 60.0,
    connections: int = 1024,
    sample: Callable[[], None] | None = None,
) -> LoadResult:
    """Requests started at `rate_per_s` for `duration_s` whatever the answers (an offered load, over at most
    `connections` connections); a request still unanswered `timeout_s` after the last start counts as hung."""
    count = max(1, int(rate_per_s * duration_s))
    result = LoadResult(concurrency=max(1, round(rate_per_s)), sent=count, seconds=0.0)
    connector = aiohttp.TCPConnector(limit=connections)
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    async with aiohttp.ClientSession(url, connector=connector, timeout=timeout) as session:
        started = time.perf_counter()
        tasks = []
        next_sample = started
        for i in range(count):
            delay = started + i / rate_per_s - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(_post(session, path, bodies[i % len(bodies)], result)))
            if sample is not None and time.perf_counter() >= next_sample:
                sample()
                next_sample += 0.5
        _, not_done = await asyncio.wait(tasks, timeout=timeout_s)
        for task in not_done:
            task.cancel()
        result.hung = len(not_done)
        result.seconds = time.perf_counter() - started
        if sample is not None:
            sample()
    return result
