"""The adapt study's temperature question, offline: an adapted model of `benchmarks/adapt_study.py` with its
folded temperature undone, then refitted on the user dev, the corpus dev or both; ECE on both held-out sets.

    python benchmarks/adapt_temperature.py var/adapt-study recipe 0.924945   # WORK RECIPE T_SAVED (report.json)

The study's settings are assumed (seed 42, dev 0.1 / test 0.2, max_seq_len 64); the corpus dev here is the
first 1,000 of the base's dev split (adapt samples 1,000 seeded).
"""

import csv
import sys
from pathlib import Path
import numpy as np
from worker.model.manifest import verify_model_dir
from worker.model.weights import build_classifier, load_tokenizer
from worker.training.corpus import LabeledText
from worker.training.data import encode, predict_probs
from worker.training.adapt_data import split_user, base_corpus_split
from worker.training.evaluate import read_heldout
from worker.training.temperature import fit_temperature, rescaled
from worker.training.adapt_report import _figures

work = Path(sys.argv[1]); name = sys.argv[2]; T_saved = float(sys.argv[3])
out = work / name
rows = [LabeledText(r["text"], int(r["label"])) for r in csv.DictReader(open(work / "domain-user.csv", encoding="utf-8"))]
user = split_user(rows, 42, 0.1, 0.2)
corpus_split, _ = base_corpus_split(work / "base", lambda _l: None)
corpus_held = read_heldout(work / "base" / "heldout.jsonl")
model = build_classifier(verify_model_dir(out)); tok = load_tokenizer(out)
def probs(rows):
    p = predict_probs(model, encode(tok, rows, 64, "head_tail"), int(tok.pad_token_id))
    return rescaled(p, 1.0 / T_saved)  # undo the folded temperature
lab = lambda rows: np.array([r.label_id for r in rows])
cd = corpus_split.dev[:1000]
P = {"user_dev": probs(user.dev), "user_held": probs(user.test), "corpus_dev": probs(cd), "corpus_held": probs(corpus_held)}
L = {"user_dev": lab(user.dev), "user_held": lab(user.test), "corpus_dev": lab(cd), "corpus_held": lab(corpus_held)}
Ts = {"none": 1.0, "user dev": fit_temperature(P["user_dev"], L["user_dev"]), "corpus dev": fit_temperature(P["corpus_dev"], L["corpus_dev"]),
      "union": fit_temperature(np.concatenate([P["user_dev"], P["corpus_dev"]]), np.concatenate([L["user_dev"], L["corpus_dev"]]))}
for k, T in Ts.items():
    f = {s: _figures(L[s], rescaled(P[s], T)) for s in ("user_held", "corpus_held")}
    print(f"T from {k:<10} {T:.3f}: user held ECE {f['user_held']['ece']:.4f} acc {f['user_held']['accuracy']:.4f}; corpus held ECE {f['corpus_held']['ece']:.4f}")
