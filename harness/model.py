"""Model specs from ``conf/model/*.yaml``: the architecture values a sweep needs.

Parameter counts follow the Qwen3.5 / Qwen3-Next layer layout as vLLM builds it:
gated attention (q_proj emits query and gate), Gated DeltaNet (``in_proj_qkvz``,
``in_proj_ba``, depthwise conv, ``A_log``/``dt_bias``, gated RMSNorm, ``out_proj``),
SwiGLU MLP or MoE (router, routed experts, shared expert and its gate), one MTP layer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from strategies import GDNShape, as_dtype, dtype_bytes

#: ``model_type`` of each family's language model, as vLLM / transformers name it.
FAMILIES = {"Qwen3NextForCausalLM": "qwen3_next", "Qwen3_5MoeForConditionalGeneration": "qwen3_5_moe_text",
            "Qwen3_5ForConditionalGeneration": "qwen3_5_text"}


@dataclass(frozen=True)
class ModelSpec:
    name: str
    display_name: str
    hf_id: str
    architecture: str
    dtype: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    full_attention_interval: int
    max_position_embeddings: int
    tie_word_embeddings: bool
    gdn: Mapping[str, Any]
    attention: Mapping[str, Any]
    mlp: Mapping[str, Any]
    mtp: Mapping[str, Any]
    params_published: float | None
    active_params_published: float | None
    model_type: str = ""

    @classmethod
    def from_yaml(cls, path) -> "ModelSpec":
        """From a ``conf/model/*.yaml`` file with PyYAML only (the engine side has no Hydra)."""
        import yaml

        with open(path) as f:
            return cls.from_config(yaml.safe_load(f))

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any]) -> "ModelSpec":
        fields = cls.__dataclass_fields__
        missing = [f for f, fd in fields.items() if f not in cfg and f != "model_type"]
        if missing:
            raise ValueError(f"model={cfg.get('name', '?')}: config misses {missing}; "
                             "see conf/model/qwen35_35b.yaml for the full set of fields")
        spec = cls(**{f: _plain(cfg[f]) for f in fields if f in cfg})
        spec._validate()
        return spec

    def _validate(self) -> None:
        g, a = self.gdn["num_layers"], self.attention["num_layers"]
        if g + a != self.num_layers:
            raise ValueError(f"model={self.name}: gdn.num_layers={g} + attention.num_layers={a} "
                             f"!= num_layers={self.num_layers}")
        if self.num_layers // self.full_attention_interval != a:
            raise ValueError(f"model={self.name}: full_attention_interval={self.full_attention_interval} "
                             f"gives {self.num_layers // self.full_attention_interval} attention layers, not {a}")
        if self.architecture not in FAMILIES:
            raise ValueError(f"model={self.name}: architecture={self.architecture!r}; supported: {', '.join(FAMILIES)}")
        if self.mlp.get("kind") not in ("dense", "moe"):
            raise ValueError(f"model={self.name}: mlp.kind={self.mlp.get('kind')!r}; must be dense or moe")
        as_dtype(self.gdn["state_dtype"])
        self.gdn_shape()

    # -- GDN state ----------------------------------------------------------
    def gdn_shape(self) -> GDNShape:
        return GDNShape.from_config(self.gdn)

    @property
    def state_dtype(self) -> str:
        """How vLLM holds the recurrent state (the config's ``mamba_ssm_dtype``)."""
        return str(self.gdn["state_dtype"])

    # -- parameters ---------------------------------------------------------
    def _attention_params(self) -> int:
        h, at = self.hidden_size, self.attention
        q_out = at["num_heads"] * at["head_dim"] * (2 if at.get("output_gate") else 1)
        kv_out = 2 * at["num_kv_heads"] * at["head_dim"]
        o_in = at["num_heads"] * at["head_dim"]
        return h * (q_out + kv_out) + o_in * h + 2 * at["head_dim"]  # + q_norm, k_norm

    def _gdn_params(self) -> int:
        h, s = self.hidden_size, self.gdn_shape()
        HK, HVV = s.num_key_heads * s.key_head_dim, s.num_value_heads * s.value_head_dim
        qkvz = h * (2 * HK + 2 * HVV)
        ba = h * 2 * s.num_value_heads
        conv = s.conv_dim * s.conv_kernel
        return qkvz + ba + conv + 2 * s.num_value_heads + s.value_head_dim + HVV * h

    def _mlp_params(self, active: bool) -> int:
        h, m = self.hidden_size, self.mlp
        if m["kind"] == "dense":
            return 3 * h * m["intermediate_size"]
        experts = m["experts_per_token"] if active else m["num_experts"]
        return (h * m["num_experts"] + experts * 3 * h * m["expert_intermediate_size"]
                + 3 * h * m["shared_expert_intermediate_size"] + h)

    def _layer_params(self, attention: bool, active: bool) -> int:
        mixer = self._attention_params() if attention else self._gdn_params()
        return mixer + self._mlp_params(active) + 2 * self.hidden_size

    def num_params(self, active: bool = False, mtp: bool = False) -> int:
        """Parameters of the language model (``active``: routed experts counted at top-k only)."""
        h = self.hidden_size
        embed = self.vocab_size * h * (1 if self.tie_word_embeddings else 2)
        layers = (self.attention["num_layers"] * self._layer_params(True, active)
                  + self.gdn["num_layers"] * self._layer_params(False, active))
        total = embed + layers + h
        if mtp:
            # fc(2h -> h), two pre-norms, one full-attention layer, a final norm; embeddings shared.
            total += self.mtp["num_layers"] * (2 * h * h + 3 * h + self._layer_params(True, active))
        return total

    def weight_bytes(self, mtp: bool = True) -> int:
        """Weights in the model dtype, as dummy-weight loading allocates them."""
        return self.num_params(mtp=mtp) * dtype_bytes(self.dtype)

    def kv_bytes_per_token(self, dtype: str | None = None) -> int:
        """Full-attention KV cache per token, every attention layer (K and V)."""
        at = self.attention
        return (self.attention["num_layers"] * 2 * at["num_kv_heads"] * at["head_dim"]
                * dtype_bytes(dtype or self.dtype))


def _plain(x: Any) -> Any:
    """OmegaConf containers → plain dicts/lists (frozen specs must not alias the config)."""
    try:
        from omegaconf import DictConfig, ListConfig, OmegaConf
    except ImportError:  # pragma: no cover - hydra is a hard dependency
        return x
    if isinstance(x, (DictConfig, ListConfig)):
        return OmegaConf.to_container(x, resolve=True)
    return x
