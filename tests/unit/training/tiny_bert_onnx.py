"""A tiny BERT-like ONNX graph laid out as the Hugging Face export of bge-small-zh-v1.5 is (opset 11):
named embedding/LayerNorm/bias initializers, anonymous ``onnx::MatMul_*`` weights whose MatMul output an Add
with the named bias consumes, LayerNorm decomposed with its epsilon as a Constant, heads split by a Reshape
whose shape is ``Concat(batch, seq, [heads], [head_dim])``, exact (erf) GELU. And a tokenizer JSON for it."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

# [PAD] [UNK] [CLS] [SEP] [MASK] at BERT's ids would need 100 unused slots; ids here are compact.
TINY_VOCAB = [
    "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "<S>", "\u2028", "##\u2028",
    "好", "差", "评", "很", "不", "错", "物", "流", "快", "价", "格", "元", "店", "的", "汤", "底",
    "hello", "world", "##s", "play", "##ing", "1", "2", "##3", "##4", "##5", "！", "，", "。", "？",
    "ａ", "ｂ", "ｃ", "１", "２", "😀", "👍", "❤", "￥", "%",
]  # fmt: skip


@dataclass
class TinyBert:
    """Shape and deliberate faults of the graph ``build`` makes."""

    layers: int = 2
    hidden: int = 16
    heads: int = 2
    ffn: int = 32
    vocab: int = len(TINY_VOCAB)
    positions: int = 64
    type_vocab: int = 2
    eps: float = 1e-12
    seed: int = 0
    # faults: a named weight stored as a Constant node instead; a bias made anonymous; a wrong score scale
    as_constant: set[str] = field(default_factory=set)
    anonymous_bias: str | None = None
    score_scale: float | None = None


def build(spec: TinyBert) -> Any:
    """The onnx.ModelProto of ``spec`` (checked by onnx.checker)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(spec.seed)
    nodes: list[Any] = []
    inits: list[Any] = []
    counter = iter(range(500, 10_000))

    def node(op: str, inputs: list[str], **attrs: Any) -> str:
        out = f"/{op}_{next(counter)}_output_0"
        nodes.append(helper.make_node(op, inputs, [out], **attrs))
        return out

    def const(value: Any, dtype: Any = np.float32) -> str:
        out = f"/Constant_{next(counter)}_output_0"
        tensor = numpy_helper.from_array(np.asarray(value, dtype=dtype))
        nodes.append(helper.make_node("Constant", [], [out], value=tensor))
        return out

    def named(name: str, value: np.ndarray) -> str:
        value = value.astype(np.float32)
        if name in spec.as_constant:
            return const(value)
        inits.append(numpy_helper.from_array(value, name))
        return name

    def matmul_add(x: str, prefix: str, n_in: int, n_out: int) -> str:
        weight = f"onnx::MatMul_{next(counter)}"
        inits.append(numpy_helper.from_array(rng.normal(0, 0.3, (n_in, n_out)).astype(np.float32), weight))
        bias_value = rng.normal(0, 0.1, n_out).astype(np.float32)
        bias_name = f"{prefix}.bias"
        if spec.anonymous_bias == bias_name:
            bias_name = f"onnx::Add_{next(counter)}"
            inits.append(numpy_helper.from_array(bias_value, bias_name))
        else:
            bias_name = named(bias_name, bias_value)
        return node("Add", [bias_name, node("MatMul", [x, weight])])  # bias first, as the export has it

    def layer_norm(x: str, prefix: str) -> str:
        mean = node("ReduceMean", [x], axes=[-1])
        centred = node("Sub", [x, mean])
        var = node("ReduceMean", [node("Pow", [centred, const(2.0)])], axes=[-1])
        normed = node("Div", [centred, node("Sqrt", [node("Add", [var, const(spec.eps)])])])
        gamma = named(f"{prefix}.weight", 1.0 + rng.normal(0, 0.1, spec.hidden))
        beta = named(f"{prefix}.bias", rng.normal(0, 0.1, spec.hidden))
        return node("Add", [node("Mul", [normed, gamma]), beta])

    def split_heads(x: str) -> str:
        dims = [
            node("Unsqueeze", [node("Gather", [node("Shape", [x]), const(i, np.int64)], axis=0)], axes=[0])
            for i in (0, 1)
        ]
        head_dim = spec.hidden // spec.heads
        shape = node("Concat", [*dims, const([spec.heads], np.int64), const([head_dim], np.int64)], axis=0)
        return node("Transpose", [node("Reshape", [x, shape])], perm=[0, 2, 1, 3])

    h = spec.hidden
    # additive attention mask: (1 - mask) * float32 min, shape [batch, 1, 1, seq]
    mask = node(
        "Cast", [node("Unsqueeze", [node("Unsqueeze", ["attention_mask"], axes=[1])], axes=[2])], to=1
    )
    additive = node("Mul", [node("Sub", [const(1.0), mask]), const(np.finfo(np.float32).min)])
    seq_len = node(
        "Unsqueeze", [node("Gather", [node("Shape", ["input_ids"]), const(1, np.int64)], axis=0)], axes=[0]
    )
    position_ids = node(
        "Slice",
        [const(np.arange(spec.positions)[None, :], np.int64), const([0], np.int64), seq_len,
         const([1], np.int64), const([1], np.int64)],
    )  # fmt: skip
    words = named("embeddings.word_embeddings.weight", rng.normal(0, 0.5, (spec.vocab, h)))
    types = named("embeddings.token_type_embeddings.weight", rng.normal(0, 0.5, (spec.type_vocab, h)))
    positions = named("embeddings.position_embeddings.weight", rng.normal(0, 0.5, (spec.positions, h)))
    x = node("Add", [node("Gather", [words, "input_ids"]), node("Gather", [types, "token_type_ids"])])
    x = layer_norm(node("Add", [x, node("Gather", [positions, position_ids])]), "embeddings.LayerNorm")
    scale = spec.score_scale or math.sqrt(h // spec.heads)
    for n in range(spec.layers):
        p = f"encoder.layer.{n}"
        q = split_heads(matmul_add(x, f"{p}.attention.self.query", h, h))
        k = split_heads(matmul_add(x, f"{p}.attention.self.key", h, h))
        v = split_heads(matmul_add(x, f"{p}.attention.self.value", h, h))
        scores = node("Div", [node("MatMul", [q, node("Transpose", [k], perm=[0, 1, 3, 2])]), const(scale)])
        probs = node("Softmax", [node("Add", [scores, additive])], axis=-1)
        context = node("Transpose", [node("MatMul", [probs, v])], perm=[0, 2, 1, 3])
        context = node("Reshape", [context, const([0, 0, h], np.int64)])
        attn = matmul_add(context, f"{p}.attention.output.dense", h, h)
        x = layer_norm(node("Add", [attn, x]), f"{p}.attention.output.LayerNorm")
        inner = matmul_add(x, f"{p}.intermediate.dense", h, spec.ffn)
        erf = node("Erf", [node("Div", [inner, const(math.sqrt(2.0))])])
        gelu = node("Mul", [node("Mul", [inner, node("Add", [erf, const(1.0)])]), const(0.5)])
        out = matmul_add(gelu, f"{p}.output.dense", spec.ffn, h)
        x = layer_norm(node("Add", [out, x]), f"{p}.output.LayerNorm")
    nodes.append(helper.make_node("Identity", [x], ["last_hidden_state"]))

    def int_input(name: str) -> Any:
        return helper.make_tensor_value_info(name, TensorProto.INT64, ["batch_size", "sequence_length"])

    graph = helper.make_graph(
        nodes,
        "tiny-bert",
        [int_input("input_ids"), int_input("attention_mask"), int_input("token_type_ids")],
        [
            helper.make_tensor_value_info(
                "last_hidden_state", TensorProto.FLOAT, ["batch_size", "sequence_length", h]
            )
        ],
        inits,
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 11)], producer_name="tiny-bert-test"
    )
    model.ir_version = 6
    onnx.checker.check_model(model)
    return model


def tokenizer_json(vocab: list[str] = TINY_VOCAB, lowercase: bool = False) -> str:
    """A `tokenizers` JSON with a BERT WordPiece model over ``vocab`` (normalizer as in the jar)."""
    return json.dumps(
        {
            "version": "1.0",
            "added_tokens": [{"id": i, "content": t, "special": True} for i, t in enumerate(vocab[:5])],
            "normalizer": {"type": "BertNormalizer", "clean_text": True, "lowercase": lowercase},
            "pre_tokenizer": {"type": "BertPreTokenizer"},
            "model": {
                "type": "WordPiece",
                "unk_token": "[UNK]",
                "continuing_subword_prefix": "##",
                "max_input_chars_per_word": 100,
                "vocab": {t: i for i, t in enumerate(vocab)},
            },
        },
        ensure_ascii=False,
    )


def write(directory: Path, spec: TinyBert | None = None, vocab: list[str] = TINY_VOCAB) -> tuple[Path, Path]:
    """Write ``bge-small-zh-v1.5.onnx`` and ``bge-small-zh-v1.5-tokenizer.json`` (the jar's names)."""
    import onnx

    directory.mkdir(parents=True, exist_ok=True)
    onnx_path = directory / "bge-small-zh-v1.5.onnx"
    onnx.save(build(spec or TinyBert(vocab=len(vocab))), str(onnx_path))
    tok_path = directory / "bge-small-zh-v1.5-tokenizer.json"
    tok_path.write_text(tokenizer_json(vocab), encoding="utf-8")
    return onnx_path, tok_path
