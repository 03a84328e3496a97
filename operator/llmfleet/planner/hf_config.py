"""A Hugging Face `config.json` as the API's `spec.model.architecture` (`llmfleet model import`).

Each model family names its numbers differently; this module reads the families whose
architecture the planner can represent (see docs/planner.md, Architectures) and refuses, naming
the field, anything that would change the arithmetic in a way the architecture block cannot say.
Pure: the caller reads the file.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from llmfleet.api import LatentAttention, LocalAttention, LocalAttentionKind, ModelArchitecture
from llmfleet.catalog import model_from_numbers
from llmfleet.planner.spec_adapter import architecture_kind_numbers

GQA_FAMILIES = ("llama", "mistral", "mixtral", "qwen2", "qwen3", "qwen3_moe")
DEEPSEEK_FAMILIES = ("deepseek_v3", "deepseek_v32")
SUPPORTED_MODEL_TYPES = (*GQA_FAMILIES, *DEEPSEEK_FAMILIES, "gpt_oss", "llama4", "llama4_text")
# Llama 4's config leaves these out; the defaults are Llama4TextConfig's
# (huggingface/transformers@b17cfe48 src/transformers/models/llama4/configuration_llama4.py).
LLAMA4_DEFAULT_NO_ROPE_LAYER_INTERVAL = 4
LLAMA4_DEFAULT_ATTENTION_CHUNK_SIZE = 8192
LLAMA4_SHARED_EXPERTS = 1  # Llama4TextMoe: one shared expert beside the routed ones


class UnrepresentableConfig(ValueError):
    """A config.json field the architecture block cannot represent, or a required one missing."""

    def __init__(self, field: str, reason: str):
        super().__init__(f"{field}: {reason}")
        self.field = field


@dataclass(frozen=True)
class ImportedArchitecture:
    architecture: ModelArchitecture
    # Fields read but left out of the plan, each with why (for the user to judge).
    ignored: tuple[str, ...]


def _required_int(config: Mapping[str, Any], field: str) -> int:
    value = config.get(field)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise UnrepresentableConfig(field, f"needs a positive integer, got {value!r}")
    return value


def _optional_int(config: Mapping[str, Any], field: str, default: int) -> int:
    return default if config.get(field) is None else _required_int(config, field)


def _full_attention_interval(layer_types: Sequence[str], local_type: str, field: str) -> int | None:
    """The n for which exactly every n-th layer (counting from 1) is full attention, None when every
    layer is local; anything else is a pattern the architecture block cannot say."""
    allowed = {local_type, "full_attention"}
    unknown = sorted(set(layer_types) - allowed)
    if unknown:
        raise UnrepresentableConfig(field, f"layer kinds {unknown} are neither {local_type} nor full_attention")
    full = [index + 1 for index, kind in enumerate(layer_types) if kind == "full_attention"]
    if not full:
        return None
    interval = full[0]
    if interval < 2 or full != list(range(interval, len(layer_types) + 1, interval)):
        raise UnrepresentableConfig(field, "full-attention layers are not exactly every n-th layer (n >= 2), "
                                           "the only interleaving spec.model.architecture.localAttention can say")
    return interval


def _refuse_present(config: Mapping[str, Any], fields: Mapping[str, str]) -> None:
    for field, reason in fields.items():
        if config.get(field) not in (None, [], False):
            raise UnrepresentableConfig(field, reason)


def _deepseek(config: Mapping[str, Any], numbers: dict[str, Any], ignored: list[str]) -> dict[str, Any]:
    _refuse_present(config, {
        "index_topk": "DeepSeek sparse attention (an indexer picks index_topk tokens per query and keeps a "
                      "key cache of its own) is not representable; only dense multi-head latent attention is",
    })
    if _optional_int(config, "moe_layer_freq", 1) != 1:
        raise UnrepresentableConfig("moe_layer_freq", "experts on every n-th layer counted DeepSeek's way "
                                                      "(layer % n == 0) is not representable; only 1 is")
    if config.get("num_nextn_predict_layers"):
        ignored.append(f"num_nextn_predict_layers {config['num_nextn_predict_layers']}: the multi-token-"
                       "prediction module serves only speculative decoding, not planned")
    numbers["num_kv_heads"] = numbers["num_attention_heads"]  # every head expands its own K and V
    numbers["head_dim"] = _required_int(config, "qk_nope_head_dim") + _required_int(config, "qk_rope_head_dim")
    q_lora_rank = config.get("q_lora_rank")
    latent = LatentAttention(
        kv_lora_rank=_required_int(config, "kv_lora_rank"), qk_rope_head_dim=_required_int(config, "qk_rope_head_dim"),
        qk_nope_head_dim=_required_int(config, "qk_nope_head_dim"), v_head_dim=_required_int(config, "v_head_dim"),
        q_lora_rank=None if q_lora_rank is None else _required_int(config, "q_lora_rank"))
    extra: dict[str, Any] = {"latent_attention": latent}
    if config.get("n_routed_experts"):
        extra.update(num_experts=_required_int(config, "n_routed_experts"),
                     experts_per_token=_required_int(config, "num_experts_per_tok"),
                     expert_intermediate_size=_required_int(config, "moe_intermediate_size"))
        if config.get("n_shared_experts"):
            extra["num_shared_experts"] = _required_int(config, "n_shared_experts")
        if config.get("first_k_dense_replace"):
            extra["dense_first_layers"] = _required_int(config, "first_k_dense_replace")
    return extra


def _qwen_and_mistral(model_type: str, config: Mapping[str, Any]) -> dict[str, Any]:
    extra: dict[str, Any] = {}
    window = config.get("sliding_window")
    if model_type.startswith("qwen"):
        # Qwen configs carry a sliding_window that is off unless use_sliding_window is set, and then
        # applies from layer max_window_layers on: a split localAttention cannot say.
        _refuse_present(config, {"use_sliding_window": "Qwen's sliding window from layer max_window_layers on is "
                                                       "not representable; only every-n-th-layer interleaving is"})
        window = None
    if window is not None:
        extra["local_attention"] = LocalAttention(kind=LocalAttentionKind.SLIDING_WINDOW,
                                                  window_tokens=_required_int(config, "sliding_window"))
    if model_type == "mixtral":
        extra.update(num_experts=_required_int(config, "num_local_experts"),
                     experts_per_token=_required_int(config, "num_experts_per_tok"))
    if model_type == "qwen3_moe":
        _refuse_present(config, {"mlp_only_layers": "dense layers at arbitrary positions are not representable; "
                                                    "only leading dense layers and every-n-th-layer experts are"})
        extra.update(num_experts=_required_int(config, "num_experts"),
                     experts_per_token=_required_int(config, "num_experts_per_tok"),
                     expert_intermediate_size=_required_int(config, "moe_intermediate_size"))
        if _optional_int(config, "decoder_sparse_step", 1) > 1:
            extra["moe_layer_interval"] = config["decoder_sparse_step"]
    return extra


def _gpt_oss(config: Mapping[str, Any], numbers: dict[str, Any], ignored: list[str]) -> dict[str, Any]:
    ignored.append("attention and expert biases, attention sinks: under 0.1 % of the weights, not counted")
    layer_types = config.get("layer_types")
    if not isinstance(layer_types, list) or len(layer_types) != numbers["num_layers"]:
        raise UnrepresentableConfig("layer_types", "needs one entry per layer (sliding_attention or full_attention)")
    interval = _full_attention_interval(layer_types, "sliding_attention", "layer_types")
    return dict(
        num_experts=_required_int(config, "num_local_experts"),
        experts_per_token=_required_int(config, "num_experts_per_tok"),
        local_attention=LocalAttention(kind=LocalAttentionKind.SLIDING_WINDOW,
                                       window_tokens=_required_int(config, "sliding_window"),
                                       full_attention_layer_interval=interval),
    )


def _llama4(config: Mapping[str, Any], numbers: dict[str, Any]) -> dict[str, Any]:
    layers = numbers["num_layers"]
    no_rope_layers = config.get("no_rope_layers")
    if no_rope_layers:
        # 1: a rope layer with chunked attention; 0: a NoPE layer with full attention.
        layer_types = ["chunked_attention" if rope else "full_attention" for rope in no_rope_layers]
        interval = _full_attention_interval(layer_types, "chunked_attention", "no_rope_layers")
    else:
        interval = _optional_int(config, "no_rope_layer_interval", LLAMA4_DEFAULT_NO_ROPE_LAYER_INTERVAL)
    step = _optional_int(config, "interleave_moe_layer_step", 1)
    moe_layers = config.get("moe_layers")
    if moe_layers is not None and list(moe_layers) != list(range(step - 1, layers, step)):
        raise UnrepresentableConfig("moe_layers", "experts on layers other than every n-th are not representable")
    # Llama 4 names the experts' FFN intermediate_size and the dense layers' intermediate_size_mlp.
    numbers["intermediate_size"] = _required_int(config, "intermediate_size_mlp")
    extra: dict[str, Any] = dict(
        num_experts=_required_int(config, "num_local_experts"),
        experts_per_token=_required_int(config, "num_experts_per_tok"),
        num_shared_experts=LLAMA4_SHARED_EXPERTS,
        expert_intermediate_size=_required_int(config, "intermediate_size"),
        local_attention=LocalAttention(
            kind=LocalAttentionKind.CHUNKED,
            window_tokens=_optional_int(config, "attention_chunk_size", LLAMA4_DEFAULT_ATTENTION_CHUNK_SIZE),
            full_attention_layer_interval=interval),
    )
    if step > 1:
        extra["moe_layer_interval"] = step
    return extra


def architecture_from_hf_config(config: Mapping[str, Any]) -> ImportedArchitecture:
    """The architecture block of a config.json, or UnrepresentableConfig naming the field."""
    model_type = config.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise UnrepresentableConfig("model_type", f"{model_type!r} is not a family this import reads "
                                                  f"({', '.join(SUPPORTED_MODEL_TYPES)}); write "
                                                  "spec.model.architecture by hand from its config")
    ignored: list[str] = []
    # The class the runtime loads, named by the outer config (a llama4's text_config names none).
    classes = config.get("architectures")
    if model_type == "llama4":
        # Multimodal wrapper: the language model is text_config; the vision encoder is not planned.
        ignored.append("vision_config: the vision encoder is not planned")
        config = config.get("text_config") or {}
        if not isinstance(config, Mapping) or not config:
            raise UnrepresentableConfig("text_config", "missing; a llama4 config holds its language model there")
        model_type = "llama4_text"
    heads = _required_int(config, "num_attention_heads")
    numbers: dict[str, Any] = dict(
        num_layers=_required_int(config, "num_hidden_layers"),
        hidden_size=_required_int(config, "hidden_size"),
        num_attention_heads=heads,
        num_kv_heads=_optional_int(config, "num_key_value_heads", heads),
        vocab_size=_required_int(config, "vocab_size"),
        intermediate_size=_required_int(config, "intermediate_size"),
    )
    if config.get("head_dim") is not None:
        numbers["head_dim"] = _required_int(config, "head_dim")
    elif numbers["hidden_size"] % heads:
        raise UnrepresentableConfig("head_dim", "missing, and hidden_size is not a multiple of num_attention_heads")
    else:
        numbers["head_dim"] = numbers["hidden_size"] // heads
    if model_type in DEEPSEEK_FAMILIES:
        extra = _deepseek(config, numbers, ignored)
    elif model_type == "gpt_oss":
        extra = _gpt_oss(config, numbers, ignored)
    elif model_type == "llama4_text":
        extra = _llama4(config, numbers)
    else:
        extra = _qwen_and_mistral(model_type, config)
    if isinstance(classes, list) and classes and isinstance(classes[0], str):
        numbers["model_class"] = classes[0]
    try:
        draft = ModelArchitecture(**numbers, **extra, parameter_count_billions=1.0)
    except ValidationError as error:
        first = error.errors()[0]
        field = ".".join(map(str, first["loc"])) + ((first.get("ctx") or {}).get("field_path") or "")
        raise UnrepresentableConfig(field.lstrip(".") or "config", first["msg"]) from None
    model = model_from_numbers(
        name=str(model_type), num_layers=draft.num_layers, hidden_size=draft.hidden_size,
        num_attention_heads=draft.num_attention_heads, num_kv_heads=draft.num_kv_heads, head_dim=draft.head_dim,
        intermediate_size=draft.intermediate_size, vocab_size=draft.vocab_size,
        num_experts=draft.num_experts or 1, experts_per_token=draft.experts_per_token or 1,
        tie_word_embeddings=bool(config.get("tie_word_embeddings", False)), **architecture_kind_numbers(draft))
    # The API states the parameter count (it tells tied from untied output heads): derive it.
    architecture = draft.model_copy(update={"parameter_count_billions": round(model.total_params / 1e9, 4)})
    return ImportedArchitecture(architecture=architecture, ignored=tuple(ignored))
