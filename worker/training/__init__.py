"""Training-side code: corpus, vocabulary, training and distillation, base-model conversion, evaluation,
export and quantization."""
