"""A tiny GDN hybrid in plain PyTorch, for the acceptance gate: Qwen3.5's block pattern on a CPU budget.

Each block is three Gated DeltaNet layers and one full-attention layer (pre-RMSNorm, SwiGLU MLP,
residuals). A GDN layer projects q, k (H heads), v (HV heads), the gates a, b and an output gate
z; runs q, k, v through a short depthwise causal conv with SiLU; L2-normalises q and k; takes
``g = −exp(A_log)·softplus(a + dt_bias)``, ``beta = sigmoid(b)``; and runs the delta rule — through
a ``strategies`` strategy, or the literal recurrence (``gdn=None``, the oracle). Attention
verifies a draft tree with a tree mask: a node sees the committed prefix and its own ancestors.
Weights are random from a seed; every tensor lives in one dtype (float64, float32 or bfloat16).

    model = TinyHybrid(TinyConfig(), dtype=torch.float64)
    cache = model.prefill(prompt_ids, gdn=strategies.get("treewy"))
    logits = model.verify(cache, node_tokens, tree)        # [N, vocab], keeps the tree pending
    model.commit(cache, accepted_node)                     # the accepted path joins the cache
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from strategies import DraftTree, Strategy, accepted_state, tree_recurrence


@dataclass(frozen=True)
class TinyConfig:
    vocab: int = 256
    hidden: int = 64
    blocks: int = 1              # each: 3 GDN layers + 1 attention layer
    key_heads: int = 2           # H
    value_heads: int = 4         # HV
    head_k: int = 16             # K
    head_v: int = 16             # V
    conv: int = 4
    attn_heads: int = 4
    attn_head_dim: int = 16
    mlp: int = 128
    logit_scale: float = 4.0     # sharpens the LM head so greedy choices are rarely near ties
    seed: int = 0

    @property
    def layer_kinds(self) -> list[str]:
        return ["gdn", "gdn", "gdn", "attn"] * self.blocks


def _init(cfg: TinyConfig, gen: torch.Generator, noise: float = 0.0, base: dict | None = None) -> dict[str, Any]:
    """Weights ~ N(0, 1/fan_in); with ``base``, a copy of it plus relative noise (the drafter)."""
    def mat(name, rows, cols, scale=1.0):
        if base is not None:
            w = base[name]
            return w + noise * w.std() * torch.randn(w.shape, generator=gen, dtype=torch.float64)
        return scale * torch.randn(rows, cols, generator=gen, dtype=torch.float64) / cols ** 0.5

    d, H, HV, K, V = cfg.hidden, cfg.key_heads, cfg.value_heads, cfg.head_k, cfg.head_v
    C = 2 * H * K + HV * V
    p: dict[str, Any] = {"embed": mat("embed", cfg.vocab, d, scale=d ** 0.5),
                         "lm_head": mat("lm_head", cfg.vocab, d, scale=cfg.logit_scale)}
    for i, kind in enumerate(cfg.layer_kinds):
        pre = f"l{i}."
        if kind == "gdn":
            p[pre + "qkv"] = mat(pre + "qkv", C, d)
            p[pre + "z"] = mat(pre + "z", HV * V, d)
            p[pre + "ab"] = mat(pre + "ab", 2 * HV, d)
            p[pre + "conv"] = mat(pre + "conv", C, cfg.conv, scale=cfg.conv ** 0.5)
            p[pre + "o"] = mat(pre + "o", d, HV * V)
            p[pre + "A_log"] = base[pre + "A_log"] if base else torch.log(torch.linspace(1, 8, HV, dtype=torch.float64))
            p[pre + "dt_bias"] = base[pre + "dt_bias"] if base else torch.zeros(HV, dtype=torch.float64)
        else:
            hd = cfg.attn_heads * cfg.attn_head_dim
            p[pre + "qkv"] = mat(pre + "qkv", 3 * hd, d)
            p[pre + "o"] = mat(pre + "o", d, hd)
        p[pre + "up"] = mat(pre + "up", 2 * cfg.mlp, d)
        p[pre + "down"] = mat(pre + "down", d, cfg.mlp)
    return p


def rms_norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps)


@dataclass
class Cache:
    """Per sequence: committed state of every layer, and the verify step waiting for its commit."""

    tokens: list[int]
    gdn: list[Any] = field(default_factory=list)            # carry (strategy) or state [1, HV, K, V] (literal)
    conv: list[torch.Tensor] = field(default_factory=list)  # per GDN layer: last conv-1 inputs [conv-1, C]
    kv: list[tuple[torch.Tensor, torch.Tensor]] = field(default_factory=list)  # per attention layer [L, heads, dim]
    strategy: Strategy | None = None
    pending: dict[str, Any] | None = None


class TinyHybrid:
    def __init__(self, cfg: TinyConfig, dtype: torch.dtype = torch.float64, drafter_noise: float | None = None,
                 base: "TinyHybrid | None" = None):
        self.cfg = cfg
        self.dtype = dtype
        gen = torch.Generator().manual_seed(cfg.seed if drafter_noise is None else cfg.seed + 1)
        raw = _init(cfg, gen, noise=drafter_noise or 0.0, base=base.raw if base is not None else None)
        self.raw = raw
        self.p = {k: v.to(dtype) for k, v in raw.items()}

    def as_dtype(self, dtype: torch.dtype) -> "TinyHybrid":
        other = object.__new__(TinyHybrid)
        other.cfg, other.dtype, other.raw = self.cfg, dtype, self.raw
        other.p = {k: v.to(dtype) for k, v in self.raw.items()}
        return other

    # -- public steps ----------------------------------------------------------------
    def prefill(self, tokens: list[int], gdn: Strategy | None = None) -> tuple[torch.Tensor, Cache]:
        """Run the prompt (literal recurrence) and start the cache; returns the last token's logits."""
        cfg = self.cfg
        cache = Cache(tokens=list(tokens), strategy=gdn)
        C = 2 * cfg.key_heads * cfg.head_k + cfg.value_heads * cfg.head_v
        for kind in cfg.layer_kinds:
            if kind == "gdn":
                cache.gdn.append(torch.zeros(1, cfg.value_heads, cfg.head_k, cfg.head_v, dtype=self.dtype))
                cache.conv.append(torch.zeros(cfg.conv - 1, C, dtype=self.dtype))
            else:
                hd = (0, cfg.attn_heads, cfg.attn_head_dim)
                cache.kv.append((torch.zeros(hd, dtype=self.dtype), torch.zeros(hd, dtype=self.dtype)))
        chain = DraftTree.chain(len(tokens))
        saved = cache.strategy
        cache.strategy = None                  # the prompt always goes through the literal recurrence
        logits = self.verify(cache, tokens, chain)
        self.commit(cache, len(tokens) - 1, extend_tokens=False)
        cache.strategy = saved
        if saved is not None:
            cache.gdn = [saved.start(s) for s in cache.gdn]
        return logits[-1], cache

    def verify(self, cache: Cache, tokens: list[int], tree: DraftTree,
               confidence: list[float] | None = None) -> torch.Tensor:
        """Logits of every node of ``tree`` (its tokens in ``tokens``); the step waits for ``commit``.
        ``confidence``: each node's draft probability, for a strategy that decides its checkpoints by it."""
        cfg, p = self.cfg, self.p
        conf = None if confidence is None else torch.tensor([confidence], dtype=torch.float64)
        x = p["embed"][torch.tensor(tokens)]
        pend: dict[str, Any] = {"tree": tree, "tokens": list(tokens), "gdn": [], "conv_in": [], "kv": []}
        gi = ai = 0
        anc = tree.ancestor_mask(inclusive=True)
        for i, kind in enumerate(cfg.layer_kinds):
            pre = f"l{i}."
            h = rms_norm(x)
            if kind == "gdn":
                out, state = self._gdn(cache, gi, pre, h, tree, conf)
                pend["gdn"].append(state[0])
                pend["conv_in"].append(state[1])
                gi += 1
            else:
                out, kv = self._attn(cache, ai, pre, h, anc)
                pend["kv"].append(kv)
                ai += 1
            x = x + out
            h = rms_norm(x)
            up = h @ p[pre + "up"].T
            gate, val = up.chunk(2, -1)
            x = x + (F.silu(gate) * val) @ p[pre + "down"].T
        cache.pending = pend
        return rms_norm(x) @ p["lm_head"].T

    def commit(self, cache: Cache, accepted: int, extend_tokens: bool = True) -> None:
        """The path to node ``accepted`` becomes part of the committed sequence."""
        pend, cfg = cache.pending, self.cfg
        if pend is None:
            raise RuntimeError("commit without a verify")
        tree: DraftTree = pend["tree"]
        path = tree.path_to(accepted)
        for j, verified in enumerate(pend["gdn"]):
            if cache.strategy is None:
                states = verified                                    # [1, N, HV, K, V]
                cache.gdn[j] = accepted_state(cache.gdn[j], states, torch.tensor([accepted]))
            else:
                cache.gdn[j] = cache.strategy.commit(cache.gdn[j], verified, torch.tensor([accepted]))
            hist = torch.cat([cache.conv[j], pend["conv_in"][j][path]])
            cache.conv[j] = hist[-(cfg.conv - 1):]
        for j, (k, v) in enumerate(pend["kv"]):
            k0, v0 = cache.kv[j]
            cache.kv[j] = (torch.cat([k0, k[path]]), torch.cat([v0, v[path]]))
        if extend_tokens:
            cache.tokens.extend(pend["tokens"][n] for n in path)
        cache.pending = None

    # -- layers ------------------------------------------------------------------------
    def _gdn(self, cache: Cache, j: int, pre: str, h: torch.Tensor, tree: DraftTree,
             confidence: torch.Tensor | None = None):
        cfg, p = self.cfg, self.p
        H, HV, K, V = cfg.key_heads, cfg.value_heads, cfg.head_k, cfg.head_v
        N = tree.num_nodes
        raw = h @ p[pre + "qkv"].T                                  # [N, C]: pre-conv inputs
        window = _conv_windows(tree, cfg.conv)                      # [N, conv] into [history; raw]
        seq = torch.cat([cache.conv[j], raw])
        mixed = F.silu((seq[window] * p[pre + "conv"].T[None]).sum(1))   # [N, C]
        q, k, v = mixed.split([H * K, H * K, HV * V], -1)
        q = F.normalize(q.reshape(N, H, K), dim=-1)
        k = F.normalize(k.reshape(N, H, K), dim=-1)
        v = v.reshape(N, HV, V)
        a, b = (h @ p[pre + "ab"].T).chunk(2, -1)
        g = -p[pre + "A_log"].exp() * F.softplus(a + p[pre + "dt_bias"])
        beta = torch.sigmoid(b)
        args = [t[None] for t in (q, k, v, g, beta)]
        if cache.strategy is None:
            # Half-precision runs keep bf16 states but do the arithmetic in float32, as the strategies
            # (and vLLM's kernels) do: the oracle follows the same precision policy.
            wide = torch.float32 if self.dtype in (torch.bfloat16, torch.float16) else self.dtype
            o, states = tree_recurrence(cache.gdn[j].to(wide), *[t.to(wide) for t in args], tree)
            o, keep = o.to(self.dtype), states.to(self.dtype)
        else:
            ver = cache.strategy.verify(cache.gdn[j], *args, tree, confidence=confidence)
            o, keep = ver.o, ver
        z = h @ p[pre + "z"].T
        o = rms_norm(o[0]) * F.silu(z.reshape(N, HV, V))            # gated RMSNorm per head
        return o.reshape(N, HV * V) @ p[pre + "o"].T, (keep, raw)

    def _attn(self, cache: Cache, j: int, pre: str, h: torch.Tensor, anc: torch.Tensor):
        cfg, p = self.cfg, self.p
        N, nh, hd = h.shape[0], cfg.attn_heads, cfg.attn_head_dim
        q, k, v = (h @ p[pre + "qkv"].T).reshape(N, 3, nh, hd).unbind(1)
        k0, v0 = cache.kv[j]
        keys, vals = torch.cat([k0, k]), torch.cat([v0, v])
        L = k0.shape[0]
        mask = torch.cat([torch.ones(N, L, dtype=torch.bool), anc], 1)   # prefix + own ancestors
        scores = torch.einsum("nhd,mhd->hnm", q, keys) * hd ** -0.5
        scores = scores.masked_fill(~mask[None], float("-inf"))
        out = torch.einsum("hnm,mhd->nhd", scores.softmax(-1), vals)
        return out.reshape(N, nh * hd) @ p[pre + "o"].T, (k, v)


def _conv_windows(tree: DraftTree, width: int) -> torch.Tensor:
    """[N, width] indices into ``[history (width-1 rows); node inputs (N rows)]``: each node's
    causal conv window along its ancestor path, oldest first."""
    hist = width - 1
    rows = []
    for t in range(tree.num_nodes):
        path = [hist + n for n in tree.path_to(t)]
        window = (list(range(hist)) + path)[-width:]
        rows.append(window)
    return torch.tensor(rows)


def drafter_of(target: TinyHybrid, noise: float) -> TinyHybrid:
    """The same architecture with seeded relative weight noise: its hit rate falls as noise grows."""
    return TinyHybrid(target.cfg, target.dtype, drafter_noise=noise, base=target)
