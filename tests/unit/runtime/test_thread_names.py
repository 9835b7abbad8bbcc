"""`run` and `serve` give each Python thread its name in the kernel (what `top -H`, profilers and
`bench --host-ceiling` read), without displacing a profiler's own thread hook, and leave the main thread
named like the process."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from worker.runtime.process import name_os_threads


def kernel_name(native_id: int) -> str:
    return Path(f"/proc/self/task/{native_id}/comm").read_text().strip()


@pytest.fixture
def restore_profile_hook() -> Iterator[None]:
    hook = threading.getprofile()
    threading.setprofile(None)  # as in a fresh process (other tests may have run `run` in this one)
    yield
    threading.setprofile(hook)


def names_seen_inside(name: str) -> str:
    """The kernel name a thread named `name` has while it runs."""
    seen: list[str] = []
    thread = threading.Thread(target=lambda: seen.append(kernel_name(threading.get_native_id())), name=name)
    thread.start()
    thread.join()
    return seen[0]


@pytest.mark.usefixtures("restore_profile_hook")
def test_threads_started_afterwards_carry_their_names() -> None:
    process_name = kernel_name(threading.get_native_id())
    before = names_seen_inside("engine-queue")
    assert before == process_name  # CPython 3.11 leaves them named like the process
    name_os_threads()
    assert names_seen_inside("engine-queue") == "engine-queue"
    assert names_seen_inside("a-rather-long-thread-name") == "a-rather-long-t"  # the kernel keeps 15 bytes
    with ThreadPoolExecutor(2, thread_name_prefix="engine-lane") as lanes:
        seen = set(lanes.map(lambda _: kernel_name(threading.get_native_id()), range(8)))
    assert seen <= {"engine-lane_0", "engine-lane_1"} and seen
    assert kernel_name(threading.get_native_id()) == process_name  # the main thread is left alone


@pytest.mark.usefixtures("restore_profile_hook")
def test_a_profile_hook_installed_before_keeps_running() -> None:
    events: list[str] = []

    def profiler(_frame: Any, event: str, _arg: Any) -> None:
        if threading.current_thread().name == "profiled":
            events.append(event)

    threading.setprofile(profiler)
    name_os_threads()
    assert names_seen_inside("profiled") == "profiled"
    assert events[0] == "call" and "return" in events  # it saw the run() call and what followed
