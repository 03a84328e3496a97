"""The image's `preprocessing` and `postprocessing` models (inflight_batcher_llm), with the sandbox tokenizer.

The image ships them as /app/all_models/inflight_batcher_llm/{preprocessing,postprocessing}/1/model.py,
which the serving pod's init container copies into /models; each of those files imports one class
from here. Tensors and parameters are those of the rendered configs (`llmfleet.render.model_repo`):
preprocessing turns QUERY text into INPUT_ID token ids and passes the request's lengths and ids on;
postprocessing turns TOKENS_BATCH back into OUTPUT text. Both read `tokenizer_dir`.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils

from llmfleet_sandbox.emulator.tokenizer import TokenizerError, WordTokenizer


def _tokenizer(args: dict, model: str) -> WordTokenizer:
    config = json.loads(args["model_config"])
    try:
        tokenizer_dir = config["parameters"]["tokenizer_dir"]["string_value"]
    except KeyError:
        raise pb_utils.TritonModelException(f"{model}: config.pbtxt has no parameter 'tokenizer_dir'") from None
    try:
        return WordTokenizer.from_dir(Path(tokenizer_dir))
    except TokenizerError as error:
        raise pb_utils.TritonModelException(f"{model}: {error}") from None


def _input(request, name: str) -> np.ndarray | None:
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return None if tensor is None else tensor.as_numpy()


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _padded(rows: list[list[int]], pad: int) -> np.ndarray:
    width = max(len(row) for row in rows)
    return np.array([row + [pad] * (width - len(row)) for row in rows], dtype=np.int32)


# What the image's preprocessing initialize() requires of its config, so that a config the real
# model would refuse fails here too (llmfleet/catalog/releases/engine-24.12.yaml).
PREPROCESSING_REQUIRED_PARAMETERS = ("tokenizer_dir", "visual_model_path")
PREPROCESSING_REQUIRED_INPUTS = ("EMBEDDING_BIAS_WORDS", "EMBEDDING_BIAS_WEIGHTS")
PREPROCESSING_REQUIRED_OUTPUTS = ("INPUT_ID", "DECODER_INPUT_ID", "REQUEST_INPUT_LEN", "REQUEST_DECODER_INPUT_LEN",
                                  "BAD_WORDS_IDS", "STOP_WORDS_IDS", "OUT_END_ID", "OUT_PAD_ID",
                                  "OUT_PROMPT_TABLE_EXTRA_IDS", "PIXEL_VALUES", "IMAGE_SIZES")


def _require_config(config: dict) -> None:
    missing = [f"parameter {key!r}" for key in PREPROCESSING_REQUIRED_PARAMETERS
               if key not in (config.get("parameters") or {})]
    missing += [f"input {name!r}" for name in PREPROCESSING_REQUIRED_INPUTS
                if pb_utils.get_input_config_by_name(config, name) is None]
    missing += [f"output {name!r}" for name in PREPROCESSING_REQUIRED_OUTPUTS
                if pb_utils.get_output_config_by_name(config, name) is None]
    if missing:
        raise pb_utils.TritonModelException(f"preprocessing: config.pbtxt lacks {', '.join(missing)}")


class PreprocessingModel:
    def initialize(self, args):
        _require_config(json.loads(args["model_config"]))
        self.tokenizer = _tokenizer(args, "preprocessing")

    def execute(self, requests):
        responses = []
        for request in requests:
            try:
                responses.append(pb_utils.InferenceResponse(output_tensors=self._outputs(request)))
            except ValueError as error:
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(str(error))))
        return responses

    def _outputs(self, request) -> list:
        queries = _input(request, "QUERY")
        output_len = _input(request, "REQUEST_OUTPUT_LEN")
        if queries is None or output_len is None:
            raise ValueError("inputs QUERY and REQUEST_OUTPUT_LEN are required")
        batch = queries.shape[0]
        ids = [self.tokenizer.encode(_text(query)) for query in queries.reshape(batch, -1)[:, 0]]
        if not all(ids):
            raise ValueError("the prompt has no tokens")
        end_id = _input(request, "END_ID")
        pad_id = _input(request, "PAD_ID")
        end_ids = end_id.reshape(batch, 1).astype(np.int32) if end_id is not None else \
            np.full((batch, 1), self.tokenizer.end_id, dtype=np.int32)
        pad_ids = pad_id.reshape(batch, 1).astype(np.int32) if pad_id is not None else \
            np.full((batch, 1), self.tokenizer.pad_id, dtype=np.int32)
        return [
            pb_utils.Tensor("INPUT_ID", _padded(ids, int(pad_ids[0, 0]))),
            pb_utils.Tensor("REQUEST_INPUT_LEN", np.array([[len(row)] for row in ids], dtype=np.int32)),
            # Decoder inputs and embedding bias belong to encoder-decoder models and biasing,
            # neither of which the sandbox has: empty, as for a decoder-only model.
            pb_utils.Tensor("DECODER_INPUT_ID", np.zeros((batch, 0), dtype=np.int32)),
            pb_utils.Tensor("REQUEST_DECODER_INPUT_LEN", np.zeros((batch, 1), dtype=np.int32)),
            pb_utils.Tensor("BAD_WORDS_IDS", self._word_lists(_input(request, "BAD_WORDS_DICT"), batch)),
            pb_utils.Tensor("STOP_WORDS_IDS", self._word_lists(_input(request, "STOP_WORDS_DICT"), batch)),
            pb_utils.Tensor("EMBEDDING_BIAS", np.zeros((batch, 0), dtype=np.float32)),
            pb_utils.Tensor("REQUEST_OUTPUT_LEN", output_len.reshape(batch, -1).astype(np.int32)),
            pb_utils.Tensor("OUT_END_ID", end_ids),
            pb_utils.Tensor("OUT_PAD_ID", pad_ids),
        ]

    def _word_lists(self, phrases: np.ndarray | None, batch: int) -> np.ndarray:
        """TensorRT-LLM's word-list format, [batch, 2, width]: row 0 the phrases' token ids one after
        another, row 1 the end offset of each phrase; padded with 0 and -1."""
        items = [[] for _ in range(batch)] if phrases is None else \
            [[_text(phrase) for phrase in row if _text(phrase)] for row in phrases.reshape(batch, -1)]
        encoded = []
        for item in items:
            ids, offsets = [], []
            for phrase in item:
                ids += self.tokenizer.encode(phrase)
                offsets.append(len(ids))
            encoded.append((ids, offsets))
        width = max([1] + [len(ids) for ids, _ in encoded])
        return np.array([[ids + [0] * (width - len(ids)), offsets + [-1] * (width - len(offsets))]
                         for ids, offsets in encoded], dtype=np.int32)


class PostprocessingModel:
    def initialize(self, args):
        self.tokenizer = _tokenizer(args, "postprocessing")

    def execute(self, requests):
        responses = []
        for request in requests:
            tokens = _input(request, "TOKENS_BATCH")  # [batch, beam, tokens]
            lengths = _input(request, "SEQUENCE_LENGTH")  # [batch, beam]
            if tokens is None or lengths is None:
                responses.append(pb_utils.InferenceResponse(
                    error=pb_utils.TritonError("inputs TOKENS_BATCH and SEQUENCE_LENGTH are required")))
                continue
            lengths = lengths.reshape(tokens.shape[:2])
            texts = [[self.tokenizer.decode(beam[:length].tolist()).encode()
                      for beam, length in zip(beams, beam_lengths)]
                     for beams, beam_lengths in zip(tokens, lengths)]
            responses.append(pb_utils.InferenceResponse(
                output_tensors=[pb_utils.Tensor("OUTPUT", np.array(texts, dtype=np.object_))]))
        return responses
