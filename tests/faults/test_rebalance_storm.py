"""A rebalance storm: workers joining and leaving repeatedly under load.

Three worker processes share a six-partition input while the feed runs; every few seconds the oldest one
gets SIGTERM and a new one starts (so three or four are members at any time). Each clean stop finishes the
fetched windows, flushes and commits; each cooperative rebalance commits revoked partitions. Nothing may be
lost, every stopped worker must exit 0, and within each input partition the results must keep input order
(counting each input at its first appearance). There may be no duplicates either (exactly_once: read
committed; at_least_once: unless a member was evicted from the group, as the README says).
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.faults.harness import (
    Collector,
    FaultScene,
    Feeder,
    WorkerProcess,
    collecting,
    first_seen_in_order,
    review,
    source_offsets_by_partition,
    tally_outputs,
    wait_for_log,
    worker_env,
)

pytestmark = pytest.mark.integration

INPUTS = 600
PARTITIONS = 6
MEMBERS = 3
STORM_S = 20.0
EVERY_S = 5.0
CONSUMING = "consuming "  # logged once the worker subscribed (its SIGTERM handler is installed by then)


@pytest.mark.parametrize("delivery", ["at_least_once", "exactly_once"])
def test_rebalance_storm_loses_nothing_and_keeps_partition_order(delivery: str, scene: FaultScene) -> None:
    names = scene.topics(PARTITIONS, PARTITIONS)
    records = [review(i, "rb") for i in range(INPUTS)]
    # Each member has its own worker id (WorkerProcess sets it): its own transactional id in exactly_once.
    # session.timeout.ms follows max_poll_interval_ms (10 s): a member that stops in the middle of a
    # cooperative rebalance is sometimes only noticed when its session expires (seen: two 45 s stalls
    # with the default), and the test should not wait that long.
    env = worker_env(
        scene.bootstrap,
        names,
        scene.model_dir,
        SENTIMENT_MAX_WINDOW_MESSAGES="16",
        SENTIMENT_DELIVERY=delivery,
        SENTIMENT_MAX_POLL_INTERVAL_MS="10000",
    )
    members = _Members(env, scene.log_dir / "logs")
    with collecting(scene.bootstrap, names) as collector:
        try:
            codes = _storm(members, collector, Feeder(scene.bootstrap, names["reviews"], records, 20, 0.5))
        finally:
            for worker in members.started:
                worker.stop()
    started = members.started
    assert all(code == 0 for code in codes.values()), {
        name: (code, next(w for w in started if w.name == name).stderr_tail(1500))
        for name, code in codes.items()
        if code != 0
    }
    results = collector.records(names["results"])
    fig = tally_outputs(f"rebalance-storm-{delivery}", records, collector, names)
    rebalances = sum(w.stderr().count("revoked ") for w in started)
    fig.notes.update(
        {
            "workers_started": len(started),
            "sigterms_mid_stream": len(members.stopped),
            "revocations": rebalances,
        }
    )
    scene.record(fig)
    assert fig.lost == 0 and fig.results == INPUTS
    out_of_order = {
        key: offsets
        for key, offsets in source_offsets_by_partition(results).items()
        if not first_seen_in_order(offsets)
    }
    assert not out_of_order, f"input order broken in {sorted(out_of_order)}"
    if delivery == "exactly_once":
        assert fig.duplicates == 0  # read_committed: a window's outputs and offsets commit together
    else:
        # The README: revoked partitions and clean stops repeat no work; a stopping member's final commit
        # refused while the group rebalances (ILLEGAL_GENERATION / REBALANCE_IN_PROGRESS) is retried once
        # it has joined the new generation (ReviewConsumer.commit_through_rebalance). The one excuse is a
        # member evicted from the group (its partitions lost, or its commit refused for another reason),
        # whose uncommitted tail the next owner redoes, as the README says.
        evicted = [w.name for w in started if _evicted(w.stderr())]
        assert fig.duplicates == 0 or evicted, (fig.duplicates, [w.stderr_tail(800) for w in started])


class _Members:
    """The group's worker processes: every one started, those alive now, those stopped mid-stream."""

    def __init__(self, env: dict[str, str], log_dir: Path) -> None:
        self._env, self._log_dir = env, log_dir
        self.started: list[WorkerProcess] = []
        self.stopped: list[WorkerProcess] = []
        self.alive = [self.spawn() for _ in range(MEMBERS)]

    def spawn(self) -> WorkerProcess:
        worker = WorkerProcess(self._env, self._log_dir, f"member-{len(self.started) + 1}")
        self.started.append(worker)
        return worker


def _storm(members: _Members, collector: Collector, feeder: Feeder) -> dict[str, int]:
    """Feeds the input while, every `EVERY_S` for `STORM_S`, a new member joins and the oldest consuming one
    leaves (SIGTERM); then waits for every id and stops the rest. Returns each member's exit code."""
    alive = members.alive
    wait_for_log(alive[0], CONSUMING)
    feeder.start()
    storm_until = time.monotonic() + STORM_S
    while time.monotonic() < storm_until:
        time.sleep(EVERY_S)
        for worker in alive:
            assert worker.alive(), f"{worker.name} died:\n{worker.stderr_tail()}"
        # The oldest member that has started consuming leaves (a process still loading its model
        # has no SIGTERM handler yet); a new one joins first, so 3-4 are members at any time.
        consuming = [w for w in alive if CONSUMING in w.stderr()]
        if len(consuming) < 2:
            continue
        leaving = consuming[0]
        alive.remove(leaving)
        alive.append(members.spawn())
        leaving.terminate()
        members.stopped.append(leaving)
    feeder.finish()
    collector.wait_until(lambda: len(collector.distinct_keys()) >= INPUTS, 180, "every id")
    collector.settle()
    for worker in alive:
        wait_for_log(worker, CONSUMING, 300)
        worker.terminate()
    return {w.name: w.wait(90) for w in [*members.stopped, *alive]}


def _evicted(log: str) -> bool:
    """The worker logged partitions lost, or a commit that failed for a reason other than a rebalance."""
    failed = [line for line in log.splitlines() if "commit" in line and "failed (" in line]
    rebalancing = ("ILLEGAL_GENERATION", "REBALANCE_IN_PROGRESS")
    lost = "dropped their in-flight work without committing" in log  # Assignment.on_lost
    return lost or any(not any(code in line for code in rebalancing) for line in failed)
