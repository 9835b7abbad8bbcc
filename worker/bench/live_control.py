"""What the live-model benches share: a drain's own control and status topics, the desired state written to
the control topic as `models shadow|promote` write it (key `desired`, a `DesiredState` naming directories and
their content hashes: schemas.control), and reading what a worker serves and does from its /metrics."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from schemas.control import DesiredState, ModelChoice
from worker.bench.topic_io import create_run_topics
from worker.errors import ConfigurationError
from worker.labelling import control
from worker.model.manifest import UnverifiedModelError

__all__ = [
    "create_control_topics",
    "metric_labels",
    "metric_value",
    "model_choice",
    "write_desired",
]


def create_control_topics(common: dict[str, Any], group: str) -> str:
    """Creates group `group`'s control and status topics under their default names (`<group>.control`,
    `<group>.status`; compacted, one partition, as `topics create` makes them), so that a worker of the group
    follows the one and reports on the other. Returns the control topic's name."""
    create_run_topics(common, [f"{group}.control", f"{group}.status"], 1, compacted=True)
    return f"{group}.control"


def model_choice(directory: Path) -> ModelChoice:
    """`directory` as a control record names it, verified first as `models shadow|promote` verify it.
    ConfigurationError when it fails."""
    try:
        return control.model_choice(directory)
    except UnverifiedModelError as exc:
        raise ConfigurationError(f"{directory} cannot be named in a control record: {exc}") from None


def write_desired(
    common: dict[str, Any],
    topic: str,
    *,
    primary: ModelChoice | None,
    shadow: ModelChoice | None,
    by: str,
    timeout_s: float = 30.0,
) -> None:
    """Produces a desired state (`primary` None: the worker's configured model; `shadow` None: no shadow) to
    control topic `topic`, as `models shadow|promote` write it (ConfigurationError when not acknowledged)."""
    desired = DesiredState(
        primary=primary, shadow=shadow, changed_at_ms=int(time.time() * 1000), changed_by=by
    )
    control.produce_desired(common, topic, desired, timeout_s=timeout_s)


def metric_labels(scrape: dict[str, float], name: str) -> list[dict[str, str]]:
    """The label sets of `name`'s samples in a `scrape_metrics` result (an Info metric's one sample: what
    the worker serves)."""
    return [json.loads(key[len(name) :]) for key in scrape if key.startswith(name + "{")]


def metric_value(scrape: dict[str, float], name: str, **labels: str) -> float:
    """The sum of `name`'s samples whose labels include `labels` (0.0 when there is none: a labelled counter
    appears with its first increment)."""
    total = 0.0
    for key, value in scrape.items():
        if key.split("{", 1)[0] != name:
            continue
        theirs = json.loads(key[len(name) :])
        if all(theirs.get(k) == v for k, v in labels.items()):
            total += value
    return total
