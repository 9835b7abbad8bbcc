"""The pure parts of `models status|promote` (worker/tools/models.py): the shadow's figures summed over the
replicas that shadow the same model, the shares and shift shown, whether a replica follows the desired
state, and the held-out gate on metrics.json."""

from __future__ import annotations

import json
from pathlib import Path

from schemas.control import Agreement, DesiredState, ModelChoice, ReplicaStatus, ServedRef
from worker.tools.models import agreement_figures, fleet_agreement, follows, heldout_gate

A, B = "a" * 64, "b" * 64


def replica(worker_id: str, primary: str, shadow: str | None, confusion: dict[str, int]) -> ReplicaStatus:
    agreement = Agreement(
        shadow_hash=shadow,
        reviews=sum(confusion.values()),
        agreeing=sum(n for pair, n in confusion.items() if len(set(pair.split("->"))) == 1),
        confusion=confusion,
        primary_confidence_sum=0.9 * sum(confusion.values()),
        shadow_confidence_sum=0.7 * sum(confusion.values()),
        groups_shadowed=3,
        groups_skipped=1,
    )
    return ReplicaStatus(
        worker_id=worker_id,
        primary=ServedRef(name="m", version="1", content_hash=primary),
        shadow=ServedRef(name="s", version="2", content_hash=shadow) if shadow else None,
        agreement=agreement if shadow else None,
        reported_at_ms=1,
    )


def test_the_figures_are_summed_over_the_replicas_shadowing_that_model_only() -> None:
    replicas = [
        replica("r1", A, B, {"neg->neg": 40, "pos->pos": 50, "pos->neg": 10}),
        replica("r2", A, B, {"neg->neg": 30, "neg->pos": 20}),
        replica("r3", A, A, {"neg->neg": 1000}),  # another shadow: not counted
        replica("r4", A, None, {}),
    ]
    summed = fleet_agreement(replicas, B)
    assert summed is not None
    assert (summed.reviews, summed.agreeing) == (150, 120)
    assert summed.confusion == {"neg->neg": 70, "pos->pos": 50, "pos->neg": 10, "neg->pos": 20}
    assert (summed.groups_shadowed, summed.groups_skipped) == (6, 2)
    figures = agreement_figures(summed)
    assert figures["agreement"] == 0.8
    assert figures["primary_label_mix"] == {"neg": 0.6, "pos": 0.4}  # 90, 60 of 150
    assert figures["shadow_label_mix"] == {"neg": 0.5333, "pos": 0.4667}  # 80, 70
    assert figures["label_mix_shift"] == 0.0667
    assert (figures["primary_mean_confidence"], figures["shadow_mean_confidence"]) == (0.9, 0.7)
    assert figures["groups_shadowed_share"] == 0.75
    assert fleet_agreement(replicas, "c" * 64) is None


def test_a_replica_follows_the_desired_state_when_it_serves_both_hashes_without_a_problem() -> None:
    desired = DesiredState(
        primary=ModelChoice(path="/m/a", content_hash=A),
        shadow=ModelChoice(path="/m/b", content_hash=B),
        changed_at_ms=1,
    )
    assert follows(replica("r", A, B, {}), desired)
    assert not follows(replica("r", A, None, {}), desired)
    assert not follows(replica("r", B, B, {}), desired)
    assert not follows(replica("r", A, B, {}).model_copy(update={"problem": "refused"}), desired)
    assert follows(replica("r", B, None, {}), DesiredState(changed_at_ms=1))  # as started, no shadow


def metrics(directory: Path, accuracy: float, macro_f1: float, ece: float) -> Path:
    directory.mkdir()
    figures = {"test_accuracy": accuracy, "test_macro_f1": macro_f1, "test_ece": ece}
    (directory / "metrics.json").write_text(json.dumps(figures))
    return directory


def test_the_heldout_gate_refuses_a_loss_beyond_promotes_margins_and_notes_missing_figures(
    tmp_path: Path,
) -> None:
    incumbent = metrics(tmp_path / "old", 0.85, 0.85, 0.02)
    within = metrics(tmp_path / "within", 0.846, 0.846, 0.039)
    refusals, notes, figures = heldout_gate(within, incumbent)
    assert refusals == [] and "passes" in notes[0]
    assert figures["heldout_accuracy_candidate"] == 0.846 and figures["heldout_ece_incumbent"] == 0.02
    worse = metrics(tmp_path / "worse", 0.84, 0.86, 0.05)
    refusals, _, _ = heldout_gate(worse, incumbent)
    assert refusals == ["held-out accuracy 0.8400 < 0.8500 - 0.005", "held-out ECE 0.0500 > 0.0200 + 0.02"]
    refusals, notes, _ = heldout_gate(worse, tmp_path / "no-figures")
    missing = tmp_path / "no-figures" / "metrics.json"
    assert refusals == [] and notes == [f"held-out gate not applied: no test figures in {missing}"]
