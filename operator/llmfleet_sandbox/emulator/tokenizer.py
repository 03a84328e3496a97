"""The sandbox tokenizer: one token per whitespace-separated word.

The engine's tokenizer directory holds `tokenizer_config.json`, written by the sandbox's
`huggingface-cli` stand-in with `tokenizer_config(vocab_size)`. Words of the emulator's own
vocabulary encode to their index (so generated tokens decode back to them); any other word
encodes to a stable hash in [len(VOCABULARY), vocab_size), so the same prompt always gives the
same ids and prefix reuse sees equal prefixes. Ids decode to vocabulary words. There are no
special tokens: BOS is never added and nothing is skipped on decode, so a prompt of N words is
N tokens for the engine as for the load generator.
"""

from __future__ import annotations

import json
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

CONFIG_FILE = "tokenizer_config.json"
TOKENIZER_CLASS = "LlmfleetSandboxWordTokenizer"


def _vocabulary() -> tuple[str, ...]:
    consonants, vowels = "bdfgklmnprstvz", "aeiou"
    syllables = [c + v for c in consonants for v in vowels]
    return tuple(first + second for first in syllables for second in syllables[::7])


# The words the emulated engine generates: token id i is VOCABULARY[i].
VOCABULARY = _vocabulary()
_INDEX_BY_WORD = {word: index for index, word in enumerate(VOCABULARY)}


class TokenizerError(ValueError):
    """The tokenizer directory is missing or its config is unusable; the message says which."""


def tokenizer_config(vocab_size: int) -> dict[str, Any]:
    """The content of tokenizer_config.json for a model with this vocabulary size."""
    return {"tokenizer_class": TOKENIZER_CLASS, "vocab_size": vocab_size,
            "eos_token_id": vocab_size - 1, "pad_token_id": vocab_size - 1}


@dataclass(frozen=True)
class WordTokenizer:
    vocab_size: int
    end_id: int
    pad_id: int

    @classmethod
    def from_dir(cls, tokenizer_dir: Path) -> "WordTokenizer":
        path = Path(tokenizer_dir) / CONFIG_FILE
        if not Path(tokenizer_dir).is_dir():
            raise TokenizerError(f"tokenizer directory {tokenizer_dir} does not exist (tokenizer_dir)")
        try:
            config = json.loads(path.read_text())
        except FileNotFoundError:
            raise TokenizerError(f"{path} does not exist: the tokenizer directory has no {CONFIG_FILE}") from None
        except (OSError, json.JSONDecodeError) as error:
            raise TokenizerError(f"cannot read {path}: {error}") from None
        if not isinstance(config, dict) or config.get("tokenizer_class") != TOKENIZER_CLASS:
            raise TokenizerError(f"{path}: tokenizer_class must be {TOKENIZER_CLASS!r} (the sandbox tokenizer)")
        vocab_size = config.get("vocab_size")
        if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size <= len(VOCABULARY):
            raise TokenizerError(f"{path}: vocab_size must be an integer above {len(VOCABULARY)}, got {vocab_size!r}")
        end_id = config.get("eos_token_id", vocab_size - 1)
        pad_id = config.get("pad_token_id", end_id)
        return cls(vocab_size, end_id, pad_id)

    def encode(self, text: str) -> list[int]:
        return [self._token_id(word) for word in text.split()]

    def decode(self, token_ids: Sequence[int]) -> str:
        return " ".join(VOCABULARY[token_id % len(VOCABULARY)] for token_id in token_ids)

    def _token_id(self, word: str) -> int:
        index = _INDEX_BY_WORD.get(word)
        if index is not None:
            return index
        return len(VOCABULARY) + zlib.crc32(word.encode()) % (self.vocab_size - len(VOCABULARY))
