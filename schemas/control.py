"""The model-control contract: what the fleet should serve (the control topic) and what each replica serves
(the status topic). Both topics are compacted, one partition each, keyed per consumer group.

- Control topic, key `desired`: a `DesiredState`, the primary model and an optional shadow, each named by a
  directory every replica can read and the content hash of its files (`sentiment-worker model-manifest
  --check DIR` prints it). Operators write it (`sentiment-worker models shadow|promote`); workers only read
  it.
- Status topic, key `replica/<worker_id>`: a `ReplicaStatus`, what that replica serves now, the desired state
  it follows, a problem it has with it, and the shadow's agreement figures on its live traffic. Each worker
  writes its own key; `models status` and `models promote --live` read them.

A record is data: it names directories and hashes, never code; a worker loads a named directory only after its
files match the hash and its manifest (docs/model-trust.md). A value that does not parse is reported and
ignored, never loaded.
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import BaseModel, ConfigDict, Field, field_validator

DESIRED_KEY = b"desired"
REPLICA_KEY_PREFIX = "replica/"
MAX_CONTROL_VALUE_BYTES = 64 * 1024
"""A control or status value larger than this is refused before it is parsed."""


class ModelChoice(BaseModel):
    """A model directory and the content hash its files must have (64 hex characters)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    path: str = Field(min_length=1, max_length=4096, description="A model directory every replica can read.")
    content_hash: str = Field(
        pattern=r"^[0-9a-f]{64}$",
        description="sha256 of the directory's manifest (`model-manifest --check`).",
    )

    @field_validator("path")
    @classmethod
    def _no_control_characters(cls, value: str) -> str:
        if any(ord(char) < 32 for char in value):
            raise ValueError("a model path has no control characters")
        return value


class ModelsChange(BaseModel):
    """The body of `PUT /v1/admin/models` (`serve` without a broker): the directories to serve. A key left out
    keeps what is served; `"primary": null` is the model the replica was started with, `"shadow": null` no
    shadow."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    primary: str | None = Field(default=None, min_length=1, max_length=4096)
    shadow: str | None = Field(default=None, min_length=1, max_length=4096)

    @field_validator("primary", "shadow")
    @classmethod
    def _no_control_characters(cls, value: str | None) -> str | None:
        if value is not None and any(ord(char) < 32 for char in value):
            raise ValueError("a model path has no control characters")
        return value


class GateDecision(BaseModel):
    """Why a primary was chosen: the figures `models promote` measured and whether a gate was forced."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    promoted: bool
    forced: bool = False
    reasons: list[str] = Field(default_factory=list, description="Each gate's verdict, in words.")
    figures: dict[str, float | int | str | None] = Field(default_factory=dict)


class DesiredState(BaseModel):
    """What every replica of a consumer group should serve (the control topic's `desired` key)."""

    SCHEMA_NAME: ClassVar[str] = "sentiment-control"
    SCHEMA_VERSION: ClassVar[int] = 1

    model_config = ConfigDict(frozen=True, extra="forbid")

    schema_name: str = Field(default=SCHEMA_NAME, pattern="^sentiment-control$")
    schema_version: int = Field(default=SCHEMA_VERSION, ge=1, le=1)
    primary: ModelChoice | None = Field(
        default=None, description="None: the model each replica was started with (SENTIMENT_MODEL)."
    )
    shadow: ModelChoice | None = None
    changed_at_ms: int = Field(ge=0)
    changed_by: str = Field(default="", max_length=256)
    decision: GateDecision | None = None


class ServedRef(BaseModel):
    """One model a replica serves: its identity and where it came from."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    version: str
    content_hash: str | None = None
    path: str | None = None


class Agreement(BaseModel):
    """The shadow's figures on a replica's live traffic since it started shadowing (`shadow_hash`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    shadow_hash: str | None = None
    primary_version: str = ""
    shadow_version: str = ""
    reviews: int = 0
    agreeing: int = 0
    confusion: dict[str, int] = Field(
        default_factory=dict, description="`<primary label>-><shadow label>`: how many reviews."
    )
    primary_confidence_sum: float = 0.0
    shadow_confidence_sum: float = 0.0
    groups_shadowed: int = 0
    groups_skipped: int = 0

    def label_mix(self, side: str) -> dict[str, int]:
        """How many reviews each label got from `side` ("primary" or "shadow")."""
        mix: dict[str, int] = {}
        for pair, count in self.confusion.items():
            primary, _, shadow = pair.partition("->")
            label = primary if side == "primary" else shadow
            mix[label] = mix.get(label, 0) + count
        return mix


class ReplicaStatus(BaseModel):
    """What one replica serves now (the status topic's `replica/<worker_id>` key)."""

    SCHEMA_NAME: ClassVar[str] = "sentiment-replica-status"

    model_config = ConfigDict(frozen=True, extra="forbid")

    schema_name: str = Field(default=SCHEMA_NAME, pattern="^sentiment-replica-status$")
    worker_id: str
    primary: ServedRef
    shadow: ServedRef | None = None
    desired_at_ms: int | None = Field(
        default=None,
        description="`changed_at_ms` of the desired state this replica follows (None: none read).",
    )
    problem: str | None = Field(default=None, description="Why the replica does not serve the desired state.")
    agreement: Agreement | None = None
    reported_at_ms: int


def parse_desired(value: bytes | None) -> DesiredState | None:
    """The desired state a control record holds; None for a tombstone. Raises ValueError (with the reason) for
    a value that is too large or not a valid `DesiredState`."""
    if value is None:
        return None
    if len(value) > MAX_CONTROL_VALUE_BYTES:
        raise ValueError(f"control value of {len(value):,} bytes, more than {MAX_CONTROL_VALUE_BYTES:,}")
    return DesiredState.model_validate_json(value)


def parse_status(value: bytes | None) -> ReplicaStatus | None:
    """A status record's replica status; None for a tombstone. Raises ValueError like `parse_desired`."""
    if value is None:
        return None
    if len(value) > MAX_CONTROL_VALUE_BYTES:
        raise ValueError(f"status value of {len(value):,} bytes, more than {MAX_CONTROL_VALUE_BYTES:,}")
    return ReplicaStatus.model_validate_json(value)
