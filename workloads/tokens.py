"""Token counting: the model's tokenizer where one is on disk, else CommitBench's bundled fallback.

Model weights and tokenizers can't be downloaded here, so the default is a byte-level BPE
(32k merges) trained once with ``tokenizers`` on the ShareGPT package's first turns and replies
and shipped as ``workloads/data/bpe-sharegpt-32k.json.gz`` (``python -m harness workloads
build-tokenizer`` rebuilds it). It averages 4.2 characters per token on ShareGPT, close to the
large-vocabulary tokenizers of current models; every result records which counter measured it.
"""

from __future__ import annotations

import gzip
import hashlib
from functools import lru_cache
from pathlib import Path
from typing import Iterable, Protocol, Sequence

BUNDLED = Path(__file__).with_name("data") / "bpe-sharegpt-32k.json.gz"


class TokenCounter(Protocol):
    name: str

    def count(self, texts: Sequence[str]) -> list[int]: ...

    def encode(self, text: str) -> list[int]: ...


class BundledBPE:
    """The fallback byte-level BPE (``name`` carries the file's hash, so results say which one)."""

    def __init__(self, path: Path = BUNDLED):
        from tokenizers import Tokenizer

        if not path.is_file():
            raise FileNotFoundError(f"tokenizer {path}: missing; rebuild it with "
                                    "`python -m harness workloads build-tokenizer`")
        raw = gzip.decompress(path.read_bytes())
        self._tok = Tokenizer.from_str(raw.decode())
        self.name = f"bpe-sharegpt-32k:{hashlib.sha256(raw).hexdigest()[:12]}"

    def count(self, texts: Sequence[str]) -> list[int]:
        return [len(e.ids) for e in self._tok.encode_batch_fast(list(texts))]

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text).ids


class HFTokenizer:
    """A model's own tokenizer from a local directory (``tokenizer.json`` / ``tokenizer_config.json``)."""

    def __init__(self, path: str | Path):
        from transformers import AutoTokenizer

        self._tok = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
        self.name = f"hf:{Path(path).name}"

    def count(self, texts: Sequence[str]) -> list[int]:
        return [len(ids) for ids in self._tok(list(texts), add_special_tokens=False)["input_ids"]]

    def encode(self, text: str) -> list[int]:
        return self._tok(text, add_special_tokens=False)["input_ids"]


@lru_cache(maxsize=4)
def token_counter(tokenizer: str | None = None) -> TokenCounter:
    """``None``/``"bundled"``: the fallback BPE; a directory: that model's tokenizer (error if unusable)."""
    if tokenizer in (None, "", "bundled"):
        return BundledBPE()
    path = Path(tokenizer)
    if not path.is_dir():
        raise FileNotFoundError(f"tokenizer={tokenizer}: no such directory; point it at a model dir with "
                                "tokenizer files, or use tokenizer=bundled")
    try:
        return HFTokenizer(path)
    except Exception as e:  # transformers raises many kinds here
        raise ValueError(f"tokenizer={tokenizer}: cannot load a tokenizer from it ({e}); "
                         "use tokenizer=bundled") from None


def train_bpe(texts: Iterable[str], out: Path = BUNDLED, vocab_size: int = 32000) -> Path:
    """Train the byte-level BPE and write it gzipped (deterministic for the same texts)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer=trainer)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(gzip.compress(tok.to_str().encode(), mtime=0))
    token_counter.cache_clear()
    return out
