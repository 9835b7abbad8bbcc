"""Train or fine-tune the ERNIE sentiment classifier: from scratch (char vocab) or from pretrained weights.

One optimizer step sees ``batch_size * accum_steps`` examples (``accum_steps`` micro-batches of
``batch_size``); AdamW with linear warmup/decay, global-norm gradient clipping, early stopping on dev
accuracy, checkpoints for ``resume``, AMP on GPU, and ``paddle.DataParallel`` under
``python -m paddle.distributed.launch``.
"""

from __future__ import annotations

import random
import shutil
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import numpy as np

from worker.model.classifier import DEFAULT_LABELS
from worker.model.device import DeviceUnavailableError, activate, choose_device
from worker.model.manifest import UnverifiedModelError, verify_model_dir, write_manifest
from worker.model.weights import build_classifier, load_tokenizer
from worker.training.averaging import average_best_snapshots, keep_snapshot
from worker.training.base_model import BASE_MODEL_NAME, BaseModelError, ensure_base_model
from worker.training.checkpoints import LoopState, load_checkpoint, save_checkpoint, unwrap
from worker.training.corpus import (
    Split,
    split,
)
from worker.training.data import (
    encode,
    epoch_batches,
    forward,
    load_examples,
    micro_batches,
    pad_batch,
    per_class,
    predict_probs,
    rdrop_loss,
    smoothed_cross_entropy,
)
from worker.training.distill import (
    build_student,
    distillation_loss,
    keep_encoder_layers,
)
from worker.training.evaluate import (
    ClassificationMetrics,
    classification_metrics,
)
from worker.training.layer_distill import forward_with_layers, layer_loss
from worker.training.mlm import mlm_pretrain
from worker.training.model_card import (
    summary_table,
    write_interim,
    write_outputs,
)
from worker.training.options import (
    CHECKPOINT_DIR,
    SCRATCH,
    SOFT_TARGETS_FILE,
    EpochRecord,
    TrainingError,
    TrainOptions,
    TrainReport,
)
from worker.training.targets import cleaned_train_indices, layer_targets, soft_targets
from worker.training.vocab import build_char_vocab, write_vocab


def _build_scratch(
    options: TrainOptions, parts: Split, out: Path, progress: Callable[[str], None]
) -> tuple[Any, Any]:
    from paddlenlp.transformers import ErnieConfig, ErnieForSequenceClassification, ErnieTokenizer

    vocab = build_char_vocab((ex.text for ex in parts.train), options.min_char_freq)
    write_vocab(vocab, out / "vocab.txt")
    tokenizer = ErnieTokenizer(str(out / "vocab.txt"))
    progress(f"vocab: {len(vocab)} tokens (min_char_freq={options.min_char_freq}, from train split only)")
    config = ErnieConfig(
        vocab_size=len(vocab),
        hidden_size=options.hidden_size,
        num_hidden_layers=options.num_layers,
        num_attention_heads=options.num_heads,
        intermediate_size=options.intermediate_size,
        hidden_dropout_prob=options.dropout,
        attention_probs_dropout_prob=options.dropout,
        max_position_embeddings=options.max_seq_len,
        type_vocab_size=2,
        pad_token_id=int(tokenizer.pad_token_id),
        num_labels=len(DEFAULT_LABELS),
    )
    return ErnieForSequenceClassification(config), tokenizer


def _load_init(source: str, progress: Callable[[str], None]) -> tuple[Any, Any]:
    """(model, tokenizer) to fine-tune: a local directory verified against its manifest and read as data
    (model.safetensors), or a PaddleNLP model name, which PaddleNLP downloads and unpickles: the operator
    named it on the command line (docs/model-trust.md)."""
    from paddlenlp.transformers import ErnieForSequenceClassification, ErnieTokenizer

    if Path(source).is_dir():
        try:
            verified = verify_model_dir(Path(source))
            return build_classifier(verified, init=True, num_labels=len(DEFAULT_LABELS)), load_tokenizer(
                Path(source)
            )
        except UnverifiedModelError as exc:
            raise TrainingError(f"--init: {exc}") from None
    progress(f"init: {source} from PaddleNLP's model hub (downloaded and unpickled by PaddleNLP)")
    tokenizer = ErnieTokenizer.from_pretrained(source)
    return ErnieForSequenceClassification.from_pretrained(source, num_classes=len(DEFAULT_LABELS)), tokenizer


def _build_pretrained(options: TrainOptions, progress: Callable[[str], None]) -> tuple[Any, Any]:
    source = options.init
    if source == BASE_MODEL_NAME:  # the short name (a local directory so named: ./bge-small-zh)
        try:
            source = str(ensure_base_model(say=progress))
        except BaseModelError as exc:
            raise TrainingError(str(exc)) from None
    try:
        model, tokenizer = _load_init(source, progress)
    except TrainingError:
        raise
    except Exception as exc:  # noqa: BLE001 - PaddleNLP raises many types for missing/unreachable models
        raise TrainingError(
            f"cannot load {options.init!r} to fine-tune (not a model directory, and the model hub is "
            f"unreachable or does not know the name?): {type(exc).__name__}: {exc}"
        ) from None
    positions = int(getattr(model.config, "max_position_embeddings", options.max_seq_len))
    if options.max_seq_len > positions:
        raise TrainingError(
            f"max_seq_len {options.max_seq_len} exceeds {options.init}'s {positions} positions"
        )
    layers = options.kept_layers()
    if layers is not None:
        try:
            keep_encoder_layers(model, layers)
        except ValueError as exc:
            raise TrainingError(f"--keep-layers: {exc}") from None
    kept = "" if layers is None else f", encoder layers {options.keep_layers} kept"
    progress(
        f"init: {options.init} ({sum(int(np.prod(p.shape)) for p in model.parameters()):,} parameters{kept})"
    )
    return model, tokenizer


@contextmanager
def _no_sync(model: Any, skip: bool) -> Iterator[None]:
    """DataParallel: don't all-reduce gradients on micro-batches that are not the step's last."""
    if skip and hasattr(model, "no_sync"):
        with model.no_sync():
            yield
    else:
        yield


def train(options: TrainOptions, progress: Callable[[str], None] = print) -> TrainReport:
    """Train and save a model directory loadable by ``load_classifier``.

    From scratch the character vocabulary comes from the train split only. The best epoch on dev is kept
    and evaluated once on the untouched test split; ``metrics.json``, ``heldout.jsonl`` (the test split)
    and a model card ``README.md`` are written next to the weights. Raises TrainingError.
    """
    import paddle

    # Fresh parameter and optimizer-state names (embedding_0.w_0_moment1_0 ...) in every run, so a
    # checkpoint's optimizer state matches on resume even within one process.
    with paddle.utils.unique_name.guard():
        return _train(options, progress)


def _train(options: TrainOptions, progress: Callable[[str], None]) -> TrainReport:
    import paddle
    import paddle.distributed as dist
    from paddlenlp.transformers.optimization import LinearDecayWithWarmup

    options.validate()
    started = time.monotonic()
    try:
        device = choose_device(options.device)  # type: ignore[arg-type]
    except DeviceUnavailableError as exc:
        raise TrainingError(f"device: {exc}") from None
    activate(device)
    world = dist.get_world_size()
    rank = dist.get_rank() if world > 1 else 0
    if world > 1:
        dist.init_parallel_env()
    say: Callable[[str], None] = progress if rank == 0 else (lambda _line: None)
    amp_used = options.amp and device.kind == "gpu"
    if options.amp and not amp_used:
        say(
            "WARNING: --amp ignored: mixed precision (paddle.amp) needs a GPU and this run is on "
            f"{device.paddle_device}; training in FP32"
        )
    random.seed(options.seed)
    np.random.seed(options.seed)
    paddle.seed(options.seed)

    examples, source = load_examples(options, say)
    parts = split(examples, options.data_split_seed, options.dev_fraction, options.test_fraction)
    if not parts.train or not parts.dev:
        raise TrainingError(f"too few examples ({len(examples)}) for a train/dev/test split")
    sizes = f"train={len(parts.train)} dev={len(parts.dev)} test={len(parts.test)}"
    say(f"split: {sizes} seed={options.data_split_seed}")

    out = Path(options.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    if options.teacher is not None and options.init == SCRATCH:
        model, tokenizer = build_student(
            options.teacher_dirs()[0], num_layers=options.num_layers, hidden_size=options.hidden_size,
            num_heads=options.num_heads, intermediate_size=options.intermediate_size, dropout=options.dropout,
            max_seq_len=options.max_seq_len, num_labels=len(DEFAULT_LABELS), progress=say,
        )  # fmt: skip
    elif options.init == SCRATCH:
        model, tokenizer = _build_scratch(options, parts, out, say)
    else:
        model, tokenizer = _build_pretrained(options, say)
    pad_id = int(tokenizer.pad_token_id)
    vocab_size = int(len(tokenizer.vocab))

    train_ids = encode(tokenizer, parts.train, options.max_seq_len, options.truncation)
    dev_ids = encode(tokenizer, parts.dev, options.max_seq_len, options.truncation)
    test_ids = encode(tokenizer, parts.test, options.max_seq_len, options.truncation)
    train_labels = np.array([ex.label_id for ex in parts.train], dtype=np.int64)
    dev_labels = np.array([ex.label_id for ex in parts.dev], dtype=np.int64)
    test_labels = np.array([ex.label_id for ex in parts.test], dtype=np.int64)
    if options.clean_below:
        keep = cleaned_train_indices(model, pad_id, parts, train_ids, train_labels, options, out, rank, say)
        parts = replace(parts, train=[parts.train[i] for i in keep])
        train_ids, train_labels = [train_ids[i] for i in keep], train_labels[keep]
    soft: np.ndarray | None = None
    if options.teacher is not None:
        train_ids, train_labels, soft = soft_targets(
            options, tokenizer, parts, train_ids, train_labels, out / SOFT_TARGETS_FILE, rank == 0, say
        )
    targets = layer_targets(options, model, tokenizer, train_ids, say) if options.layer_weight else None
    student_layers = int(unwrap(model).config.num_hidden_layers)
    lengths = [len(s) for s in train_ids]
    if options.mlm_epochs and not options.resume:  # on resume the checkpoint holds the pre-trained weights
        mlm_pretrain(model, tokenizer, train_ids, options, say)

    steps_per_epoch = len(epoch_batches(lengths, options, 1, rank, world))
    total_steps = steps_per_epoch * options.epochs
    schedule = LinearDecayWithWarmup(options.learning_rate, total_steps, options.warmup_fraction)
    no_decay = {p.name for n, p in model.named_parameters() if "bias" in n or "norm" in n}
    optimizer = paddle.optimizer.AdamW(
        learning_rate=schedule,
        parameters=model.parameters(),
        weight_decay=options.weight_decay,
        apply_decay_param_fun=lambda name: name not in no_decay,
        grad_clip=paddle.nn.ClipGradByGlobalNorm(options.max_grad_norm)
        if options.max_grad_norm > 0
        else None,
    )
    scaler = paddle.amp.GradScaler(init_loss_scaling=2.0**15) if amp_used else None
    if world > 1:
        model = paddle.DataParallel(model)
        say(f"data parallel: {world} ranks, {steps_per_epoch} steps per epoch each")

    ckpt = out / CHECKPOINT_DIR
    fingerprint = options.fingerprint()
    state = LoopState()
    if options.resume or options.finish:
        accepted = {fingerprint, options.legacy_fingerprint()}  # checkpoints written before 2026-12-03 too
        state = load_checkpoint(ckpt, model, optimizer, scaler, accepted)
        say(
            f"resumed from {ckpt}: epoch {state.epoch} step {state.step_in_epoch}, "
            f"global step {state.global_step}"
        )
    elif ckpt.exists() and rank == 0:  # a new run: an old checkpoint is not ours
        shutil.rmtree(ckpt)
    if options.finish:
        if not (ckpt / "best.pdparams").is_file():
            raise TrainingError(f"--finish: {ckpt} holds no best model yet (no dev evaluation ran)")
        say(
            f"finishing at step {state.global_step} of {total_steps}: the best model so far (step "
            f"{state.best_step}, dev accuracy {state.best_dev:.4f}) becomes the model directory"
        )
        state.epoch = options.epochs + 1  # no more training steps

    def checkpoint() -> None:
        if rank == 0:
            save_checkpoint(ckpt, model, optimizer, scaler, state, fingerprint)

    effective = options.batch_size * options.accum_steps * world
    say(
        f"training: {options.epochs} epochs x {steps_per_epoch} steps, {effective} examples per step "
        f"(batch {options.batch_size} x accum {options.accum_steps} x {world} ranks), "
        f"lr {options.learning_rate} warmup {options.warmup_fraction}, device {device.paddle_device}"
        + (", AMP" if amp_used else "")
    )
    log_every = max(1, min(steps_per_epoch // 5, 25))

    def keep_if_best(dev: ClassificationMetrics, epoch: int) -> None:
        """A better dev accuracy: remember it, save best.pdparams, and with eval_every the model dir."""
        if rank == 0:
            keep_snapshot(ckpt, state, unwrap(model).state_dict(), dev.accuracy, options.average_best)
        if dev.accuracy <= state.best_dev:
            return
        state.best_dev, state.best_epoch, state.best_step = dev.accuracy, epoch, state.global_step
        if rank == 0:
            ckpt.mkdir(parents=True, exist_ok=True)
            paddle.save(unwrap(model).state_dict(), str(ckpt / "best.pdparams"))
            if options.eval_every:
                write_interim(options, unwrap(model), tokenizer, parts, dev.accuracy, state.global_step)
                say(f"step {state.global_step}: new best dev accuracy {dev.accuracy:.4f}, written to {out}")

    interrupted = False
    while state.epoch <= options.epochs and not interrupted:
        epoch = state.epoch
        model.train()
        batches = epoch_batches(lengths, options, epoch, rank, world)
        tick = time.monotonic()
        for step, step_batch in enumerate(batches, start=1):
            if step <= state.step_in_epoch:
                continue  # done before the interruption
            # dropout masks depend only on (seed, step): a resumed run draws the same ones
            paddle.seed(options.seed * 7919 + state.global_step * 31 + rank)
            micros = micro_batches(step_batch, options.batch_size)
            step_loss = step_layers = 0.0
            for m, idx in enumerate(micros):
                ids, mask = pad_batch([train_ids[i] for i in idx], pad_id)
                if options.rdrop:  # the same examples twice, in one forward pass: two dropout masks
                    ids, mask = np.concatenate([ids, ids]), np.concatenate([mask, mask])
                with _no_sync(model, m < len(micros) - 1):
                    amp_ctx = paddle.amp.auto_cast(level="O1") if amp_used else nullcontext()
                    with amp_ctx:
                        if targets is not None:
                            logits, cls_states = forward_with_layers(model, ids, mask, student_layers)
                        else:
                            logits = forward(model, ids, mask)
                    if soft is not None:
                        loss = distillation_loss(
                            logits, train_labels[idx], soft[idx], options.temperature, options.soft_weight
                        )
                        if targets is not None:
                            layers_term = layer_loss(cls_states, targets[idx])
                            step_layers += float(layers_term) * len(idx) / len(step_batch)
                            loss = loss + options.layer_weight * layers_term
                    elif options.rdrop:
                        loss = rdrop_loss(
                            logits,
                            paddle.to_tensor(train_labels[idx]),
                            options.label_smoothing,
                            options.rdrop,
                        )
                    else:
                        loss = smoothed_cross_entropy(
                            logits, paddle.to_tensor(train_labels[idx]), options.label_smoothing
                        )
                    loss = loss * (len(idx) / len(step_batch))
                    (scaler.scale(loss) if scaler is not None else loss).backward()
                step_loss += float(loss)
            if scaler is not None:
                scaler.step(optimizer)
                scaler.update()
            else:
                optimizer.step()
            schedule.step()
            optimizer.clear_grad()
            state.global_step += 1
            state.step_in_epoch = step
            state.seen += len(step_batch) * world
            state.epoch_loss_sum += step_loss
            state.epoch_loss_steps += 1
            now = time.monotonic()
            state.epoch_seconds += now - tick
            state.train_seconds += now - tick
            tick = now
            if step % log_every == 0 or step == len(batches):
                rate = state.seen / state.train_seconds if state.train_seconds > 0 else 0.0
                left = (total_steps - state.global_step) * effective / rate if rate > 0 else 0.0
                say(
                    f"epoch {epoch}/{options.epochs} step {step}/{len(batches)} loss {step_loss:.4f} "
                    + (f"(layer term {step_layers:.4f}) " if targets is not None else "")
                    + f"{rate:.0f} seq/s ETA {left:.0f}s"
                )
            if options.stop_after_steps is not None and state.global_step >= options.stop_after_steps:
                interrupted = True
                break
            if options.eval_every and state.global_step % options.eval_every == 0 and step < len(batches):
                dev = classification_metrics(
                    dev_labels, predict_probs(model, dev_ids, pad_id), DEFAULT_LABELS
                )
                say(f"step {state.global_step}: dev accuracy {dev.accuracy:.4f} macro-F1 {dev.macro_f1:.4f}")
                keep_if_best(dev, epoch)
                model.train()
                tick = time.monotonic()  # evaluation time is not training time
            if options.checkpoint_every and state.global_step % options.checkpoint_every == 0:
                checkpoint()
        if interrupted and state.step_in_epoch < len(batches):
            checkpoint()
            say(f"stopped after step {state.global_step} (--stop-after-steps); checkpoint in {ckpt}")
            break
        probs = predict_probs(model, dev_ids, pad_id)
        dev = classification_metrics(dev_labels, probs, DEFAULT_LABELS)
        record = EpochRecord(
            epoch=epoch,
            train_loss=state.epoch_loss_sum / max(1, state.epoch_loss_steps),
            dev_accuracy=dev.accuracy,
            dev_macro_f1=dev.macro_f1,
            seconds=state.epoch_seconds,
            sequences_per_second=state.epoch_loss_steps * effective / state.epoch_seconds
            if state.epoch_seconds
            else 0.0,
        )
        state.history.append(asdict(record))
        say(f"epoch {epoch}: dev accuracy {dev.accuracy:.4f} macro-F1 {dev.macro_f1:.4f}")
        keep_if_best(dev, epoch)
        state.bad_epochs = 0 if state.best_epoch == epoch else state.bad_epochs + 1
        state.epoch += 1
        state.step_in_epoch = 0
        state.epoch_loss_sum, state.epoch_loss_steps, state.epoch_seconds = 0.0, 0, 0.0
        stop_early = options.patience is not None and state.bad_epochs >= options.patience
        if stop_early:
            say(
                f"early stop: no better dev accuracy for {options.patience} epochs "
                f"(best epoch {state.best_epoch})"
            )
            state.epoch = options.epochs + 1
        checkpoint()
        if interrupted:
            say(f"stopped after step {state.global_step} (--stop-after-steps); checkpoint in {ckpt}")
    history = [EpochRecord(**h) for h in state.history]  # type: ignore[arg-type]
    if interrupted:
        return TrainReport(
            output_dir=out, dev_accuracy=0.0, test_accuracy=0.0, best_epoch=state.best_epoch,
            train_size=len(parts.train), dev_size=len(parts.dev), test_size=len(parts.test),
            vocab_size=vocab_size, seconds=time.monotonic() - started, history=history,
            steps=state.global_step, interrupted=True, amp_used=amp_used,
        )  # fmt: skip

    if rank != 0:  # only rank 0 holds best.pdparams, evaluates on test and writes the model directory
        return TrainReport(
            output_dir=out, dev_accuracy=state.best_dev, test_accuracy=0.0, best_epoch=state.best_epoch,
            train_size=len(parts.train), dev_size=len(parts.dev), test_size=len(parts.test),
            vocab_size=vocab_size, seconds=time.monotonic() - started, history=history,
            steps=state.global_step, amp_used=amp_used,
        )  # fmt: skip
    net = unwrap(model)
    averaged_steps = average_best_snapshots(
        ckpt,
        state,
        net,
        lambda m: (
            classification_metrics(dev_labels, predict_probs(m, dev_ids, pad_id), DEFAULT_LABELS).accuracy
        ),
        say,
    )
    net.set_state_dict(paddle.load(str(ckpt / "best.pdparams")))
    test_probs = predict_probs(net, test_ids, pad_id) if test_ids else None
    test = classification_metrics(test_labels, test_probs, DEFAULT_LABELS) if test_probs is not None else None
    test_acc = test.accuracy if test is not None else 0.0
    say(
        f"best epoch {state.best_epoch} (step {state.best_step}): dev accuracy {state.best_dev:.4f}, "
        f"held-out test accuracy {test_acc:.4f}"
        + (f" macro-F1 {test.macro_f1:.4f} ECE {test.ece:.4f}" if test is not None else "")
    )
    say(summary_table(history, state.best_epoch))
    seconds = time.monotonic() - started
    report = TrainReport(
        output_dir=out,
        dev_accuracy=state.best_dev,
        test_accuracy=test_acc,
        best_epoch=state.best_epoch,
        train_size=len(parts.train),
        dev_size=len(parts.dev),
        test_size=len(parts.test),
        vocab_size=vocab_size,
        seconds=seconds,
        test_per_class=per_class(test_labels, test_probs.argmax(axis=1), DEFAULT_LABELS)
        if test_probs is not None
        else {},
        test_macro_f1=test.macro_f1 if test is not None else 0.0,
        test_ece=test.ece if test is not None else 0.0,
        history=history,
        steps=state.global_step,
        amp_used=amp_used,
        averaged_steps=averaged_steps,
    )
    if rank == 0:
        write_outputs(options, report, net, tokenizer, parts, source, test, device.kind, world, train_labels)
        if not options.keep_checkpoint:
            shutil.rmtree(ckpt, ignore_errors=True)
            (out / SOFT_TARGETS_FILE).unlink(missing_ok=True)
        content = write_manifest(out)
        say(f"saved model to {out} in {seconds:.0f}s (content sha256 {content})")
    return report
