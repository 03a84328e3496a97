"""`llmfleet model import`: real config.json files (tests/data/hf_configs, see SOURCES.md) as the
spec.model.architecture block, the same numbers as the catalog's entries, and refusals that name
the field."""

import json
from pathlib import Path

import pytest
import yaml

from llmfleet import exit_codes
from llmfleet.api import ModelArchitecture
from llmfleet.catalog import load_catalog
from llmfleet.cli import main
from llmfleet.planner.hf_config import UnrepresentableConfig, architecture_from_hf_config
from llmfleet.planner.spec_adapter import model_arch_from_architecture

CONFIGS = Path(__file__).parent / "data" / "hf_configs"
# config.json file -> the catalog entry it must reproduce.
CATALOG_TWINS = {
    "meta-llama--Meta-Llama-3.1-8B_config.json": "llama-3.1-8b",
    "mistralai--Mixtral-8x7B-v0.1_config.json": "mixtral-8x7b",
    "Qwen--Qwen3-30B-A3B_config.json": "qwen3-30b-a3b",
    "deepseek-ai--DeepSeek-V3_config.json": "deepseek-v3",
    "openai--gpt-oss-120b_config.json": "gpt-oss-120b",
    "meta-llama--Llama-4-Maverick-17B-128E-Instruct_config.json": "llama-4-maverick",
}
# The fields of ModelArch that decide every formula of the planner.
ARITHMETIC_FIELDS = (
    "num_layers", "hidden_size", "num_attention_heads", "num_kv_heads", "head_dim", "intermediate_size",
    "vocab_size", "num_experts", "experts_per_token", "tie_word_embeddings", "num_shared_experts",
    "expert_intermediate_size", "dense_first_layers", "moe_layer_interval", "kv_lora_rank", "qk_rope_head_dim",
    "qk_nope_head_dim", "v_head_dim", "q_lora_rank", "local_attention_window_tokens", "local_attention_kind",
    "full_attention_layer_interval",
)


def _config(name: str) -> dict:
    return json.loads((CONFIGS / name).read_text())


def _run(capsys, *argv):
    code = main(["model", "import", *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.parametrize(("filename", "catalog_name"), sorted(CATALOG_TWINS.items()))
def test_import_reproduces_the_catalog_entry(capsys, filename, catalog_name):
    code, out, _ = _run(capsys, str(CONFIGS / filename))
    assert code == exit_codes.OK
    block = yaml.safe_load(out)["architecture"]
    imported = model_arch_from_architecture(ModelArchitecture.model_validate(block))
    expected = load_catalog().model(catalog_name)
    for field in ARITHMETIC_FIELDS:
        got, want = getattr(imported, field), getattr(expected, field)
        # The catalog spells an expert FFN equal to the dense one as 0 (unset), as the API does.
        if field == "expert_intermediate_size":
            got, want = imported.expert_ffn_size, expected.expert_ffn_size
        assert got == want, (field, got, want)
    assert imported.total_params == expected.total_params
    assert imported.architecture_class == expected.architecture_class  # the serving release is checked by it


def test_deepseek_block_is_latent_attention_with_shared_experts_and_dense_first_layers(capsys):
    code, out, err = _run(capsys, str(CONFIGS / "deepseek-ai--DeepSeek-V3_config.json"))
    assert code == 0
    block = yaml.safe_load(out)["architecture"]
    assert block["latentAttention"] == {"kvLoraRank": 512, "qkRopeHeadDim": 64, "qkNopeHeadDim": 128,
                                        "vHeadDim": 128, "qLoraRank": 1536}
    assert (block["numSharedExperts"], block["expertIntermediateSize"], block["denseFirstLayers"]) == (1, 2048, 3)
    assert block["headDim"] == 192 and block["numKvHeads"] == 128
    assert "num_nextn_predict_layers" in err  # read, and said to be left out


def test_sliding_and_chunked_patterns(capsys):
    gpt_oss = architecture_from_hf_config(_config("openai--gpt-oss-120b_config.json")).architecture
    assert gpt_oss.local_attention.model_dump(by_alias=True, mode="json") == {
        "kind": "SlidingWindow", "windowTokens": 128, "fullAttentionLayerInterval": 2}
    maverick = architecture_from_hf_config(
        _config("meta-llama--Llama-4-Maverick-17B-128E-Instruct_config.json")).architecture
    assert maverick.local_attention.model_dump(by_alias=True, mode="json") == {
        "kind": "Chunked", "windowTokens": 8192, "fullAttentionLayerInterval": 4}
    assert maverick.moe_layer_interval == 2 and maverick.intermediate_size == 16384


def test_a_field_it_cannot_represent_exits_2_naming_it(capsys):
    code, out, err = _run(capsys, str(CONFIGS / "deepseek-ai--DeepSeek-V3.2_config.json"))
    assert code == exit_codes.BAD_INPUT
    assert out == ""
    assert "cannot represent index_topk" in err and "sparse attention" in err


@pytest.mark.parametrize(("mutate", "field"), [
    (lambda c: c.update(model_type="qwen3_next"), "model_type"),
    (lambda c: c.update(layer_types=["sliding_attention"] * 30 + ["full_attention"] * 6), "layer_types"),
    (lambda c: c.update(num_hidden_layers=0), "num_hidden_layers"),
    (lambda c: c.update(num_key_value_heads=7), "numKvHeads"),
])
def test_refusals_name_the_field(mutate, field):
    config = _config("openai--gpt-oss-120b_config.json")
    mutate(config)
    with pytest.raises(UnrepresentableConfig) as error:
        architecture_from_hf_config(config)
    assert field in error.value.field


@pytest.mark.parametrize(("mutate", "field"), [
    (lambda c: c.update(moe_layer_freq=2), "moe_layer_freq"),
    (lambda c: c.pop("kv_lora_rank"), "kv_lora_rank"),
])
def test_deepseek_refusals_name_the_field(mutate, field):
    config = _config("deepseek-ai--DeepSeek-V3_config.json")
    mutate(config)
    with pytest.raises(UnrepresentableConfig) as error:
        architecture_from_hf_config(config)
    assert error.value.field == field


def test_qwen_sliding_window_split_is_refused():
    config = _config("Qwen--Qwen3-30B-A3B_config.json")
    config["use_sliding_window"] = True
    with pytest.raises(UnrepresentableConfig, match="max_window_layers"):
        architecture_from_hf_config(config)


def test_unreadable_or_non_json_input_exits_2(capsys, tmp_path):
    assert _run(capsys, str(tmp_path / "missing.json"))[0] == exit_codes.BAD_INPUT
    bad = tmp_path / "config.json"
    bad.write_text("[1, 2]")
    code, _, err = _run(capsys, str(bad))
    assert code == exit_codes.BAD_INPUT and "expected one JSON object" in err
