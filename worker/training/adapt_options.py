"""What an `adapt` run is asked to do (AdaptOptions) and the schedule it sizes from the data (Schedule)."""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from worker.training.options import TrainingError

DEFAULT_BASE = Path("models/default")
RECIPE_BATCH = 32
"""Examples per optimizer step (user rows and rehearsal rows together)."""

# Options that may differ between an interrupted run and its resumption.
_RESUME_FREE = {"output_dir", "resume", "force", "int8", "device", "max_minutes", "checkpoint_every"}


@dataclass(frozen=True)
class AdaptOptions:
    """The recipe's knobs; the defaults are the recipe (docs/adapt.md)."""

    output_dir: Path
    base: Path = DEFAULT_BASE
    seed: int = 42
    learning_rate: float = 6e-5
    """Peak learning rate (linear warm-up over `warmup_fraction` of the steps, then linear decay)."""
    warmup_fraction: float = 0.1
    weight_decay: float = 0.01
    max_grad_norm: float = 1.0
    batch_size: int = RECIPE_BATCH
    """The recipe batch: examples per optimizer step (accumulated in micro-batches if it does not fit)."""
    micro_batch: int | None = None
    """Examples per forward pass (None: the whole recipe batch, or what the GPU memory plan allows)."""
    rehearsal: float = 1.0
    """Corpus train rows rehearsed per user train row (a seeded sample; 0 = no rehearsal)."""
    distill_weight: float = 1.0
    """Weight of KL(base ‖ adapted) on the rehearsal rows (0 = gold labels only)."""
    balance: bool = True
    """Weight the user rows' loss by class (n / (2·n_class)), so a skewed label prior is not learnt."""
    dev_fraction: float = 0.1
    test_fraction: float = 0.2
    corpus_dev_size: int = 1000
    """Corpus dev reviews early stopping watches (a seeded sample of the base's dev split)."""
    epochs: int | None = None
    """None: sized from the data (Schedule)."""
    max_minutes: float = 60.0
    """Cap on the whole run (the INT8 form aside): the steps are cut to what fits, by the measured step and
    evaluation times."""
    evals_per_epoch: int = 4
    patience: int = 5
    """Early stopping: evaluations without a better score (4 per epoch: more than an epoch)."""
    select: str = "both"
    """Early stopping's score: ``both`` (user dev + corpus dev accuracy) or ``user`` (user dev alone)."""
    corpus_tolerance: float = 0.02
    """Early stopping: an evaluation counts only if corpus dev accuracy is within this of the base's (a guard
    against disasters; the score weighs the corpus dev in)."""
    max_seq_len: int = 128
    checkpoint_every: int = 20
    """Checkpoint every N optimizer steps (and at every evaluation and on SIGINT)."""
    amp: bool = True
    """Mixed precision with a loss scaler, on a GPU only."""
    device: str = "auto"
    resume: bool = False
    force: bool = False
    int8: bool = True

    def validate(self) -> None:
        """Raise TrainingError for impossible settings."""
        problems = []
        if self.learning_rate <= 0 or self.batch_size < 1:
            problems.append("learning rate must be > 0 and batch size >= 1")
        if self.micro_batch is not None and not 1 <= self.micro_batch <= self.batch_size:
            problems.append("micro batch must be between 1 and the batch size")
        if self.rehearsal < 0 or self.distill_weight < 0:
            problems.append("rehearsal and distill weight must be >= 0")
        if not (0 < self.dev_fraction < 0.5 and 0 < self.test_fraction < 0.5):
            problems.append("dev and test fractions must be in (0, 0.5)")
        if self.epochs is not None and self.epochs < 1:
            problems.append("epochs must be >= 1")
        if self.select not in ("both", "user"):
            problems.append(f"select must be both or user, not {self.select!r}")
        if self.patience < 1 or self.evals_per_epoch < 1 or self.checkpoint_every < 1:
            problems.append("patience, evals per epoch and checkpoint every must be >= 1")
        if problems:
            raise TrainingError("; ".join(problems))

    def fingerprint(self, data_key: str) -> str:
        """What must match for --resume to continue the same run: the options and the user's data."""
        fixed = {k: str(v) for k, v in asdict(self).items() if k not in _RESUME_FREE}
        blob = json.dumps({"options": fixed, "data": data_key}, sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]

    def to_json(self) -> dict[str, Any]:
        return {k: str(v) if isinstance(v, Path) else v for k, v in asdict(self).items()}


def sized_epochs(user_train: int) -> int:
    """Epochs over the user's train rows: more passes over little data, one over a lot (1,000 rows: 4,
    2,000: 3, 10,000: 2, 30,000 and more: 1)."""
    if user_train <= 1_500:
        return 4
    if user_train <= 5_000:
        return 3
    if user_train <= 20_000:
        return 2
    return 1


@dataclass(frozen=True)
class Schedule:
    """Steps per epoch, epochs, evaluation interval, and whether the time cap cut it."""

    steps_per_epoch: int
    epochs: int
    eval_every: int
    capped_steps: int | None = None
    """When set: the total the time cap allows (fewer than epochs × steps_per_epoch)."""

    @property
    def total_steps(self) -> int:
        full = self.steps_per_epoch * self.epochs
        return full if self.capped_steps is None else min(full, self.capped_steps)


def plan_schedule(
    options: AdaptOptions,
    rows_per_epoch: int,
    step_seconds: float | None,
    *,
    eval_seconds: float = 0.0,
    spent_seconds: float = 0.0,
    closing_seconds: float = 0.0,
) -> Schedule:
    """The schedule for `rows_per_epoch` (user train + rehearsal), cut so that the whole run fits
    `max_minutes`: the `spent_seconds` already gone, the `closing_seconds` of the closing evaluation and one
    evaluation (the last, which the steps' shares below round down) are taken off, then each step costs a
    measured `step_seconds` plus its share of an `eval_seconds` evaluation (None: not measured, no cap)."""
    steps = max(1, math.ceil(rows_per_epoch / options.batch_size))
    user_rows = rows_per_epoch / (1.0 + options.rehearsal)
    epochs = options.epochs or sized_epochs(int(user_rows))
    eval_every = max(1, steps // options.evals_per_epoch)
    capped = None
    if step_seconds and step_seconds > 0:
        left = options.max_minutes * 60 - spent_seconds - closing_seconds - eval_seconds
        fits = int(left / (step_seconds + eval_seconds / eval_every))
        if fits < steps * epochs:
            capped = max(1, fits)
    return Schedule(steps, epochs, eval_every, capped)
