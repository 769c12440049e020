"""Small random models, a word-level tokenizer and tiny datasets for tests (no network)."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import torch
import transformers as tf

FAMILIES = ("bert", "roberta", "xlm-roberta", "camembert", "data2vec-text", "roberta-prelayernorm", "xlm-roberta-xl",
            "electra", "distilbert", "deberta-v2", "modernbert")
# Families whose layout differs from BERT's beyond module names: the checks that depend on the
# attention layout run on these and on one BERT-like family, not on every RoBERTa twin.
LAYOUTS = ("bert", "distilbert", "deberta-v2", "modernbert")

WORDS = (
    "good great fine bad awful terrible movie film plot actor story boring fun dull "
    "brilliant weak strong the a is was very not and but it this of"
).split()


def make_tokenizer() -> tf.PreTrainedTokenizerFast:
    """A WordPiece tokenizer over :data:`WORDS` (``vocab_file=`` is ignored by transformers 5)."""
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    vocab = {w: i for i, w in enumerate(specials + list(WORDS))}
    return tf.BertTokenizerFast(vocab=vocab, do_lower_case=True)


VOCAB_SIZE = 5 + len(WORDS)


def make_config(family: str, *, num_labels: int = 3, layers: int = 2, heads: int = 4, head_dim: int = 8,
                **overrides):
    """A tiny config of ``family``; ``overrides`` replace any of its fields."""
    hidden = heads * head_dim
    common = {"num_labels": num_labels, "vocab_size": VOCAB_SIZE, "pad_token_id": 0}
    if family == "distilbert":
        return tf.DistilBertConfig(**{"dim": hidden, "n_layers": layers, "n_heads": heads, "hidden_dim": 2 * hidden,
                                      "max_position_embeddings": 128, **common, **overrides})
    bert_like = dict(hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                     intermediate_size=2 * hidden, max_position_embeddings=130, **common)
    if family == "electra":
        bert_like["embedding_size"] = max(8, hidden // 2)
    if family == "deberta-v2":
        # DeBERTa-v3's layout (microsoft/deberta-v3-base): relative positions only, in log buckets,
        # projected through the shared query/key projections; both c2p and p2c terms.
        bert_like.update(relative_attention=True, pos_att_type="p2c|c2p", position_buckets=8,
                         max_relative_positions=-1, share_att_key=True, position_biased_input=False,
                         norm_rel_ebd="layer_norm", type_vocab_size=0)
    if family == "modernbert":
        # Layers 0 and 2 attend globally, layer 1 in a window of 2 tokens each side, so the short
        # test sentences reach past it. Mean pooling, as ModernBERT-base's classifier does.
        bert_like.update(local_attention=4, global_attn_every_n_layers=2, classifier_pooling="mean",
                         cls_token_id=2, sep_token_id=3, bos_token_id=2, eos_token_id=3)
    if family not in FAMILIES:
        raise ValueError(family)
    return tf.AutoConfig.for_model(family, **{**bert_like, **overrides})


def make_classifier(family: str = "bert", *, seed: int = 0, **kwargs) -> torch.nn.Module:
    """A randomly initialised ``AutoModelForSequenceClassification`` of ``family`` in eval mode."""
    torch.manual_seed(seed)
    model = tf.AutoModelForSequenceClassification.from_config(make_config(family, **kwargs))
    return model.eval()


def make_texts(n: int, *, num_classes: int = 3, seed: int = 0, min_len: int = 3, max_len: int = 14):
    """Random sentences whose words depend on the class, so a model can learn the labels."""
    rng = np.random.default_rng(seed)
    labels = np.arange(n) % num_classes
    rng.shuffle(labels)
    texts = []
    for y in labels:
        k = int(rng.integers(min_len, max_len + 1))
        marker = WORDS[int(y) % len(WORDS)]
        words = [marker if rng.random() < 0.4 else WORDS[int(rng.integers(len(WORDS)))] for _ in range(k)]
        texts.append(" ".join(words))
    return texts, labels.astype(np.int64)


def write_dataset(directory: Path, *, n_train=90, n_test=30, num_classes=3, columns=("text", "label"),
                  string_labels=False) -> Path:
    """``train.csv`` and ``test.csv`` of ``make_texts`` sentences under ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    for split, n, seed in (("train", n_train, 0), ("test", n_test, 1)):
        texts, labels = make_texts(n, num_classes=num_classes, seed=seed)
        rows = [(t, f"class{y}" if string_labels else int(y)) for t, y in zip(texts, labels, strict=True)]
        with open(directory / f"{split}.csv", "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(columns)
            writer.writerows(rows)
    return directory
