"""`lag`'s table says what a group state means: a group nothing has consumed yet is "DEAD" to the broker,
which alarms a first user."""

from __future__ import annotations

from worker.tools.lag import GroupLag, PartitionLag, format_table


def _lag(state: str) -> GroupLag:
    row = PartitionLag(
        topic="reviews",
        partition=0,
        committed_offset=None,
        log_start_offset=0,
        log_end_offset=8,
        lag_messages=8,
        oldest_unconsumed_timestamp_ms=None,
        lag_seconds=None,
        member_id=None,
        client_id=None,
        host=None,
    )
    return GroupLag(group="g", state=state, topic="reviews", partitions=[row], measured_at_ms=0)


def test_the_group_line_explains_the_states_a_first_user_meets() -> None:
    assert format_table(_lag("DEAD")).splitlines()[0] == (
        "GROUP g (DEAD: no members and no committed offsets: nothing has consumed it yet)"
    )
    assert format_table(_lag("EMPTY")).splitlines()[0].startswith("GROUP g (EMPTY: no active members")
    assert format_table(_lag("STABLE")).splitlines()[0] == "GROUP g (STABLE)"
