"""A small Qwen3-Next and its MTP layer in plain torch: the network vLLM runs from the same weights.

The target is transformers' ``Qwen3NextForCausalLM`` (Gated DeltaNet and gated full-attention layers
in the 3:1 pattern, its torch fallbacks for the delta rule and the causal conv). The MTP layer is
written here the way vLLM's ``Qwen3NextMultiTokenPredictor`` computes it (vLLM 0.26 and 0.32 alike):

    x = fc([pre_fc_norm_embedding(embed(t_{j+1})), pre_fc_norm_hidden(h_j)])     # [2*hidden] -> [hidden]
    h'_j = norm(decoder_layer(x))          # one full-attention layer at position j (causal over the MTP's inputs)
    draft = argmax(lm_head(h'_j))          # embed and lm_head shared with the target

``h_j`` is the target's last hidden state after its final norm; a chain's later drafts feed the MTP
its own ``h'`` and its previous draft (vLLM's EAGLE-style proposer). The weights are one Hugging Face
model dir (``model.safetensors`` with the target's names plus ``mtp.*``, ``config.json`` with
``num_nextn_predict_layers: 1``), which vLLM loads with ``load_format=auto``.

    net = load("results/trained-qwen3next/model")                  # float32

Its reference decoding (greedy, and speculative with the MTP chain) is :mod:`.reference`.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import nn

WEIGHTS = "model.safetensors"


def _transformers():
    try:
        import transformers
    except ImportError:
        raise ImportError("the trained Qwen3-Next needs transformers (and safetensors): install vLLM's requirements "
                          "as the README's test command does (pip install -r "
                          "harness/engines/vllm/requirements-cpu.txt)") from None
    return transformers


def hf_config(shape: dict[str, Any]):
    """transformers' ``Qwen3NextConfig`` for a shape from ``conf/acceptance_train.yaml: model`` (the layer pattern
    from ``full_attention_interval``; MoE, which vLLM's Qwen3-Next requires in at least one layer)."""
    Qwen3NextConfig = _transformers().Qwen3NextConfig

    n, every = int(shape["num_layers"]), int(shape["full_attention_interval"])
    return Qwen3NextConfig(
        vocab_size=int(shape["vocab_size"]), hidden_size=int(shape["hidden_size"]), num_hidden_layers=n,
        num_attention_heads=int(shape["num_heads"]), num_key_value_heads=int(shape["num_kv_heads"]),
        head_dim=int(shape["head_dim"]), linear_conv_kernel_dim=int(shape["conv_kernel"]),
        linear_key_head_dim=int(shape["key_head_dim"]), linear_value_head_dim=int(shape["value_head_dim"]),
        linear_num_key_heads=int(shape["num_key_heads"]), linear_num_value_heads=int(shape["num_value_heads"]),
        num_experts=int(shape["num_experts"]), num_experts_per_tok=int(shape["experts_per_token"]),
        moe_intermediate_size=int(shape["expert_intermediate_size"]),
        shared_expert_intermediate_size=int(shape["shared_expert_intermediate_size"]),
        intermediate_size=int(shape["shared_expert_intermediate_size"]), norm_topk_prob=True,
        decoder_sparse_step=1, mlp_only_layers=[], router_aux_loss_coef=0.0, full_attention_interval=every,
        layer_types=["full_attention" if (i + 1) % every == 0 else "linear_attention" for i in range(n)],
        max_position_embeddings=int(shape["max_position_embeddings"]), tie_word_embeddings=False,
        partial_rotary_factor=0.25, rope_theta=10000.0, rms_norm_eps=1e-6, hidden_act="silu",
        bos_token_id=int(shape["eos_token_id"]), eos_token_id=int(shape["eos_token_id"]),
        pad_token_id=None, num_nextn_predict_layers=1,
        mamba_ssm_dtype="float32")      # vLLM's GDN state pages in float32, as Qwen3.5's configs ask


class MTP(nn.Module):
    """vLLM's Qwen3-Next MTP layer (one predictor layer; embed and lm_head are the target's)."""

    def __init__(self, config):
        super().__init__()
        from transformers.models.qwen3_next.modeling_qwen3_next import (Qwen3NextDecoderLayer, Qwen3NextRMSNorm,
                                                                         Qwen3NextRotaryEmbedding)

        d = config.hidden_size
        full = config.layer_types.index("full_attention")      # a full-attention layer index: the MTP's kind
        self.fc = nn.Linear(2 * d, d, bias=False)
        self.pre_fc_norm_embedding = Qwen3NextRMSNorm(d, eps=config.rms_norm_eps)
        self.pre_fc_norm_hidden = Qwen3NextRMSNorm(d, eps=config.rms_norm_eps)
        self.layers = nn.ModuleList([Qwen3NextDecoderLayer(config, full)])
        self.norm = Qwen3NextRMSNorm(d, eps=config.rms_norm_eps)
        self.rotary = Qwen3NextRotaryEmbedding(config)

    def forward(self, embeds: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """embeds, hidden: [B, T, d] (the next tokens' embeddings, the hidden states at their predecessors);
        positions: [B, T]. Returns h': [B, T, d] after the MTP's norm (causal over T)."""
        x = self.fc(torch.cat([self.pre_fc_norm_embedding(embeds), self.pre_fc_norm_hidden(hidden)], dim=-1))
        x = self.layers[0](x, position_embeddings=self.rotary(x, positions), position_ids=positions)
        return self.norm(x)


class TrainedQwen3Next(nn.Module):
    """The target (``self.target``, transformers' Qwen3NextForCausalLM) and its MTP layer (``self.mtp``)."""

    def __init__(self, config):
        super().__init__()
        from transformers import Qwen3NextForCausalLM

        self.config = config
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()     # its notes that fla / causal_conv1d are missing: the torch fallbacks
        with warnings.catch_warnings():      # are the point here
            warnings.simplefilter("ignore")
            self.target = Qwen3NextForCausalLM(config)
        self.mtp = MTP(config)
        for module in self.mtp.modules():           # transformers initialises only the modules it built
            self.target._init_weights(module)

    def hidden(self, ids: torch.Tensor) -> torch.Tensor:
        """ids: [B, T] -> the target's last hidden states after its final norm: [B, T, d]."""
        return self.target.model(input_ids=ids, use_cache=False).last_hidden_state

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.target.lm_head(hidden)

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        return self.target.model.embed_tokens(ids)

    def state_dict_hf(self) -> dict[str, torch.Tensor]:
        """The checkpoint's tensors under the names vLLM's loaders read: ``mtp.`` for the MTP layer, one
        ``experts.{e}.{gate,up,down}_proj.weight`` per expert (transformers keeps them fused in memory)."""
        out = dict(self.target.state_dict())
        out.update({f"mtp.{k}": v for k, v in self.mtp.state_dict().items() if not k.startswith("rotary.")})
        return split_experts(out)


def split_experts(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """transformers' fused ``experts.gate_up_proj`` [E, 2I, d] / ``experts.down_proj`` [E, d, I] as the
    checkpoint layout: ``experts.{e}.gate_proj.weight`` [I, d] (the first half), ``up_proj`` (the second),
    ``down_proj`` [d, I]."""
    out = {}
    for name, t in tensors.items():
        if name.endswith("experts.gate_up_proj"):
            stem, half = name[:-len("gate_up_proj")], t.shape[1] // 2
            for e in range(t.shape[0]):
                out[f"{stem}{e}.gate_proj.weight"] = t[e, :half]
                out[f"{stem}{e}.up_proj.weight"] = t[e, half:]
        elif name.endswith("experts.down_proj"):
            stem = name[:-len("down_proj")]
            for e in range(t.shape[0]):
                out[f"{stem}{e}.down_proj.weight"] = t[e]
        else:
            out[name] = t
    return out


def fuse_experts(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``split_experts`` undone."""
    import re

    out, parts = {}, {}
    for name, t in tensors.items():
        m = re.fullmatch(r"(.*experts\.)(\d+)\.(gate|up|down)_proj\.weight", name)
        if m:
            parts.setdefault(m.group(1), {})[(int(m.group(2)), m.group(3))] = t
        else:
            out[name] = t
    for stem, p in parts.items():
        n = 1 + max(e for e, _ in p)
        out[stem + "gate_up_proj"] = torch.stack([torch.cat([p[(e, "gate")], p[(e, "up")]]) for e in range(n)])
        out[stem + "down_proj"] = torch.stack([p[(e, "down")] for e in range(n)])
    return out


def _config_dict(config) -> dict[str, Any]:
    d = config.to_dict()
    d.update(architectures=["Qwen3NextForCausalLM"], model_type="qwen3_next", num_nextn_predict_layers=1)
    return d


def save(net: TrainedQwen3Next, out: Path, dtype: torch.dtype = torch.bfloat16, extra: dict | None = None) -> None:
    """``out``/config.json and model.safetensors (tensors in ``dtype``, contiguous, names sorted)."""
    from safetensors.torch import save_file

    from ..store import atomic_file, atomic_write

    out.mkdir(parents=True, exist_ok=True)
    cfg = _config_dict(net.config)
    cfg["torch_dtype"] = cfg["dtype"] = str(dtype).removeprefix("torch.")
    if extra:
        cfg.update(extra)
    tensors = {k: v.detach().to(dtype).contiguous() for k, v in sorted(net.state_dict_hf().items())}
    with atomic_file(out / WEIGHTS) as tmp:
        save_file(tensors, str(tmp), metadata={"format": "pt"})
    atomic_write(out / "config.json", json.dumps(cfg, indent=1, sort_keys=True) + "\n")


def load(model_dir: str | Path, dtype: torch.dtype = torch.float32) -> TrainedQwen3Next:
    """The network of a model dir ``save`` wrote, its weights cast to ``dtype`` (float32: the bf16 weights
    computed in float32, the reference vLLM's bf16 arithmetic is compared with; transformers' grouped expert
    matmul takes no float64)."""
    Qwen3NextConfig = _transformers().Qwen3NextConfig
    from safetensors.torch import load_file

    model_dir = Path(model_dir)
    if not (model_dir / WEIGHTS).is_file():
        raise FileNotFoundError(f"{model_dir}: no {WEIGHTS}; train it with `python -m harness acceptance train`")
    cfg = json.loads((model_dir / "config.json").read_text())
    config = Qwen3NextConfig(**{k: v for k, v in cfg.items() if k not in ("architectures", "model_type")})
    net = TrainedQwen3Next(config)
    tensors = fuse_experts(load_file(str(model_dir / WEIGHTS)))
    target = {k: v for k, v in tensors.items() if not k.startswith("mtp.")}
    mtp = {k[4:]: v for k, v in tensors.items() if k.startswith("mtp.")}
    missing, unexpected = net.target.load_state_dict(target, strict=False)
    missing = [m for m in missing if "rotary" not in m]
    m2, u2 = net.mtp.load_state_dict(mtp, strict=False)
    missing += [f"mtp.{m}" for m in m2 if not m.startswith("rotary.")]
    if missing or unexpected or u2:
        raise ValueError(f"{model_dir / WEIGHTS}: missing {missing[:5]}, unexpected {(unexpected + u2)[:5]}")
    return net.to(dtype).eval()
