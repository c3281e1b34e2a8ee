"""Byte-level BPE tokenizer for the tiny model (vocab 4096), saved as an HF PreTrainedTokenizerFast.

Digits are split individually (as in Llama / Qwen), so numbers are copied digit by digit in retrieval tasks.
Special tokens: `<|endoftext|>` (id 0: bos / eos / document separator) and `<|pad|>` (id 1).
Trained on the train splits of the four corpora plus task-template text (so `VAR`, digits, `Passage:` get tokens).
"""
from __future__ import annotations

import random
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from npumoe_lab.workloads import fewshot, ruler
from npumoe_lab.train import corpora

VOCAB_SIZE = 4096
EOT, PAD = "<|endoftext|>", "<|pad|>"


def _iter_texts(chunk_chars: int = 100_000):
    for d in corpora.DOMAINS:
        text = corpora.train_text(d)
        for i in range(0, len(text), chunk_chars):
            yield text[i:i + chunk_chars]
    rng = random.Random(1234)
    for _ in range(5):
        yield ruler.synthetic_text(rng, 400)
        yield fewshot.synthetic_text(rng, 200)


def train_tokenizer(out_dir: str | Path | None, model_max_length: int = 2304, vocab_size: int = VOCAB_SIZE,
                    texts=None):
    """Train and (if out_dir) save. texts: an iterable of strings (default: the train splits + task text)."""
    from transformers import PreTrainedTokenizerFast
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOT, PAD], min_frequency=2,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(_iter_texts() if texts is None else texts, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=EOT, eos_token=EOT, unk_token=None,
                                   pad_token=PAD, model_max_length=model_max_length)
    if out_dir is not None:
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        fast.save_pretrained(out_dir)
    return fast


def load_tokenizer(path: str | Path):
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(str(path))


if __name__ == "__main__":
    import sys
    t = train_tokenizer(sys.argv[1] if len(sys.argv) > 1 else corpora.DATA_DIR / "train-runs" / "tokenizer")
    print(len(t), t.tokenize("ASSIGN 12345 -> ABCDE. Passage: In the beginning God created"))
