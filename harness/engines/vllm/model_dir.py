"""Hugging Face model dirs for vLLM to run with generated weights: config.json and a tokenizer.

No weights are written: vLLM runs them with ``load_format="dummy"`` (or the plugin's
``commitbench_random``) and token-id prompts. Offline runs skip the tokenizer
(``skip_tokenizer_init=True``); the OpenAI server needs one to detokenize its stream, so every
dir also gets a word-level tokenizer with one token per id of the model's vocabulary
(``t0 t1 ...``): whatever ids the random weights emit decode, and nothing is downloaded. Qwen3.5 configs follow the
layout vLLM 0.26 ran on the H200 (``../shared/device/make_qwen35_config.py``):
the ``...ForConditionalGeneration`` architecture with a ``text_config`` and a
vision stub that ``language_model_only=True`` never builds.

    python -m harness.engines.vllm.model_dir conf/model/qwen35_35b.yaml OUT_DIR
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from ...model import ModelSpec

# Family constants not in conf/model (identical across the Qwen3.5 / Qwen3-Next sizes).
QWEN35_ROPE = {"mrope_interleaved": True, "mrope_section": [11, 11, 10], "partial_rotary_factor": 0.25,
               "rope_theta": 10000000, "rope_type": "default"}
QWEN35_TOKENS = {"bos_token_id": 248044, "eos_token_id": 248044, "image_token_id": 248056,
                 "video_token_id": 248057, "vision_start_token_id": 248053, "vision_end_token_id": 248054}


def _common(spec: ModelSpec) -> dict[str, Any]:
    g, at = spec.gdn, spec.attention
    cfg: dict[str, Any] = {
        "vocab_size": spec.vocab_size,
        "hidden_size": spec.hidden_size,
        "num_hidden_layers": spec.num_layers,
        "num_attention_heads": at["num_heads"],
        "num_key_value_heads": at["num_kv_heads"],
        "head_dim": at["head_dim"],
        "linear_conv_kernel_dim": g["conv_kernel"],
        "linear_key_head_dim": g["key_head_dim"],
        "linear_value_head_dim": g["value_head_dim"],
        "linear_num_key_heads": g["num_key_heads"],
        "linear_num_value_heads": g["num_value_heads"],
        "full_attention_interval": spec.full_attention_interval,
        "layer_types": ["full_attention" if (i + 1) % spec.full_attention_interval == 0 else "linear_attention"
                        for i in range(spec.num_layers)],
        "hidden_act": "silu",
        "rms_norm_eps": 1e-6,
        "max_position_embeddings": spec.max_position_embeddings,
        "tie_word_embeddings": spec.tie_word_embeddings,
        "mamba_ssm_dtype": spec.state_dtype,
        "dtype": spec.dtype,
    }
    m = spec.mlp
    if m["kind"] == "moe":
        cfg.update(num_experts=m["num_experts"], num_experts_per_tok=m["experts_per_token"],
                   moe_intermediate_size=m["expert_intermediate_size"],
                   shared_expert_intermediate_size=m["shared_expert_intermediate_size"],
                   norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[],
                   router_aux_loss_coef=0.001, output_router_logits=False)
    else:
        cfg.update(intermediate_size=m["intermediate_size"], num_experts=0)  # num_experts=0: Qwen3-Next dense
    return cfg


def hf_config(spec: ModelSpec) -> dict[str, Any]:
    """The config.json vLLM needs to build ``spec`` (with its MTP layer)."""
    text = _common(spec)
    if spec.architecture == "Qwen3NextForCausalLM":
        return {"architectures": [spec.architecture], "model_type": "qwen3_next", **text,
                "partial_rotary_factor": 0.25, "rope_theta": 10000.0, "attention_bias": False,
                "attention_dropout": 0.0, "num_nextn_predict_layers": spec.mtp["num_layers"],
                "bos_token_id": 1, "eos_token_id": 2, "initializer_range": 0.02, "use_cache": True}
    moe = spec.mlp["kind"] == "moe"
    text.update(model_type=spec.model_type or ("qwen3_5_moe_text" if moe else "qwen3_5_text"),
                attn_output_gate=bool(spec.attention.get("output_gate", True)),
                mtp_num_hidden_layers=spec.mtp["num_layers"], mtp_use_dedicated_embeddings=False,
                partial_rotary_factor=0.25, rope_parameters=QWEN35_ROPE, use_cache=True, pad_token_id=None,
                bos_token_id=QWEN35_TOKENS["bos_token_id"], eos_token_id=QWEN35_TOKENS["eos_token_id"])
    family = "qwen3_5_moe" if moe else "qwen3_5"
    return {
        "architectures": [spec.architecture], "model_type": family, **QWEN35_TOKENS,
        "tie_word_embeddings": spec.tie_word_embeddings, "dtype": spec.dtype, "text_config": text,
        # Only read to build the vision tower, which language_model_only=True skips.
        "vision_config": {"model_type": family, "depth": 27, "hidden_size": 1152, "intermediate_size": 4304,
                          "num_heads": 16, "in_channels": 3, "patch_size": 16, "spatial_merge_size": 2,
                          "temporal_patch_size": 2, "out_hidden_size": spec.hidden_size,
                          "num_position_embeddings": 2304, "hidden_act": "gelu_pytorch_tanh",
                          "deepstack_visual_indexes": []},
    }


def write_tokenizer(vocab_size: int, out: str | Path, eos_token_id: int | None = None) -> None:
    """A word-level tokenizer covering ids ``0..vocab_size-1`` (``tokenizer.json`` + config)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    out = Path(out)
    vocab = {f"t{i}": i for i in range(vocab_size)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")   # joins tokens with spaces
    tok.save(str(out / "tokenizer.json"))
    eos = f"t{eos_token_id}" if eos_token_id is not None and eos_token_id < vocab_size else None
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 1 << 20, "eos_token": eos,
        "unk_token": "t0", "clean_up_tokenization_spaces": False}, indent=2))


def write(spec: ModelSpec, out: str | Path, tokenizer: bool = True) -> Path:
    """Write ``out/config.json``, ``out/generation_config.json`` and (``tokenizer``) a tokenizer."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    cfg = hf_config(spec)
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    eos = cfg.get("eos_token_id", cfg.get("text_config", {}).get("eos_token_id"))
    (out / "generation_config.json").write_text(json.dumps({"eos_token_id": eos, "do_sample": False}, indent=2))
    if tokenizer:
        write_tokenizer(spec.vocab_size, out, eos)
    return out


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    out = write(ModelSpec.from_yaml(args[0]), args[1])
    print(f"wrote {out}/config.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
