"""conf/model/*.yaml: consistent with the published sizes and with what vLLM allocated on the H200."""

import pytest

from harness.config import load_model

GiB = 1024 ** 3


@pytest.mark.parametrize("name", ["qwen35_9b", "qwen35_35b", "qwen35_397b"])
def test_parameter_count_matches_the_published_size(name):
    m = load_model(name)
    total, active = m.num_params(), m.num_params(active=True)
    assert abs(total / m.params_published - 1) < 0.03, f"{total / 1e9:.2f}B vs {m.params_published / 1e9}B"
    # Active sizes are rounded names ("A3B" for 3.45B with embeddings): a looser check.
    assert abs(active / m.active_params_published - 1) < 0.2, f"{active / 1e9:.2f}B active"


def test_35b_weights_match_the_dummy_weights_vllm_allocated():
    # ../shared/device/README.md: dummy weights of the 35B-A3B shape took 64.7 GiB, 66.3 GiB with MTP.
    m = load_model("qwen35_35b")
    assert abs(m.weight_bytes(mtp=False) / GiB - 64.7) < 0.3
    assert abs(m.weight_bytes(mtp=True) / GiB - 66.3) < 0.3


@pytest.mark.parametrize("name, gdn, attn", [("qwen35_9b", 24, 8), ("qwen35_35b", 30, 10),
                                             ("qwen35_397b", 45, 15)])
def test_layer_split(name, gdn, attn):
    m = load_model(name)
    assert (m.gdn["num_layers"], m.attention["num_layers"]) == (gdn, attn)
    assert m.state_dtype == "float32"


def test_kv_bytes_per_token():
    m = load_model("qwen35_35b")
    assert m.kv_bytes_per_token() == 10 * 2 * 2 * 256 * 2  # layers x (K, V) x kv heads x head_dim x bf16


def test_unknown_model_names_the_choices():
    with pytest.raises(ValueError, match="model=qwen9: no conf/model/qwen9.yaml; choose one of qwen35_35b"):
        load_model("qwen9")


def test_inconsistent_spec_is_refused():
    from omegaconf import OmegaConf

    from harness.config import conf_dir

    cfg = OmegaConf.load(conf_dir() / "model" / "qwen35_35b.yaml")
    cfg.architecture = "LlamaForCausalLM"
    with pytest.raises(ValueError, match="architecture='LlamaForCausalLM'; supported"):
        load_model(cfg)
    cfg.architecture = "Qwen3_5MoeForConditionalGeneration"
    cfg.gdn.num_layers = 29
    with pytest.raises(ValueError, match=r"gdn.num_layers=29 \+ attention.num_layers=10 != num_layers=40"):
        load_model(cfg)


def test_every_spec_loads_with_pyyaml_alone():
    from harness.config import conf_dir
    from harness.model import ModelSpec

    for path in sorted((conf_dir() / "model").glob("*.yaml")):
        assert ModelSpec.from_yaml(path) == load_model(path.stem)
