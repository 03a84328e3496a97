"""What the emulated engine answers: greedy decoding as a deterministic function of the prompt,
the model's weights and the engine's numerics.

Two engines of one model with lossless numerics (BF16, FP16) answer every prompt alike, on any
GPU or runtime, as greedy decoding of the same weights does. Lossy numerics (a quantised
format, a quantised KV cache) make each output position leave the reference answer with a
small probability; once left, the rest of the answer is the quantised engine's own, as in
autoregressive decoding, where one different token changes every later one. The per-token
probability is the catalog's quality cost of the format (quality_cost_percent / 100): an
emulator modelling choice, not a measured figure, that keeps "more lossy" meaning "drifts
more". A sandbox fault can add drift to one revision (llmfleet_sandbox.faults).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

from llmfleet.catalog import load_catalog
from llmfleet_sandbox.emulator.engine_config import EngineConfig
from llmfleet_sandbox.emulator.tokenizer import VOCABULARY

_UNIT_SCALE = float(1 << 64)


def _hash64(*parts: object) -> int:
    digest = hashlib.blake2b("\x1f".join(str(part) for part in parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little")


def prompt_digest(prompt_token_ids: Sequence[int]) -> int:
    return _hash64(*prompt_token_ids)


@dataclass(frozen=True)
class OutputModel:
    """`weights_identity` names the model (equal for every engine built from one checkpoint);
    `numerics_identity` the engine's lossy numerics (quantisation, KV dtype, injected drift);
    `divergence_per_token` the chance that a position leaves the reference answer."""

    weights_identity: str
    numerics_identity: str
    divergence_per_token: float
    vocabulary_size: int

    def tokens(self, prompt_token_ids: Sequence[int]) -> Iterator[int]:
        """The answer's token ids, one per output position, without end."""
        prompt = prompt_digest(prompt_token_ids)
        position, diverged = 0, False
        while True:
            reference = _hash64(self.weights_identity, prompt, position) % self.vocabulary_size
            if not diverged and self.divergence_per_token > 0:
                chance = _hash64(self.numerics_identity, prompt, position, "diverge") / _UNIT_SCALE
                if chance < self.divergence_per_token:
                    diverged = True
                    # The first different token is never the reference one.
                    offset = 1 + _hash64(self.numerics_identity, prompt, position) % (self.vocabulary_size - 1)
                    yield (reference + offset) % self.vocabulary_size
                    position += 1
                    continue
            if diverged:
                yield _hash64(self.weights_identity, self.numerics_identity, prompt, position) % self.vocabulary_size
            else:
                yield reference
            position += 1


def output_model_for_engine(config: EngineConfig, environ: Mapping[str, str]) -> OutputModel:
    """The answers of the engine `config` describes, with the sandbox's injected drift
    (llmfleet_sandbox.faults) for its revision, if any."""
    from llmfleet_sandbox.faults import injected

    catalog = load_catalog()
    quantization, kv_cache_dtype = config.catalog_quantization(catalog), config.catalog_kv_cache_dtype(catalog)
    weights = (config.architecture, config.num_hidden_layers, config.hidden_size, config.intermediate_size,
               config.num_attention_heads, config.num_key_value_heads, config.vocab_size)
    drift = injected(dict(environ)).drift
    lossy = (catalog.quantization(quantization).quality_cost_percent
             + catalog.kv_cache_dtype(kv_cache_dtype).quality_cost_percent) / 100
    return OutputModel(weights_identity="/".join(map(str, weights)),
                       numerics_identity=f"{quantization}/{kv_cache_dtype}/drift={drift!r}",
                       divergence_per_token=min(1.0, lossy + drift), vocabulary_size=len(VOCABULARY))
