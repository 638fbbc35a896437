"""A byte-level BPE tokenizer trained locally (``tokenizers``) on the text of the suite's workloads.

Nothing is downloaded: the corpus is the worked solutions and tool dialogues the tasks generate. Digits
are split one per token before BPE (numbers are read digit by digit, as in Qwen/Llama tokenizers),
and byte-level encoding makes ``decode(encode(s)) == s`` for every string. Special tokens are fixed
ids 0..N-1 (``SPECIAL_TOKENS``): padding, end of sequence, the block drafts' mask token, the chat
roles and the tool-call delimiters.

    python -m repro.rl.tokenizer --out /tmp/tok --vocab-size 512     # train, save, print a sample
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Iterable

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

SPECIAL_TOKENS = ("<pad>", "<eos>", "<mask>", "<user>", "<assistant>", "<call>", "</call>", "<obs>", "</obs>")
TOKENIZER_FILE = "tokenizer.json"


class WorkloadTokenizer:
    """Thin wrapper: ids of the special tokens, encode/decode without surprises."""

    def __init__(self, tok: Tokenizer):
        self.tok = tok
        for i, name in enumerate(SPECIAL_TOKENS):
            got = tok.token_to_id(name)
            if got != i:
                raise ValueError(f"tokenizer special token {name!r} has id {got}, expected {i}; "
                                 "retrain it with repro.rl.tokenizer.train_tokenizer")
        self.pad_id, self.eos_id, self.mask_id = 0, 1, 2
        self.user_id, self.assistant_id = 3, 4
        self.call_id, self.call_end_id, self.obs_id, self.obs_end_id = 5, 6, 7, 8

    @property
    def vocab_size(self) -> int:
        return self.tok.get_vocab_size()

    def encode(self, text: str) -> list[int]:
        return self.tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: Iterable[int], skip_special: bool = True) -> str:
        return self.tok.decode(list(ids), skip_special_tokens=skip_special)

    def save(self, folder: str | Path) -> Path:
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / TOKENIZER_FILE
        self.tok.save(str(path))
        return path

    @classmethod
    def load(cls, folder: str | Path) -> "WorkloadTokenizer":
        path = Path(folder) / TOKENIZER_FILE
        if not path.is_file():
            raise FileNotFoundError(f"no tokenizer at {path}; train one with "
                                    f"`python -m repro.rl.tokenizer --out {folder}`")
        return cls(Tokenizer.from_file(str(path)))


def train_tokenizer(corpus: Iterable[str], vocab_size: int = 512) -> WorkloadTokenizer:
    """Train the byte-level BPE on ``corpus`` (an iterable of strings)."""
    if vocab_size < 256 + len(SPECIAL_TOKENS):
        raise ValueError(f"vocab_size={vocab_size} is below the byte alphabet plus special tokens "
                         f"({256 + len(SPECIAL_TOKENS)})")
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(list(corpus), trainer=trainer)
    return WorkloadTokenizer(tok)


def workload_corpus(seed: int = 0, n_math: int = 2000, n_tools: int = 600) -> list[str]:
    """Text of both workloads (worked solutions, tool dialogues) for training the tokenizer."""
    from repro.rl.tasks.math import MathTaskSet
    from repro.rl.tasks.workplace import WorkplaceTaskSet
    texts = [p.prompt_text + " " + p.solution_text for p in MathTaskSet(seed=seed).problems("train", n_math)]
    texts += [t.demo_text() for t in WorkplaceTaskSet(seed=seed).tasks("train", n_tools)]
    return texts


def build_workload_tokenizer(folder: str | Path, vocab_size: int = 512, seed: int = 0) -> WorkloadTokenizer:
    """Load the tokenizer cached in ``folder`` if its settings match, else train and save it there."""
    folder = Path(folder)
    meta_path = folder / "tokenizer_meta.json"
    meta = {"vocab_size": vocab_size, "seed": seed, "special_tokens": list(SPECIAL_TOKENS)}
    if meta_path.is_file() and json.loads(meta_path.read_text()) == meta:
        return WorkloadTokenizer.load(folder)
    tok = train_tokenizer(workload_corpus(seed), vocab_size)
    tok.save(folder)
    meta_path.write_text(json.dumps(meta) + "\n")
    return tok


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--vocab-size", type=int, default=512)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    tok = build_workload_tokenizer(args.out, args.vocab_size, args.seed)
    sample = workload_corpus(args.seed, 1, 1)[0]
    ids = tok.encode(sample)
    print(f"vocab {tok.vocab_size}; sample of {len(sample)} chars -> {len(ids)} tokens")
    print([tok.decode([i], skip_special=False) for i in ids[:40]])


if __name__ == "__main__":
    main()
