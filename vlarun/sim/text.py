"""A real subword tokenizer for the benchmark's instructions, shipped with every checkpoint.

A BPE with SentencePiece-style word boundaries (Metaspace, as Llama's tokenizer marks them),
trained with Hugging Face ``tokenizers`` on the prompt template filled with the task
instructions; characters never seen in training map to <unk>. Ids 0-2 are <unk>, <s>, </s>
as in Llama; the vocabulary stays below 256 so
the last 256 ids of the policy's 512-entry vocabulary are free for action bins.
"""

from __future__ import annotations

from pathlib import Path

from vlarun.models.tokenizer import HFTokenizer, openvla_prompt

TEXT_VOCAB = 256


def build_tokenizer(instructions: list[str], path: str | Path) -> HFTokenizer:
    """Train (or reuse, if ``path`` exists) the tokenizer; returns it loaded from disk."""
    path = Path(path)
    if not path.exists():
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

        tok = Tokenizer(models.BPE(unk_token="<unk>"))
        tok.pre_tokenizer = pre_tokenizers.Metaspace()
        tok.decoder = decoders.Metaspace()
        alphabet = list("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.,:?!'-")
        trainer = trainers.BpeTrainer(
            vocab_size=TEXT_VOCAB,
            special_tokens=["<unk>", "<s>", "</s>"],
            initial_alphabet=alphabet,
        )
        corpus = [openvla_prompt(i) for i in instructions] * 4
        tok.train_from_iterator(corpus, trainer)
        path.parent.mkdir(parents=True, exist_ok=True)
        tok.save(str(path))
    loaded = HFTokenizer(path)
    if loaded.vocab_size > TEXT_VOCAB:
        raise ValueError(f"{path}: vocabulary {loaded.vocab_size} overlaps the action bins")
    return loaded
