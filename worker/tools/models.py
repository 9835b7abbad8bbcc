"""The operator's side of the control topic (`sentiment-worker models status|shadow|promote`): read the
desired state and what each live replica reports, write a new desired state, and the promote gate.

    models status   control topic (to its end) + status topic (latest record per replica, stale ones dropped)
    models shadow   a new desired state, the primary kept, the shadow DIR (or none), DIR verified here first
    models promote  DIR becomes the primary, if it passes the gate: the held-out figures of metrics.json
                    beside the current primary's, and with --live the shadow's live figures summed over the
                    replicas (agreement on N reviews, label-mix shift, mean confidence); --force overrides

A directory is verified (worker.model.manifest: the files match the manifest, no pickle) before anything is
written; the record names the directory as given (it must be the path every replica reads) and its content
hash, which each replica checks again before it loads anything.
"""

from __future__ import annotations

import getpass
import json
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, TopicPartition

from schemas.control import (
    DESIRED_KEY,
    REPLICA_KEY_PREFIX,
    Agreement,
    DesiredState,
    GateDecision,
    ModelChoice,
    ReplicaStatus,
    parse_desired,
    parse_status,
)
from worker.config import Sections, librdkafka_common
from worker.errors import ConfigurationError, OperationError
from worker.labelling.control import model_choice, produce_desired
from worker.model.manifest import UnverifiedModelError

__all__ = [
    "FleetView",
    "ModelRefused",
    "PromoteOutcome",
    "agreement_figures",
    "changed_by",
    "choice_of",
    "fleet_agreement",
    "promote",
    "read_desired",
    "read_fleet",
    "set_shadow",
    "write_desired",
]

METRICS_FILE = "metrics.json"
HELDOUT_MARGIN = 0.005
"""How much lower a candidate's held-out accuracy and macro-F1 may be (`promote --margin`'s default)."""
HELDOUT_ECE_MARGIN = 0.02
"""How much higher its calibration error may be (`promote --ece-margin`'s default)."""
_READ_TIMEOUT_S = 15.0
_DENIED = (KafkaError.TOPIC_AUTHORIZATION_FAILED, KafkaError.CLUSTER_AUTHORIZATION_FAILED)


class ModelRefused(OperationError):
    """A model directory the command will not name (it fails verification): nothing was written (exit 1)."""


# ----- reading the two topics -----
def read_records(sections: Sections, topic: str, *, timeout_s: float = _READ_TIMEOUT_S) -> list[Any]:
    """Every record of `topic` from its beginning to its end as it is now (a consumer that joins no group and
    commits nothing). Raises ConfigurationError when no broker answers or the topic does not exist."""
    conf = librdkafka_common(sections.kafka, sections.security)
    # group.id is required by the client even with assign(); nothing is committed under it.
    conf.update({"group.id": f"{sections.kafka.group_id}.models-cli", "enable.auto.commit": False})
    consumer = Consumer(conf)
    try:
        try:
            metadata = consumer.list_topics(topic, timeout=10.0).topics.get(topic)
        except KafkaException as exc:
            raise ConfigurationError(
                f"cannot read topic {topic}: {exc.args[0] if exc.args else exc}; check bootstrap.servers "
                "and that the broker is up"
            ) from None
        if metadata is not None and metadata.error is not None and metadata.error.code() in _DENIED:
            raise _denied(topic, metadata.error.name())
        if metadata is None or metadata.error is not None or not metadata.partitions:
            raise ConfigurationError(
                f"no topic {topic}: `sentiment-worker topics create` makes the group's control and status "
                "topics"
            )
        ends: dict[int, int] = {}
        for partition in metadata.partitions:
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=10.0)
            if high > low:
                ends[partition] = high
        if not ends:
            return []
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in ends])
        records: list[Any] = []
        deadline = time.monotonic() + timeout_s
        while ends:
            if time.monotonic() > deadline:
                raise ConfigurationError(f"topic {topic} was not read to its end within {timeout_s:g} s")
            message = consumer.poll(0.5)
            if message is None:
                continue
            error = message.error()
            if error is not None:
                # The client looks up the group's coordinator even with assign(); nothing is committed, so
                # no ACL on that group is needed and its refusal is no error.
                if error.code() in _DENIED:
                    raise _denied(topic, error.name())
                if error.code() not in (KafkaError._PARTITION_EOF, KafkaError.GROUP_AUTHORIZATION_FAILED):
                    raise ConfigurationError(f"reading {topic}: {error.str()}")
                continue
            records.append(message)
            partition, offset = message.partition() or 0, message.offset() or 0
            if offset >= ends.get(partition, 0) - 1:
                ends.pop(partition, None)
        return records
    finally:
        consumer.close()


def _denied(topic: str, code: str) -> ConfigurationError:
    return ConfigurationError(
        f"not allowed to read topic {topic} ({code}): an operator needs the ACLs `sentiment-worker topics "
        "acls --role operator --principal User:NAME` prints"
    )


@dataclass(frozen=True)
class FleetView:
    """The desired state (None: none written) and the live replicas' latest status, by worker id; `stale`:
    replicas whose latest report is older than the age asked for (left out); `refused`: why a control
    record was not taken."""

    control_topic: str
    status_topic: str
    desired: DesiredState | None
    replicas: list[ReplicaStatus]
    stale: list[str] = field(default_factory=list)
    refused: str | None = None

    def to_json(self, max_age_s: float) -> dict[str, Any]:
        shadow = self.desired.shadow if self.desired is not None else None
        agreement = fleet_agreement(self.replicas, shadow.content_hash if shadow is not None else None)
        return {
            "control_topic": self.control_topic,
            "status_topic": self.status_topic,
            "desired": self.desired.model_dump(mode="json") if self.desired is not None else None,
            "control_record_refused": self.refused,
            "max_age_s": max_age_s,
            "replicas": [
                {**r.model_dump(mode="json"), "follows_desired": follows(r, self.desired)}
                for r in self.replicas
            ],
            "stale_replicas": self.stale,
            "agreement": agreement_figures(agreement) if agreement is not None else None,
        }


def read_fleet(sections: Sections, *, max_age_s: float, now_ms: int | None = None) -> FleetView:
    """The control topic's newest desired state and the status topic's latest record of each replica that
    reported within `max_age_s` (a tombstone removes a replica)."""
    group = sections.kafka.group_id
    control_topic = sections.live.control_topic_of(group)
    status_topic = sections.live.status_topic_of(group)
    desired, refused = read_desired(sections)
    latest: dict[str, ReplicaStatus | None] = {}
    for message in read_records(sections, status_topic):
        key = (message.key() or b"").decode("utf-8", "replace")
        if not key.startswith(REPLICA_KEY_PREFIX):
            continue
        try:
            latest[key.removeprefix(REPLICA_KEY_PREFIX)] = parse_status(message.value())
        except ValueError:
            continue  # not a status record: a replica's next report replaces it
    now_ms = now_ms if now_ms is not None else int(time.time() * 1000)
    oldest_ms = now_ms - max_age_s * 1000
    live = sorted(
        (s for s in latest.values() if s is not None and s.reported_at_ms >= oldest_ms),
        key=lambda s: s.worker_id,
    )
    stale = sorted(w for w, s in latest.items() if s is not None and s.reported_at_ms < oldest_ms)
    return FleetView(control_topic, status_topic, desired, live, stale, refused)


def read_desired(sections: Sections) -> tuple[DesiredState | None, str | None]:
    """The control topic's newest valid desired state (None: none written), and why a newer record was not
    taken (None: it was)."""
    desired: DesiredState | None = None
    refused: str | None = None
    for message in read_records(sections, sections.live.control_topic_of(sections.kafka.group_id)):
        if message.key() != DESIRED_KEY:
            continue
        try:
            desired = parse_desired(message.value())
            refused = None
        except ValueError as exc:
            refused = f"control record at offset {message.offset()} is not a desired state: {exc}"
    return desired, refused


def follows(replica: ReplicaStatus, desired: DesiredState | None) -> bool:
    """True when `replica` serves what `desired` names (no desired state: True) without a problem."""
    if desired is None:
        return replica.problem is None
    if replica.problem is not None:
        return False
    if desired.primary is not None and replica.primary.content_hash != desired.primary.content_hash:
        return False
    shadow_hash = replica.shadow.content_hash if replica.shadow is not None else None
    return shadow_hash == (desired.shadow.content_hash if desired.shadow is not None else None)


# ----- agreement -----
def fleet_agreement(replicas: Sequence[ReplicaStatus], shadow_hash: str | None) -> Agreement | None:
    """The shadow's agreement figures summed over `replicas` (only those shadowing `shadow_hash`; None: any
    shadow); None when no replica has figures."""
    parts = [
        r.agreement
        for r in replicas
        if r.agreement is not None and (shadow_hash is None or r.agreement.shadow_hash == shadow_hash)
    ]
    if not parts:
        return None
    confusion: dict[str, int] = {}
    for part in parts:
        for pair, count in part.confusion.items():
            confusion[pair] = confusion.get(pair, 0) + count
    return Agreement(
        shadow_hash=parts[0].shadow_hash,
        primary_version=parts[0].primary_version,
        shadow_version=parts[0].shadow_version,
        reviews=sum(p.reviews for p in parts),
        agreeing=sum(p.agreeing for p in parts),
        confusion=confusion,
        primary_confidence_sum=sum(p.primary_confidence_sum for p in parts),
        shadow_confidence_sum=sum(p.shadow_confidence_sum for p in parts),
        groups_shadowed=sum(p.groups_shadowed for p in parts),
        groups_skipped=sum(p.groups_skipped for p in parts),
    )


def agreement_figures(agreement: Agreement) -> dict[str, Any]:
    """What `models status` and `promote --live` show: reviews, agreement (share), the confusion table, each
    side's label mix (shares) and the largest shift between them, mean confidences, groups shadowed."""
    reviews = agreement.reviews

    def shares(side: str) -> dict[str, float]:
        mix = agreement.label_mix(side)
        total = sum(mix.values())
        return {label: round(count / total, 4) for label, count in sorted(mix.items())} if total else {}

    primary_mix, shadow_mix = shares("primary"), shares("shadow")
    labels = set(primary_mix) | set(shadow_mix)
    groups = agreement.groups_shadowed + agreement.groups_skipped
    return {
        "shadow_hash": agreement.shadow_hash,
        "primary_version": agreement.primary_version,
        "shadow_version": agreement.shadow_version,
        "reviews": reviews,
        "agreeing": agreement.agreeing,
        "agreement": round(agreement.agreeing / reviews, 4) if reviews else None,
        "confusion": dict(sorted(agreement.confusion.items())),
        "primary_label_mix": primary_mix,
        "shadow_label_mix": shadow_mix,
        "label_mix_shift": round(
            max((abs(shadow_mix.get(x, 0.0) - primary_mix.get(x, 0.0)) for x in labels), default=0.0), 4
        ),
        "primary_mean_confidence": round(agreement.primary_confidence_sum / reviews, 4) if reviews else None,
        "shadow_mean_confidence": round(agreement.shadow_confidence_sum / reviews, 4) if reviews else None,
        "groups_shadowed": agreement.groups_shadowed,
        "groups_skipped": agreement.groups_skipped,
        "groups_shadowed_share": round(agreement.groups_shadowed / groups, 4) if groups else None,
    }


# ----- writing the control topic -----
def choice_of(directory: Path) -> ModelChoice:
    """`directory` as a control record names it, verified first. Raises ModelRefused saying why not."""
    try:
        return model_choice(directory)
    except UnverifiedModelError as exc:
        raise ModelRefused(f"{directory} is refused, nothing was written: {exc}") from None


def changed_by(command: str) -> str:
    """Who wrote a desired state: `user@host command`."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    return f"{user}@{socket.gethostname()} {command}"[:256]


def write_desired(sections: Sections, desired: DesiredState, *, timeout_s: float = 30.0) -> None:
    """Writes `desired` to the group's control topic and waits for its acknowledgement
    (ConfigurationError when it is not)."""
    topic = sections.live.control_topic_of(sections.kafka.group_id)
    produce_desired(librdkafka_common(sections.kafka, sections.security), topic, desired, timeout_s=timeout_s)


def set_shadow(sections: Sections, directory: Path | None, *, by: str) -> DesiredState:
    """Writes a desired state with the current primary kept and `directory` as the shadow (None: no
    shadow); returns it. The directory is verified first (ModelRefused: nothing written)."""
    choice = choice_of(directory) if directory is not None else None
    current, _ = read_desired(sections)
    desired = DesiredState(
        primary=current.primary if current is not None else None,
        shadow=choice,
        changed_at_ms=int(time.time() * 1000),
        changed_by=by,
        decision=current.decision if current is not None else None,
    )
    write_desired(sections, desired)
    return desired


# ----- the promote gate -----
@dataclass(frozen=True)
class PromoteOutcome:
    """The gate's decision and, when promoted, the desired state written."""

    decision: GateDecision
    written: DesiredState | None


def heldout_gate(candidate: Path, incumbent: Path | None) -> tuple[list[str], list[str], dict[str, Any]]:
    """The held-out figures of both models' metrics.json (test accuracy, macro-F1, ECE) compared with
    `promote`'s margins: (refusals, notes, figures). A model without figures is noted, not refused."""
    figures: dict[str, Any] = {}
    notes: list[str] = []
    refusals: list[str] = []
    ours = _heldout(candidate)
    theirs = _heldout(incumbent) if incumbent is not None else None
    for side, values in (("candidate", ours), ("incumbent", theirs)):
        for name, value in (values or {}).items():
            figures[f"heldout_{name}_{side}"] = value
    if ours is None or theirs is None:
        missing = candidate if ours is None else incumbent
        notes.append(f"held-out gate not applied: no test figures in {missing}/{METRICS_FILE}")
        return refusals, notes, figures
    for name in ("accuracy", "macro_f1"):
        if ours[name] < theirs[name] - HELDOUT_MARGIN:
            refusals.append(f"held-out {name} {ours[name]:.4f} < {theirs[name]:.4f} - {HELDOUT_MARGIN:g}")
    if ours["ece"] > theirs["ece"] + HELDOUT_ECE_MARGIN:
        refusals.append(f"held-out ECE {ours['ece']:.4f} > {theirs['ece']:.4f} + {HELDOUT_ECE_MARGIN:g}")
    if not refusals:
        notes.append(
            f"held-out: accuracy {ours['accuracy']:.4f} vs {theirs['accuracy']:.4f}, macro-F1 "
            f"{ours['macro_f1']:.4f} vs {theirs['macro_f1']:.4f}, ECE {ours['ece']:.4f} vs "
            f"{theirs['ece']:.4f}: passes (each on its own held-out file)"
        )
    return refusals, notes, figures


def _heldout(directory: Path | None) -> dict[str, float] | None:
    if directory is None:
        return None
    try:
        data = json.loads((directory / METRICS_FILE).read_text(encoding="utf-8"))
        return {
            "accuracy": float(data["test_accuracy"]),
            "macro_f1": float(data["test_macro_f1"]),
            "ece": float(data["test_ece"]),
        }
    except (OSError, ValueError, KeyError, TypeError):
        return None


def live_gate(
    sections: Sections, fleet: FleetView, choice: ModelChoice
) -> tuple[list[str], list[str], dict[str, Any]]:
    """The shadow's live figures summed over the live replicas, against promote_min_agreement and
    promote_min_shadowed: (refusals, notes, figures)."""
    live = sections.live
    shadow = fleet.desired.shadow if fleet.desired is not None else None
    if shadow is None or shadow.content_hash != choice.content_hash:
        now = f"the shadow is {shadow.path}" if shadow is not None else "there is no shadow"
        refusal = f"{choice.path} is not the current shadow ({now}): `models shadow {choice.path}` first"
        return [refusal], [], {}
    agreement = fleet_agreement(fleet.replicas, choice.content_hash)
    figures: dict[str, Any] = {"replicas_reporting": len(fleet.replicas)}
    if agreement is None:
        return [f"no live replica reports figures for the shadow {choice.path}"], [], figures
    shown = agreement_figures(agreement)
    figures.update({k: v for k, v in shown.items() if not isinstance(v, dict) and k not in ("shadow_hash",)})
    refusals: list[str] = []
    if agreement.reviews < live.promote_min_shadowed:
        refusals.append(
            f"shadowed on {agreement.reviews} live reviews, fewer than {live.promote_min_shadowed} "
            "(SENTIMENT_PROMOTE_MIN_SHADOWED)"
        )
    share = shown["agreement"]
    if share is not None and share < live.promote_min_agreement:
        refusals.append(
            f"agrees with the primary on {share:.1%} of {agreement.reviews} reviews, less than "
            f"{live.promote_min_agreement:.1%} (SENTIMENT_PROMOTE_MIN_AGREEMENT)"
        )
    note = (
        f"live: {agreement.reviews} reviews over {len(fleet.replicas)} replicas, agreement "
        f"{share if share is not None else 0:.1%}, label-mix shift {shown['label_mix_shift']:.1%}, mean "
        f"confidence {shown['shadow_mean_confidence']} (primary {shown['primary_mean_confidence']})"
    )
    return refusals, [note], figures


def promote(
    sections: Sections, directory: Path, *, live: bool, force: bool, max_age_s: float, by: str
) -> PromoteOutcome:
    """Gates `directory` as the next primary; when it passes (or `force`), writes a desired state naming it
    the primary (a shadow that was it is dropped, another shadow kept) with the decision. Raises
    ModelRefused (nothing written) when the directory fails verification."""
    choice = choice_of(directory)
    fleet = read_fleet(sections, max_age_s=max_age_s)
    current = fleet.desired
    primary = current.primary if current is not None else None
    incumbent = Path(primary.path if primary is not None else sections.model.model)
    refusals, notes, figures = heldout_gate(directory, incumbent if incumbent.is_dir() else None)
    figures["candidate_hash"] = choice.content_hash
    figures["incumbent"] = str(incumbent)
    if primary is not None and primary.content_hash == choice.content_hash:
        refusals.append(f"{directory} is already the primary")
    if live:
        more, live_notes, live_figures = live_gate(sections, fleet, choice)
        refusals += more
        notes += live_notes
        figures.update(live_figures)
    promoted = not refusals or force
    decision = GateDecision(
        promoted=promoted,
        forced=bool(refusals) and force,
        reasons=[*(f"refused: {r}" for r in refusals), *notes],
        figures=figures,
    )
    if not promoted:
        return PromoteOutcome(decision, None)
    shadow = current.shadow if current is not None else None
    desired = DesiredState(
        primary=choice,
        shadow=None if shadow is not None and shadow.content_hash == choice.content_hash else shadow,
        changed_at_ms=int(time.time() * 1000),
        changed_by=by,
        decision=decision,
    )
    write_desired(sections, desired)
    return PromoteOutcome(decision, desired)
