"""`sentiment-worker models status|shadow|promote` on the real broker, run as `main(argv)` with the group's
control and status topics (`<group>.control`, `<group>.status`, compacted, one partition):

- status: the desired state, the live replicas (a stale one left out) and their agreement summed; --json;
- shadow DIR / --off: the primary kept; a replica that starts then serves the shadow the command named;
- promote --live: refused on too few reviews (exit 1, nothing written), --force passes and keeps the decision;
  refused when DIR is not the shadow;
- promote (held-out gate): refused when metrics.json is worse by more than the margins;
- a directory failing verification is refused before anything is written (exit 1); no topics: exit 2.

The replicas' reports are written as `ModelControl.report` writes them (ReplicaStatus under
`replica/<worker_id>`), so the figures are exact.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer

from schemas.control import (
    REPLICA_KEY_PREFIX,
    Agreement,
    DesiredState,
    ModelChoice,
    ReplicaStatus,
    ServedRef,
    parse_desired,
)
from tests.integration.helpers import sample_reviews
from tests.integration.kafka_io import produce, read_topic, review_records
from tests.integration.test_live_models import Replica, settings_for
from tests.kafka_fixtures import DLQ_CONFIG
from tests.polling import wait_until
from worker.cli.main import main
from worker.config import WorkerSettings
from worker.model.manifest import model_content_hash, write_manifest
from worker.runtime.root import models_for

pytestmark = pytest.mark.integration

COMPACTED = {"cleanup.policy": "compact"}


@pytest.fixture
def group(
    kafka_bootstrap: str,
    create_topics: Any,
    unique_name: Callable[[str], str],
    monkeypatch: pytest.MonkeyPatch,
    tiny_model_dir: Path,
) -> str:
    """A consumer group with its control and status topics; no SENTIMENT_* of the environment counts."""
    for name in [k for k in os.environ if k.startswith("SENTIMENT_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("SENTIMENT_MODEL", str(tiny_model_dir))  # what the replicas were started with
    name = unique_name("group")
    create_topics([f"{name}.control", f"{name}.status"], partitions=1, config=COMPACTED)
    return name


class Cli:
    def __init__(self, bootstrap: str, group: str, capsys: pytest.CaptureFixture[str]) -> None:
        self.bootstrap, self.group, self.capsys = bootstrap, group, capsys

    def __call__(self, *args: str) -> tuple[int, str, str]:
        self.capsys.readouterr()
        code = main(["models", *args, "--bootstrap-servers", self.bootstrap, "--group-id", self.group])
        out, err = self.capsys.readouterr()
        return code, out, err

    def json(self, *args: str) -> tuple[int, Any]:
        code, out, err = self(*args, "--json")
        assert out, err
        return code, json.loads(out)


@pytest.fixture
def models(kafka_bootstrap: str, group: str, capsys: pytest.CaptureFixture[str]) -> Cli:
    return Cli(kafka_bootstrap, group, capsys)


def control_records(bootstrap: str, group: str, expected: int) -> list[DesiredState | None]:
    return [parse_desired(m.value()) for m in read_topic(bootstrap, f"{group}.control", expected=expected)]


def with_metrics(source: Path, target: Path, accuracy: float, macro_f1: float, ece: float) -> Path:
    """A copy of `source` whose metrics.json holds these held-out figures, vouched for by its manifest."""
    shutil.copytree(source, target)
    data = json.loads((target / "metrics.json").read_text())
    data.update(test_accuracy=accuracy, test_macro_f1=macro_f1, test_ece=ece)
    (target / "metrics.json").write_text(json.dumps(data))
    write_manifest(target)
    return target


def tampered(source: Path, target: Path) -> Path:
    """A copy of `source` with one file changed after its manifest was written."""
    shutil.copytree(source, target)
    with (target / "config.json").open("a") as config:
        config.write(" ")
    return target


def report(
    bootstrap: str,
    group: str,
    worker_id: str,
    primary: Path,
    shadow: Path | None,
    *,
    confusion: dict[str, int] | None = None,
    age_s: float = 0.0,
) -> None:
    """A replica's status record, as `ModelControl.report` writes it."""
    agreement = None
    if shadow is not None:
        confusion = confusion or {}
        agreement = Agreement(
            shadow_hash=model_content_hash(shadow),
            primary_version="p1",
            shadow_version="s1",
            reviews=sum(confusion.values()),
            agreeing=sum(c for pair, c in confusion.items() if pair.split("->")[0] == pair.split("->")[1]),
            confusion=confusion,
            primary_confidence_sum=0.9 * sum(confusion.values()),
            shadow_confidence_sum=0.8 * sum(confusion.values()),
            groups_shadowed=10,
            groups_skipped=0,
        )
    status = ReplicaStatus(
        worker_id=worker_id,
        primary=ServedRef(
            name="tiny", version="p1", content_hash=model_content_hash(primary), path=str(primary)
        ),
        shadow=ServedRef(name="tiny-int8", version="s1", content_hash=model_content_hash(shadow))
        if shadow is not None
        else None,
        agreement=agreement,
        reported_at_ms=int((time.time() - age_s) * 1000),
    )
    producer = Producer({"bootstrap.servers": bootstrap})
    producer.produce(
        f"{group}.status", status.model_dump_json().encode(), (REPLICA_KEY_PREFIX + worker_id).encode()
    )
    assert producer.flush(30) == 0


@pytest.fixture
def loaded() -> Iterator[list[Any]]:
    """Model controls a test made; stopped after it."""
    made: list[Any] = []
    yield made
    for control in made:
        control.stop()


def test_status_shows_the_desired_state_the_live_replicas_and_their_agreement_summed(
    models: Cli, kafka_bootstrap: str, group: str, tiny_model_dir: Path, tiny_int8_dir: Path
) -> None:
    assert models("shadow", str(tiny_int8_dir))[0] == 0
    a = {"negative->negative": 300, "positive->positive": 270, "negative->positive": 30}
    b = {"negative->negative": 250, "positive->positive": 230, "positive->negative": 20}
    report(kafka_bootstrap, group, "r-a", tiny_model_dir, tiny_int8_dir, confusion=a)
    report(kafka_bootstrap, group, "r-b", tiny_model_dir, tiny_int8_dir, confusion=b)
    report(kafka_bootstrap, group, "r-gone", tiny_model_dir, None, age_s=3600)
    code, shown = models.json("status", "--max-age-s", "600")
    assert code == 0
    assert shown["control_topic"] == f"{group}.control" and shown["status_topic"] == f"{group}.status"
    assert shown["desired"]["primary"] is None
    assert shown["desired"]["shadow"] == {
        "path": str(tiny_int8_dir),
        "content_hash": model_content_hash(tiny_int8_dir),
    }
    assert [r["worker_id"] for r in shown["replicas"]] == ["r-a", "r-b"]
    assert all(r["follows_desired"] for r in shown["replicas"])
    assert shown["stale_replicas"] == ["r-gone"]
    agreement = shown["agreement"]
    assert (agreement["reviews"], agreement["agreeing"], agreement["agreement"]) == (1100, 1050, 0.9545)
    assert agreement["confusion"] == {
        "negative->negative": 550, "negative->positive": 30, "positive->negative": 20,
        "positive->positive": 500,
    }  # fmt: skip
    assert agreement["primary_label_mix"] == {
        "negative": round(580 / 1100, 4),
        "positive": round(520 / 1100, 4),
    }
    assert agreement["shadow_label_mix"] == {
        "negative": round(570 / 1100, 4),
        "positive": round(530 / 1100, 4),
    }
    assert agreement["label_mix_shift"] == round(abs(570 / 1100 - 580 / 1100), 4)
    assert (agreement["primary_mean_confidence"], agreement["shadow_mean_confidence"]) == (0.9, 0.8)
    code, text, _ = models("status", "--max-age-s", "600")
    assert code == 0
    assert "2 live replicas (1 stale left out" in text and "1100 reviews, 95.5% agree" in text


def test_shadow_keeps_the_primary_a_new_replica_serves_it_and_off_removes_it(
    models: Cli,
    kafka_bootstrap: str,
    group: str,
    tiny_model_dir: Path,
    tiny_int8_dir: Path,
    loaded: list[Any],
    tmp_path: Path,
) -> None:
    primary = with_metrics(tiny_model_dir, tmp_path / "primary", 0.8, 0.8, 0.05)
    code, _, err = models("promote", str(primary))  # no desired state yet: the held-out gate passes
    assert code == 0, err
    code, shown = models.json("shadow", str(tiny_int8_dir))
    assert code == 0
    assert shown["desired"]["primary"]["content_hash"] == model_content_hash(primary)
    assert shown["desired"]["shadow"]["content_hash"] == model_content_hash(tiny_int8_dir)
    settings = WorkerSettings(bootstrap_servers=kafka_bootstrap, group_id=group, model=str(tiny_model_dir),
                              device="cpu", cpu_threads=1)  # fmt: skip
    labeller, control = models_for(settings.sections, "run")
    assert control is not None and control.problem is None
    loaded.append(control)
    primary_served, shadow_served = labeller.serving
    assert primary_served.content_hash == model_content_hash(primary)
    assert shadow_served is not None and shadow_served.content_hash == model_content_hash(tiny_int8_dir)
    code, shown = models.json("shadow", "--off")
    assert code == 0 and shown["desired"]["shadow"] is None
    assert shown["desired"]["primary"]["content_hash"] == model_content_hash(primary)
    newest = control_records(kafka_bootstrap, group, expected=3)[-1]
    assert newest is not None and newest.shadow is None and newest.primary is not None
    assert newest.primary.path == str(primary)
    assert models("shadow")[0] == 2 and models("shadow", str(tiny_int8_dir), "--off")[0] == 2  # one of them


def test_a_directory_failing_verification_is_refused_before_anything_is_written(
    models: Cli, kafka_bootstrap: str, group: str, tiny_int8_dir: Path, tmp_path: Path
) -> None:
    broken = tampered(tiny_int8_dir, tmp_path / "broken")
    for command in ("shadow", "promote"):
        code, out, err = models(command, str(broken))
        assert code == 1, (out, err)
        assert "refused, nothing was written" in err and "config.json does not match" in err
    code, out, _ = models("promote", str(tmp_path / "missing"), "--live", "--force")
    assert code == 1
    assert read_topic(kafka_bootstrap, f"{group}.control", expected=0, settle_s=1.0) == []


def test_promote_live_is_refused_on_too_few_reviews_and_forced_passes_keeping_the_decision(
    models: Cli, kafka_bootstrap: str, group: str, tiny_model_dir: Path, tiny_int8_dir: Path, tmp_path: Path
) -> None:
    other = with_metrics(tiny_model_dir, tmp_path / "other", 0.8, 0.8, 0.05)
    code, out, _ = models("promote", str(tiny_int8_dir), "--live")
    assert code == 1 and "is not the current shadow (there is no shadow)" in out
    assert models("shadow", str(tiny_int8_dir))[0] == 0
    code, out, _ = models("promote", str(other), "--live")
    assert code == 1 and f"the shadow is {tiny_int8_dir}" in out
    for worker_id in ("r-a", "r-b"):
        confusion = {"negative->negative": 100, "positive->positive": 95, "positive->negative": 5}
        report(kafka_bootstrap, group, worker_id, tiny_model_dir, tiny_int8_dir, confusion=confusion)
    code, shown = models.json("promote", str(tiny_int8_dir), "--live")
    assert code == 1
    decision = shown["decision"]
    assert decision["promoted"] is False and shown["desired"] is None
    assert any("shadowed on 400 live reviews, fewer than 1000" in r for r in decision["reasons"])
    assert (decision["figures"]["reviews"], decision["figures"]["agreement"]) == (400, 0.975)
    assert len(control_records(kafka_bootstrap, group, expected=1)) == 1  # only the shadow's record
    code, shown = models.json("promote", str(tiny_int8_dir), "--live", "--force")
    assert code == 0
    decision = shown["decision"]
    assert (decision["promoted"], decision["forced"]) == (True, True)
    assert decision["figures"]["replicas_reporting"] == 2
    newest = control_records(kafka_bootstrap, group, expected=2)[-1]
    assert newest is not None and newest.decision is not None
    assert newest.primary == ModelChoice(
        path=str(tiny_int8_dir), content_hash=model_content_hash(tiny_int8_dir)
    )
    assert newest.shadow is None  # the shadow became the primary
    assert newest.decision.model_dump(mode="json") == decision


def test_promote_live_refuses_a_shadow_that_disagrees_too_often(
    models: Cli, kafka_bootstrap: str, group: str, tiny_model_dir: Path, tiny_int8_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    monkeypatch.setenv("SENTIMENT_PROMOTE_MIN_SHADOWED", "100")
    assert models("shadow", str(tiny_int8_dir))[0] == 0
    report(kafka_bootstrap, group, "r-a", tiny_model_dir, tiny_int8_dir,
           confusion={"negative->negative": 80, "positive->negative": 40})  # fmt: skip
    code, out, _ = models("promote", str(tiny_int8_dir), "--live")
    assert code == 1
    assert "agrees with the primary on 66.7% of 120 reviews, less than 90.0%" in out
    assert "label_mix_shift: 0.3333" in out


def test_promote_applies_the_heldout_gate_of_metrics_json(
    models: Cli, kafka_bootstrap: str, group: str, tiny_model_dir: Path, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    incumbent = with_metrics(tiny_model_dir, tmp_path / "incumbent", 0.85, 0.85, 0.03)
    monkeypatch.setenv("SENTIMENT_MODEL", str(incumbent))
    worse = with_metrics(tiny_model_dir, tmp_path / "worse", 0.84, 0.85, 0.03)
    code, out, _ = models("promote", str(worse))
    assert code == 1 and "held-out accuracy 0.8400 < 0.8500 - 0.005" in out
    better = with_metrics(tiny_model_dir, tmp_path / "better", 0.86, 0.86, 0.03)
    code, shown = models.json("promote", str(better))
    assert code == 0 and shown["decision"]["forced"] is False
    assert shown["decision"]["figures"]["heldout_accuracy_incumbent"] == 0.85
    code, out, _ = models("promote", str(worse))  # now the incumbent is `better`, the control topic's primary
    assert code == 1 and "held-out accuracy 0.8400 < 0.8600 - 0.005" in out


def test_without_the_control_topic_the_commands_exit_2_saying_what_to_do(
    kafka_bootstrap: str, unique_name: Callable[[str], str], capsys: pytest.CaptureFixture[str],
    group: str,
) -> None:  # fmt: skip
    code, _, err = Cli(kafka_bootstrap, unique_name("nogroup"), capsys)("status")
    assert code == 2 and "`sentiment-worker topics create` makes" in err


def test_status_of_two_running_replicas_shows_both_and_the_agreement_on_every_review(
    models: Cli,
    kafka_bootstrap: str,
    group: str,
    create_topics: Any,
    unique_name: Callable[[str], str],
    tiny_model_dir: Path,
    tiny_int8_dir: Path,
) -> None:
    names = {"group": group, "control": f"{group}.control", "status": f"{group}.status"}
    names |= {k: unique_name(k) for k in ("reviews", "results", "dlq")}
    create_topics([names["reviews"], names["results"]], partitions=2)
    create_topics(names["dlq"], partitions=1, config=DLQ_CONFIG)
    assert models("shadow", str(tiny_int8_dir))[0] == 0
    replicas = [
        Replica(settings_for(kafka_bootstrap, names, tiny_model_dir, worker_id=f"replica-{i}",
                             shadow_max_groups=1000))
        for i in range(2)
    ]  # fmt: skip
    try:
        produce(kafka_bootstrap, names["reviews"], review_records(sample_reviews(120)))
        assert len(read_topic(kafka_bootstrap, names["results"], expected=120)) == 120

        def reported() -> Any:
            code, shown = models.json("status")
            agreement = shown["agreement"] or {}
            return shown if code == 0 and agreement.get("reviews") == 120 else None

        shown = wait_until(reported, 60, "the two replicas to report the shadow's figures on 120 reviews")
        agreeing = [r.labeller.agreement for r in replicas]
    finally:
        for replica in replicas:
            replica.stop()
    assert [r["worker_id"] for r in shown["replicas"]] == ["replica-0", "replica-1"]
    assert all(r["follows_desired"] and r["problem"] is None for r in shown["replicas"])
    assert {r["primary"]["content_hash"] for r in shown["replicas"]} == {model_content_hash(tiny_model_dir)}
    assert shown["agreement"]["agreeing"] == sum(a.agreeing for a in agreeing if a is not None)
    assert sum(shown["agreement"]["confusion"].values()) == 120
