"""`adapt`: the served default fine-tuned on a team's own labelled reviews, gaining on them without forgetting
the corpus, and gated on both.

The recipe (docs/adapt.md; the alternatives measured in docs/model-history.md):
1. The user's reviews split seeded and stratified into train / dev / held-out; the held-out is never
   trained on nor selected on.
2. Each optimizer step mixes user train rows with rehearsed corpus train rows (a seeded sample of the base's
   own train split, `rehearsal` per user row). The user rows' cross-entropy is weighted by class (the file's
   label prior is not learnt); the rehearsal rows' loss is their cross-entropy plus `distill_weight` times
   KL(base ‖ adapted), the base's probabilities computed once before training.
3. AdamW at 6e-5, linear warm-up and decay, a schedule sized to the data and cut so that the run fits
   `max_minutes` by a measured step. Early stopping on both devs: each evaluation scores user dev
   accuracy + corpus dev accuracy (`select="both"`; `"user"`: the user dev alone), an evaluation whose
   corpus dev accuracy falls more than `corpus_tolerance` below the base's does not count, and the best
   score is kept (the base itself, step 0, included: a run that never beats it keeps it, and the gate says
   so).
4. A temperature fitted on both dev splits (the user's and the corpus's) is folded into the classification
   layer.
Then the report and the gate (`adapt_report`) and the model directory (`adapt_output`).

Long work: an estimate before the first step, a progress line with ETA, a checkpoint every
`checkpoint_every` steps and at each evaluation; `stop` (set by SIGINT in the CLI) checkpoints and returns;
`resume` continues from the last checkpoint (also after kill -9). Batch order and dropout depend only on
(seed, epoch, step), so a resumed run ends with the weights of an uninterrupted one.
"""

from __future__ import annotations

import json
import random
import shutil
import threading
import time
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from worker.model.classifier import DEFAULT_LABELS
from worker.model.device import DeviceUnavailableError, activate, choose_device
from worker.model.manifest import UnverifiedModelError, verify_model_dir
from worker.model.metadata import METADATA_FILE, ModelMetadata
from worker.model.weights import build_classifier, load_tokenizer
from worker.training.adapt_data import AdaptData, class_weights, data_key, prepare
from worker.training.adapt_options import AdaptOptions, Schedule, plan_schedule
from worker.training.adapt_output import BASE_PROBS_FILE, write_adapted
from worker.training.adapt_plan import (
    Estimate,
    PaddleTrainMemoryProbe,
    StepPlan,
    TrainMemoryProbe,
    measure,
    plan_step,
)
from worker.training.adapt_report import CORPUS, USER, AdaptReport, changed_labels, compare, gate_reasons
from worker.training.checkpoints import LoopState, load_checkpoint, save_checkpoint
from worker.training.corpus import LabeledText
from worker.training.data import bucketed_batches, encode, forward, micro_batches, pad_batch, predict_probs
from worker.training.options import CHECKPOINT_DIR, METRICS_FILE, TrainingError, Truncation
from worker.training.temperature import fit_temperature

PROGRESS_SECONDS = 15.0
SETS = ("user_train", "user_dev", "user_heldout", "rehearsal", "corpus_dev", "corpus_heldout")
BASE_SETS = ("rehearsal", "user_dev", "user_heldout", "corpus_dev", "corpus_heldout")


@dataclass(frozen=True)
class AdaptResult:
    """What a run produced: the directory, whether it was interrupted (a checkpoint, no model), the report."""

    output_dir: Path
    interrupted: bool
    steps: int
    seconds: float
    report: AdaptReport | None = None
    int8_dir: Path | None = None


def adapt(
    options: AdaptOptions,
    examples: Sequence[LabeledText],
    *,
    progress: Callable[[str], None] = print,
    stop: threading.Event | None = None,
    memory_probe: TrainMemoryProbe | None = None,
    stop_after_steps: int | None = None,
) -> AdaptResult:
    """Adapt `options.base` to `examples` (the user's labelled reviews) and write `options.output_dir`.

    `stop`: when set, the run checkpoints after the current step and returns interrupted. `memory_probe`
    replaces the GPU memory probe; `stop_after_steps` stops (checkpointed) after that many steps (tests).
    Raises TrainingError for what the user can fix."""
    import paddle

    with paddle.utils.unique_name.guard():  # fresh optimizer-state names: a checkpoint matches on resume
        return _Run(options, list(examples), progress, stop or threading.Event(), memory_probe).run(
            stop_after_steps
        )


class _Run:
    def __init__(
        self,
        options: AdaptOptions,
        examples: list[LabeledText],
        progress: Callable[[str], None],
        stop: threading.Event,
        memory_probe: TrainMemoryProbe | None,
    ) -> None:
        self.options, self.examples, self.say, self.stop = options, examples, progress, stop
        self.memory_probe = memory_probe
        self.out = Path(options.output_dir)
        self.ckpt = self.out / CHECKPOINT_DIR
        self.started = time.monotonic()

    # Step 1: data, base model, token ids, the base's probabilities.
    def _setup(self) -> None:
        import paddle

        o = self.options
        o.validate()
        try:
            self.device = choose_device(o.device)  # type: ignore[arg-type]
        except DeviceUnavailableError as exc:
            raise TrainingError(f"device: {exc}") from None
        activate(self.device)
        random.seed(o.seed)
        np.random.seed(o.seed)
        paddle.seed(o.seed)
        self.out.mkdir(parents=True, exist_ok=True)
        self.fingerprint = o.fingerprint(data_key(self.examples))
        try:
            verified = verify_model_dir(o.base)
        except UnverifiedModelError as exc:
            raise TrainingError(f"--base: {exc}") from None
        self.data: AdaptData = prepare(
            self.examples, o.base, seed=o.seed, dev_fraction=o.dev_fraction, test_fraction=o.test_fraction,
            rehearsal=o.rehearsal, corpus_dev_size=o.corpus_dev_size, progress=self.say,
        )  # fmt: skip
        sizes = self.data.sizes()
        self.say(
            f"user split (seed {o.seed}, stratified): train {sizes['user_train']}, dev {sizes['user_dev']}, "
            f"held-out {sizes['user_heldout']} (never trained on); rehearsal {sizes['rehearsal']} corpus "
            f"reviews, corpus dev {sizes['corpus_dev']}, corpus held-out {sizes['corpus_heldout']}"
        )
        self.say(f"corpus: {self.data.corpus_note}")
        self.model = build_classifier(verified, num_labels=len(DEFAULT_LABELS))
        self.tokenizer = load_tokenizer(o.base)
        self.pad_id = int(self.tokenizer.pad_token_id)
        base_meta = ModelMetadata.read(o.base / METADATA_FILE)
        self.seq_len = min(o.max_seq_len, base_meta.max_seq_len)
        metrics_path = o.base / METRICS_FILE
        recorded = json.loads(metrics_path.read_text("utf-8")) if metrics_path.is_file() else {}
        truncation = (recorded.get("hyper_parameters") or {}).get("truncation", "head")
        self.truncation: Truncation = "head_tail" if truncation == "head_tail" else "head"
        parts = {
            "user_train": self.data.user.train, "user_dev": self.data.user.dev,
            "user_heldout": self.data.user.test, "rehearsal": self.data.rehearsal,
            "corpus_dev": self.data.corpus_dev, "corpus_heldout": self.data.corpus_heldout,
        }  # fmt: skip
        self.ids = {
            name: encode(self.tokenizer, rows, self.seq_len, self.truncation) for name, rows in parts.items()
        }
        self.labels = {
            name: np.array([ex.label_id for ex in rows], dtype=np.int64) for name, rows in parts.items()
        }
        self.base_probs = self._base_probabilities()

    def _base_probabilities(self) -> dict[str, np.ndarray]:
        """The base's probabilities on every set but the user train rows: kept beside the checkpoint, so a
        resumed run reads them back instead of labelling again (the model is the base until resumed)."""
        path = self.out / BASE_PROBS_FILE
        if path.is_file():
            with np.load(path, allow_pickle=False) as saved:
                if str(saved["fingerprint"]) == self.fingerprint:
                    self.eval_rate = float(saved["eval_rate"])
                    return {name: saved[name] for name in BASE_SETS}
        rows = sum(len(self.ids[name]) for name in BASE_SETS)
        self.say(f"labelling {rows} reviews with the base (rehearsal targets and the base's figures)")
        started = time.perf_counter()
        probs = {name: predict_probs(self.model, self.ids[name], self.pad_id) for name in BASE_SETS}
        self.eval_rate = rows / max(time.perf_counter() - started, 1e-9)
        tmp = path.with_name(path.name + ".tmp.npz")
        np.savez(tmp, fingerprint=np.array(self.fingerprint), eval_rate=np.array(self.eval_rate), **probs)
        tmp.replace(path)
        return probs

    # Step 2: the train rows, the step plan, the schedule and the estimate.
    def _prepare_training(self) -> None:
        o = self.options
        user_labels, n_user = self.labels["user_train"], len(self.ids["user_train"])
        self.train_ids = self.ids["user_train"] + self.ids["rehearsal"]
        self.train_labels = np.concatenate([user_labels, self.labels["rehearsal"]])
        weights = class_weights(user_labels, len(DEFAULT_LABELS)) if o.balance else np.ones(2, np.float32)
        self.row_weights = np.concatenate(
            [weights[user_labels], np.ones(len(self.ids["rehearsal"]), np.float32)]
        ).astype(np.float32)
        self.soft = np.zeros((len(self.train_ids), len(DEFAULT_LABELS)), np.float32)
        self.soft[n_user:] = self.base_probs["rehearsal"]
        self.rehearsed = np.zeros(len(self.train_ids), np.float32)
        self.rehearsed[n_user:] = 1.0
        counts = np.bincount(user_labels, minlength=2)
        self.say(
            f"user train labels: {counts[0]} negative / {counts[1]} positive"
            + (f"; loss weights {weights[0]:.2f} / {weights[1]:.2f} (class-balanced)" if o.balance else "")
        )
        self.lengths = [len(s) for s in self.train_ids]
        probe = self.memory_probe
        if probe is None and self.device.kind == "gpu":
            empty = self.tokenizer.convert_tokens_to_ids(self.tokenizer.tokenize("好"))
            probe = PaddleTrainMemoryProbe(self.model, self.pad_id, int(empty[0]) if empty else 1, o.amp)
        longest = max(self.lengths)
        self.plan: StepPlan = plan_step(
            o.batch_size, longest, device_kind=self.device.kind, amp=o.amp, micro_batch=o.micro_batch,
            memory_probe=probe,
        )  # fmt: skip
        self.say(f"step: {o.batch_size} reviews per optimizer step as {self.plan.describe()}")
        first = bucketed_batches(self.lengths, o.batch_size, random.Random(0))
        sample = max(first, key=len)
        self.model.train()
        step_seconds = measure(lambda: self._backward(sample, measure_only=True), repeats=1)
        eval_rows = len(self.ids["user_dev"]) + len(self.ids["corpus_dev"])
        final_rows = eval_rows + len(self.ids["user_heldout"]) + len(self.ids["corpus_heldout"])
        self.schedule: Schedule = plan_schedule(
            o, len(self.train_ids), step_seconds,
            eval_seconds=eval_rows / max(self.eval_rate, 1e-9),
            spent_seconds=time.monotonic() - self.started,
            closing_seconds=final_rows / max(self.eval_rate, 1e-9),
        )  # fmt: skip
        s = self.schedule
        evaluations = -(-s.total_steps // s.eval_every)
        self.estimate = Estimate(
            step_seconds, s.total_steps, evaluations, eval_rows, self.eval_rate, final_rows
        )
        self.say(
            f"schedule: {s.epochs} epochs x {s.steps_per_epoch} steps of {o.batch_size} "
            f"({len(self.train_ids)} rows per epoch), lr {o.learning_rate:g}, evaluation every "
            f"{s.eval_every} steps, early stopping after {o.patience} without a better one"
            + (f"; cut to {s.total_steps} steps by --max-minutes {o.max_minutes:g}" if s.capped_steps else "")
        )
        self.say(self.estimate.describe())

    def _backward(self, batch: Sequence[int], measure_only: bool = False) -> float:
        """Forward and backward of one optimizer step's rows in micro-batches; the summed loss. The
        gradients are cleared again when `measure_only`."""
        import paddle
        import paddle.nn.functional as F

        o, plan = self.options, self.plan
        total = 0.0
        for idx in micro_batches(batch, plan.micro_batch):
            ids, mask = pad_batch([self.train_ids[i] for i in idx], self.pad_id)
            amp = paddle.amp.auto_cast(level="O1") if plan.amp else nullcontext()
            with amp:
                logits = forward(self.model, ids, mask)
            logits = logits.astype("float32")
            labels = paddle.to_tensor(self.train_labels[idx])
            rows = F.cross_entropy(logits, labels, reduction="none").reshape([-1])
            rows = rows * paddle.to_tensor(self.row_weights[idx])
            if o.distill_weight and self.rehearsed[idx].any():
                soft = paddle.to_tensor(self.soft[idx])
                log_p = F.log_softmax(logits, axis=-1)
                kl = (soft * (paddle.log(paddle.clip(soft, min=1e-12)) - log_p)).sum(axis=-1)
                rows = rows + o.distill_weight * kl * paddle.to_tensor(self.rehearsed[idx])
            loss = rows.sum() / len(batch)
            (self.scaler.scale(loss) if self.scaler is not None and not measure_only else loss).backward()
            total += float(loss)
        if measure_only:
            self.model.clear_gradients()
        return total

    def _evaluate(self, step: int) -> dict[str, float]:
        user = predict_probs(self.model, self.ids["user_dev"], self.pad_id)
        corpus = predict_probs(self.model, self.ids["corpus_dev"], self.pad_id)
        self.model.train()
        return self._scored(step, user, corpus)

    def _scored(self, step: int, user: np.ndarray, corpus: np.ndarray) -> dict[str, float]:
        user_acc = float((user.argmax(axis=1) == self.labels["user_dev"]).mean())
        corpus_acc = float((corpus.argmax(axis=1) == self.labels["corpus_dev"]).mean())
        base_corpus = float(
            (self.base_probs["corpus_dev"].argmax(axis=1) == self.labels["corpus_dev"]).mean()
        )
        eligible = corpus_acc >= base_corpus - self.options.corpus_tolerance
        score = user_acc + (corpus_acc if self.options.select == "both" else 0.0)
        return {
            "step": step, "user_dev_accuracy": user_acc, "corpus_dev_accuracy": corpus_acc,
            "eligible": float(eligible), "score": score if eligible else -1.0,
        }  # fmt: skip

    def _checkpoint(self) -> None:
        save_checkpoint(self.ckpt, self.model, self.optimizer, self.scaler, self.state, self.fingerprint)

    def _keep_if_best(self, record: dict[str, float]) -> None:
        import paddle

        state = self.state
        state.history.append(record)
        if record["score"] > state.best_dev:
            state.best_dev, state.best_step, state.bad_epochs = record["score"], int(record["step"]), 0
            self.ckpt.mkdir(parents=True, exist_ok=True)
            paddle.save(self.model.state_dict(), str(self.ckpt / "best.pdparams"))
        else:
            state.bad_epochs += 1
        mark = "" if record["eligible"] else " (corpus dev fell too far: not eligible)"
        self.say(
            f"step {int(record['step'])}: user dev {record['user_dev_accuracy']:.4f}, corpus dev "
            f"{record['corpus_dev_accuracy']:.4f}{mark}; best so far step {state.best_step}"
        )

    # Step 3: the loop.
    def run(self, stop_after_steps: int | None) -> AdaptResult:
        import paddle
        from paddlenlp.transformers.optimization import LinearDecayWithWarmup

        o = self.options
        self._setup()
        self.scaler = (
            paddle.amp.GradScaler(init_loss_scaling=2.0**15) if self.device.kind == "gpu" and o.amp else None
        )
        self._prepare_training()
        s = self.schedule
        lr = LinearDecayWithWarmup(o.learning_rate, s.total_steps, o.warmup_fraction)
        no_decay = {p.name for n, p in self.model.named_parameters() if "bias" in n or "norm" in n}
        self.lr = lr
        self.optimizer = paddle.optimizer.AdamW(
            learning_rate=lr, parameters=self.model.parameters(), weight_decay=o.weight_decay,
            apply_decay_param_fun=lambda name: name not in no_decay,
            grad_clip=paddle.nn.ClipGradByGlobalNorm(o.max_grad_norm) if o.max_grad_norm > 0 else None,
        )  # fmt: skip
        if o.resume:
            self.state = load_checkpoint(
                self.ckpt, self.model, self.optimizer, self.scaler, {self.fingerprint}
            )
            self.say(f"resumed from {self.ckpt} at step {self.state.global_step} of {s.total_steps}")
        else:
            if self.ckpt.exists():
                shutil.rmtree(self.ckpt)
            self.state = LoopState(best_dev=-3.0)
            self._keep_if_best(self._scored(0, self.base_probs["user_dev"], self.base_probs["corpus_dev"]))
            self._checkpoint()
        interrupted = self._loop(stop_after_steps)
        if interrupted:
            return AdaptResult(self.out, True, self.state.global_step, time.monotonic() - self.started)
        return self._finish()

    def _loop(self, stop_after_steps: int | None) -> bool:
        import paddle

        o, s, state = self.options, self.schedule, self.state
        session_steps, step_seconds, last_line = 0, 0.0, time.monotonic()
        eval_seconds = self.estimate.eval_rows / max(self.estimate.eval_rows_per_second, 1e-9)
        while state.epoch <= s.epochs and state.global_step < s.total_steps and state.bad_epochs < o.patience:
            batches = bucketed_batches(
                self.lengths, o.batch_size, random.Random(o.seed * 1_000_003 + state.epoch)
            )
            for step, batch in enumerate(batches, start=1):
                if step <= state.step_in_epoch:
                    continue  # done before the interruption
                paddle.seed(o.seed * 7919 + state.global_step * 31)  # dropout: a function of the step
                tick = time.monotonic()
                loss = self._backward(batch)
                if self.scaler is not None:
                    self.scaler.step(self.optimizer)
                    self.scaler.update()
                else:
                    self.optimizer.step()
                self.lr.step()
                self.optimizer.clear_grad()
                state.global_step += 1
                state.step_in_epoch = step
                state.seen += len(batch)
                state.epoch_loss_sum += loss
                state.epoch_loss_steps += 1
                session_steps += 1
                now = time.monotonic()
                step_seconds += now - tick
                if now - last_line >= PROGRESS_SECONDS or session_steps == 1:
                    per_step = step_seconds / session_steps
                    steps_left = s.total_steps - state.global_step
                    evals_left = -(-steps_left // s.eval_every)
                    left = steps_left * per_step + evals_left * eval_seconds + self.estimate.final_seconds
                    self.say(
                        f"step {state.global_step}/{s.total_steps} epoch {state.epoch}/{s.epochs} loss "
                        f"{state.epoch_loss_sum / state.epoch_loss_steps:.4f} {len(batch) / per_step:.0f} "
                        f"reviews/s ETA {left / 60:.1f} min"
                    )
                    last_line = now
                last = step == len(batches) or state.global_step >= s.total_steps
                if state.global_step % s.eval_every == 0 or last:
                    tick = time.monotonic()
                    self._keep_if_best(self._evaluate(state.global_step))
                    eval_seconds = time.monotonic() - tick  # the latest: the machine's load changes
                    self._checkpoint()
                elif state.global_step % o.checkpoint_every == 0:
                    self._checkpoint()
                if state.bad_epochs >= o.patience:
                    self.say(f"early stop: {o.patience} evaluations without a better one")
                    break
                if state.global_step >= s.total_steps:
                    break
                if self.stop.is_set() or (
                    stop_after_steps is not None and state.global_step >= stop_after_steps
                ):
                    self._checkpoint()
                    return True
            else:
                state.epoch += 1
                state.step_in_epoch = 0
                state.epoch_loss_sum, state.epoch_loss_steps = 0.0, 0
                self._checkpoint()
                continue
            break
        self._checkpoint()
        return False

    # Step 4: the best weights, calibrated, reported, gated and written.
    def _finish(self) -> AdaptResult:
        import paddle

        o, state = self.options, self.state
        self.model.set_state_dict(paddle.load(str(self.ckpt / "best.pdparams")))
        # Both devs: the user's alone (a few hundred reviews, the step selected on it) gave a temperature
        # that left the adapted model overconfident on both held-out sets (docs/model-history.md).
        devs = ("user_dev", "corpus_dev")
        temperature = fit_temperature(
            np.concatenate([predict_probs(self.model, self.ids[name], self.pad_id) for name in devs]),
            np.concatenate([self.labels[name] for name in devs]),
        )
        classifier = self.model.classifier
        classifier.weight.set_value(classifier.weight / temperature)
        classifier.bias.set_value(classifier.bias / temperature)
        self.say(
            f"kept step {state.best_step}; temperature {temperature:.3f} fitted on the user and corpus devs"
        )
        adapted = {
            USER: predict_probs(self.model, self.ids["user_heldout"], self.pad_id),
            CORPUS: predict_probs(self.model, self.ids["corpus_heldout"], self.pad_id),
        }
        base = {USER: self.base_probs["user_heldout"], CORPUS: self.base_probs["corpus_heldout"]}
        gold = {USER: self.labels["user_heldout"], CORPUS: self.labels["corpus_heldout"]}
        reviews: dict[str, Sequence[LabeledText]] = {
            USER: self.data.user.test,
            CORPUS: self.data.corpus_heldout,
        }
        sets = {name: compare(gold[name], base[name], adapted[name]) for name in (USER, CORPUS)}
        reasons = gate_reasons(sets)
        changed, counts = changed_labels({name: (reviews[name], base[name], adapted[name]) for name in sets})
        seconds = time.monotonic() - self.started
        training = {
            "best_step": state.best_step, "steps": state.global_step, "epochs": self.schedule.epochs,
            "steps_per_epoch": self.schedule.steps_per_epoch, "evaluations": state.history,
            "estimate_seconds": round(self.estimate.seconds, 1), "seconds": round(seconds, 1),
            "step_plan": self.plan.describe(), "device": self.device.paddle_device,
            "corpus": self.data.corpus_note, "base": str(o.base), "options": o.to_json(),
        }  # fmt: skip
        report = AdaptReport(
            sets=sets, promotable=not reasons or o.force, reasons=reasons, forced=bool(reasons) and o.force,
            changed=changed, changed_counts=counts, sizes=self.data.sizes(), temperature=temperature,
            training=training,
        )  # fmt: skip
        int8_dir = write_adapted(
            self.out, self.model, self.tokenizer, report, reviews, gold, base, adapted,
            seq_len=self.seq_len, options=o, progress=self.say,
        )  # fmt: skip
        return AdaptResult(self.out, False, state.global_step, seconds, report, int8_dir)
