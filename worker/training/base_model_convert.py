"""A BERT-style ONNX graph (Hugging Face export, e.g. bge-small-zh-v1.5) → PaddleNLP ``ErnieModel`` weights.

The named initializers are the embeddings, LayerNorms and biases. Each anonymous ``onnx::MatMul_*`` weight
is named through the ``Add`` node that consumes the MatMul's output: its other input is the named bias
(``encoder.layer.N.attention.self.query.bias`` → that layer's query weight). ONNX MatMul weights are
``[in, out]``, the layout of Paddle's ``nn.Linear``, so nothing is transposed. Architecture facts the
initializers do not carry (attention heads, LayerNorm epsilon, the activation) are read from the graph's
nodes. ``parity`` compares onnxruntime's ``last_hidden_state`` with the Paddle model's sequence output.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from worker.training.base_model_fetch import BaseModelError

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
# Hugging Face BERT layer parameter prefix → Paddle nn.TransformerEncoderLayer's.
_LAYER_PARTS = {
    "attention.self.query": "self_attn.q_proj",
    "attention.self.key": "self_attn.k_proj",
    "attention.self.value": "self_attn.v_proj",
    "attention.output.dense": "self_attn.out_proj",
    "attention.output.LayerNorm": "norm1",
    "intermediate.dense": "linear1",
    "output.dense": "linear2",
    "output.LayerNorm": "norm2",
}
_EMBEDDING_PARTS = {
    "embeddings.word_embeddings": "embeddings.word_embeddings",
    "embeddings.position_embeddings": "embeddings.position_embeddings",
    "embeddings.token_type_embeddings": "embeddings.token_type_embeddings",
    "embeddings.LayerNorm": "embeddings.layer_norm",
}
_LAYER_NAME = re.compile(r"^encoder\.layer\.(\d+)\.(.+)\.(weight|bias)$")
# Paddle's PretrainedModel._init_weights sets every ErnieModel LayerNorm epsilon to this.
PADDLE_LAYER_NORM_EPS = 1e-12

# Probe texts of the parity check: reviews, English word pieces, digits, emoji, full-width forms.
PARITY_TEXTS = (
    "这家店的麻辣烫很正宗，汤底浓郁，强烈推荐。",
    "送错了餐，打电话也没人理，差评！",
    "Hello World, the iPhone 15 Pro Max unboxing was amazing; 物流很快",
    "价格￥199.00元，折扣30%~50%，2024年12月31日到货，订单号 20241231123456",
    "emoji 😀🙃👍🏻❤️ 混合表情，好评👍",
    "ＡＢＣ全角字符１２３，「引号」【括号】！？",
    "房间很大，早餐丰富，服务员态度也好。下次还来住。",
)


class ConversionError(BaseModelError):
    """The graph cannot be converted (a weight is missing, shapes disagree, parity fails)."""


@dataclass(frozen=True)
class GraphFacts:
    """What the converter read from the graph: HF-named weights and the architecture."""

    weights: dict[str, np.ndarray]
    num_heads: int
    layer_norm_eps: float | None
    activation: str


def paddle_name(hf_name: str) -> str | None:
    """The ErnieModel state-dict key of a Hugging Face BERT parameter name, or None if it has none."""
    for prefix, target in _EMBEDDING_PARTS.items():
        if hf_name.startswith(prefix + "."):
            return target + hf_name[len(prefix) :]
    match = _LAYER_NAME.match(hf_name)
    if match and match.group(2) in _LAYER_PARTS:
        layer, part, kind = match.groups()
        return f"encoder.layers.{layer}.{_LAYER_PARTS[part]}.{kind}"
    return None


def hf_name(paddle_key: str) -> str | None:
    """The Hugging Face name a Paddle key comes from (inverse of ``paddle_name``), for error messages."""
    for prefix, target in _EMBEDDING_PARTS.items():
        if paddle_key.startswith(target + "."):
            return prefix + paddle_key[len(target) :]
    match = re.match(r"^encoder\.layers\.(\d+)\.(.+)\.(weight|bias)$", paddle_key)
    if match:
        inverse = {v: k for k, v in _LAYER_PARTS.items()}
        layer, part, kind = match.groups()
        if part in inverse:
            return f"encoder.layer.{layer}.{inverse[part]}.{kind}"
    return None


def _scalar(values: dict[str, np.ndarray], name: str) -> float | None:
    value = values.get(name)
    return float(value.reshape(-1)[0]) if value is not None and value.size == 1 else None


def read_graph(model: Any) -> GraphFacts:
    """Weights under their Hugging Face names, plus heads, LayerNorm epsilon and activation of ``model``.

    ``model`` is an ``onnx.ModelProto``. Raises ConversionError when an anonymous MatMul weight cannot be
    named or two weights claim one name.
    """
    from onnx import numpy_helper

    graph = model.graph
    inits = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    constants = {
        out: numpy_helper.to_array(node.attribute[0].t)
        for node in graph.node
        if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value"
        for out in node.output
    }
    consumers: dict[str, list[Any]] = {}
    producers: dict[str, Any] = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
        for name in node.output:
            producers[name] = node

    weights = {n: np.asarray(v, dtype=np.float32) for n, v in inits.items() if not n.startswith("onnx::")}
    unnamed: list[str] = []
    for node in graph.node:
        if node.op_type != "MatMul" or node.input[1] not in inits or not node.input[1].startswith("onnx::"):
            continue
        bias = next(
            (
                other
                for add in consumers.get(node.output[0], [])
                if add.op_type == "Add"
                for other in add.input
                if other != node.output[0] and other in weights and other.endswith(".bias")
            ),
            None,
        )
        if bias is None:
            unnamed.append(node.input[1])
            continue
        name = bias[: -len(".bias")] + ".weight"
        if name in weights:
            raise ConversionError(f"two weights claim {name} (one is {node.input[1]})")
        weights[name] = np.asarray(inits[node.input[1]], dtype=np.float32)
    if unnamed:
        raise ConversionError(
            f"cannot name the MatMul weights {', '.join(unnamed)}: no Add node with a named *.bias "
            "consumes their MatMul's output"
        )

    # LayerNorm decomposed (opset < 17): ReduceMean(x²) + eps → Sqrt. eps is the other Add input.
    eps_values: list[float] = []
    for node in graph.node:
        if node.op_type == "Add" and any(
            producers.get(i) is not None and producers[i].op_type == "ReduceMean" for i in node.input
        ):
            for i in node.input:
                value = _scalar(constants, i) if i in constants else _scalar(inits, i)
                if value is not None:
                    eps_values.append(value)
    eps_values += [
        float(a.f)
        for n in graph.node
        if n.op_type == "LayerNormalization"
        for a in n.attribute
        if a.name == "epsilon"
    ]
    eps_values = [float(f"{v:.6g}") for v in eps_values]  # float32 1e-12 reads as 9.99999996e-13
    if len(set(eps_values)) > 1:
        raise ConversionError(f"the graph's LayerNorms use different epsilons: {sorted(set(eps_values))}")

    # Heads: the attention Reshape's shape is Concat(batch, seq, [heads], [head_dim]).
    hidden = (
        int(weights["embeddings.word_embeddings.weight"].shape[1])
        if "embeddings.word_embeddings.weight" in weights
        else 0
    )
    heads: Counter[int] = Counter()
    for node in graph.node:
        if node.op_type != "Concat" or len(node.input) != 4:
            continue
        tail = [constants.get(i, inits.get(i)) for i in node.input[2:]]
        if all(t is not None and t.size == 1 for t in tail):
            h, d = (int(t.reshape(-1)[0]) for t in tail)  # type: ignore[union-attr]
            if h > 0 and h * d == hidden:
                heads[h] += 1
    if not heads:
        raise ConversionError("cannot find the number of attention heads (no [heads, head_dim] reshape)")

    ops = {n.op_type for n in graph.node}
    if "Erf" not in ops and "Gelu" not in ops:
        raise ConversionError("the feed-forward activation is not the exact (erf) GELU ErnieModel uses")
    return GraphFacts(weights, heads.most_common(1)[0][0], eps_values[0] if eps_values else None, "gelu")


def ernie_config(facts: GraphFacts, pad_token_id: int) -> dict[str, Any]:
    """ErnieConfig fields of the graph: sizes from the weights' shapes, heads/eps/activation from nodes."""
    w = facts.weights
    try:
        vocab, hidden = w["embeddings.word_embeddings.weight"].shape
        layers = 1 + max(int(m.group(1)) for n in w if (m := _LAYER_NAME.match(n)))
        config = {
            "vocab_size": int(vocab),
            "hidden_size": int(hidden),
            "num_hidden_layers": layers,
            "num_attention_heads": facts.num_heads,
            "intermediate_size": int(w["encoder.layer.0.intermediate.dense.bias"].shape[0]),
            "hidden_act": facts.activation,
            "hidden_dropout_prob": 0.1,
            "attention_probs_dropout_prob": 0.1,
            "max_position_embeddings": int(w["embeddings.position_embeddings.weight"].shape[0]),
            "type_vocab_size": int(w["embeddings.token_type_embeddings.weight"].shape[0]),
            "initializer_range": 0.02,
            "pad_token_id": pad_token_id,
            "layer_norm_eps": facts.layer_norm_eps
            if facts.layer_norm_eps is not None
            else PADDLE_LAYER_NORM_EPS,
        }
    except (KeyError, ValueError) as exc:
        raise ConversionError(f"the graph lacks an embedding or layer weight: {exc}") from None
    if config["layer_norm_eps"] != PADDLE_LAYER_NORM_EPS:
        raise ConversionError(
            f"the graph's LayerNorm epsilon is {config['layer_norm_eps']}, PaddleNLP's ErnieModel always "
            f"uses {PADDLE_LAYER_NORM_EPS}: its outputs would differ"
        )
    return config


def paddle_state(facts: GraphFacts, expected: dict[str, tuple[int, ...]]) -> dict[str, np.ndarray]:
    """The ErnieModel state dict; ``expected`` maps each ErnieModel key to its shape.

    Every key except the pooler's must be filled with the right shape, and every graph weight used;
    otherwise ConversionError names the offending keys and their ONNX names.
    """
    state: dict[str, np.ndarray] = {}
    unused = []
    for name, value in facts.weights.items():
        key = paddle_name(name)
        if key is None or key not in expected:
            unused.append(name)
        else:
            state[key] = value
    missing = [k for k in expected if not k.startswith("pooler.") and k not in state]
    if missing:
        raise ConversionError(
            "the graph lacks weights ErnieModel needs: "
            + ", ".join(f"{k} (ONNX {hf_name(k) or '?'})" for k in missing)
        )
    if unused:
        raise ConversionError(f"graph weights with no ErnieModel parameter: {', '.join(sorted(unused))}")
    wrong = [f"{k} {state[k].shape} vs {expected[k]}" for k in state if tuple(state[k].shape) != expected[k]]
    if wrong:
        raise ConversionError("shape mismatch (graph vs ErnieModel): " + "; ".join(wrong))
    return state


def build_model(config: dict[str, Any], facts: GraphFacts) -> tuple[Any, dict[str, np.ndarray]]:
    """An eval-mode ``ErnieModel`` holding the graph's weights, and the state dict it was given."""
    from paddlenlp.transformers import ErnieConfig, ErnieModel

    model = ErnieModel(ErnieConfig(**config))
    expected = {k: tuple(int(d) for d in v.shape) for k, v in model.state_dict().items()}
    state = paddle_state(facts, expected)
    model.set_state_dict({**model.state_dict(), **state})  # the pooler keeps its fresh weights
    model.eval()
    return model, state


def read_wordpiece_vocab(tokenizer_json: Path) -> tuple[list[str], bool, str]:
    """The WordPiece vocabulary of a `tokenizers` JSON in id order, whether it is lower-cased, and why.

    Lower-cased: the JSON's normalizer says so, or no piece except ``[X]``/``<X>`` markers has an
    upper-case letter (an uncased vocabulary whose exporter dropped the flag).
    """
    try:
        raw = json.loads(tokenizer_json.read_text(encoding="utf-8"))
        model = raw["model"]
        vocab: dict[str, int] = model["vocab"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ConversionError(
            f"{tokenizer_json} is not a `tokenizers` JSON with a vocabulary: {exc}"
        ) from None
    if model.get("type") != "WordPiece" or model.get("continuing_subword_prefix", "##") != "##":
        raise ConversionError(f"{tokenizer_json}: not a WordPiece model with ## continuations")
    tokens = sorted(vocab, key=vocab.__getitem__)
    if [vocab[t] for t in tokens] != list(range(len(tokens))):
        raise ConversionError(f"{tokenizer_json}: vocabulary ids are not 0..{len(tokens) - 1} without gaps")
    missing = [t for t in SPECIAL_TOKENS if t not in vocab]
    if missing:
        raise ConversionError(f"{tokenizer_json}: special tokens {missing} are not in the vocabulary")
    # vocab.txt is read with universal newlines: \n and \r end a line (U+2028, a token here, does not).
    if any("\n" in t or "\r" in t or not t for t in tokens):
        raise ConversionError(
            f"{tokenizer_json}: a token is empty or holds a line break (vocab.txt is per line)"
        )
    flag = bool((raw.get("normalizer") or {}).get("lowercase", False))
    cased = any(c.isupper() for t in tokens if not re.fullmatch(r"\[.*\]|<.*>", t) for c in t)
    if flag:
        reason = "The tokenizer JSON's normalizer lower-cases."
    elif not cased:
        reason = (
            "The tokenizer JSON's normalizer says `lowercase: false`, but no word piece has an upper-case "
            "letter (an uncased vocabulary: upper-case text would only reach [UNK]), so this lower-cases."
        )
    else:
        reason = "Cased: the tokenizer JSON does not lower-case and the vocabulary has upper-case pieces."
    return tokens, flag or not cased, reason


def probe_batch(tokenizer: Any, texts: Sequence[str], max_len: int) -> tuple[np.ndarray, np.ndarray]:
    """``[CLS] text [SEP]`` ids padded to the longest, and the attention mask (1 = real token)."""
    seqs = [
        [
            tokenizer.cls_token_id,
            *tokenizer.convert_tokens_to_ids(tokenizer.tokenize(t))[: max_len - 2],
            tokenizer.sep_token_id,
        ]
        for t in texts
    ]
    longest = max(len(s) for s in seqs)
    ids = np.full((len(seqs), longest), tokenizer.pad_token_id, dtype=np.int64)
    mask = np.zeros_like(ids)
    for row, seq in enumerate(seqs):
        ids[row, : len(seq)] = seq
        mask[row, : len(seq)] = 1
    return ids, mask


def parity(onnx_path: Path, model: Any, ids: np.ndarray, mask: np.ndarray) -> float:
    """Max |onnxruntime last_hidden_state − Paddle sequence output| over the real (mask = 1) tokens."""
    import onnxruntime as ort
    import paddle

    session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    feeds = {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
    names = [i.name for i in session.get_inputs()]
    unknown = [n for n in names if n not in feeds]
    if unknown:
        raise ConversionError(f"the graph has inputs the parity check cannot feed: {unknown}")
    reference = session.run(None, {n: feeds[n] for n in names})[0]
    with paddle.no_grad():
        t_ids = paddle.to_tensor(ids)
        out = model(t_ids, token_type_ids=paddle.zeros_like(t_ids), attention_mask=paddle.to_tensor(mask))
    sequence = (out[0] if isinstance(out, (tuple, list)) else out).numpy()
    if sequence.shape != reference.shape:
        raise ConversionError(f"output shapes differ: onnxruntime {reference.shape}, Paddle {sequence.shape}")
    return float(np.abs(sequence - reference)[mask.astype(bool)].max())
