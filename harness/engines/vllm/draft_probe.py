"""The plugin's probe (``COMMITBENCH_PROBE_DIR``): per GDN layer and speculative step, each row's committed state and
outputs, the shadow strategies' distance from vLLM's kernel on the same inputs, and the MTP head's top-2 tokens
per draft, saved to ``probe-<pid>.pt`` at exit; read by ``harness/engines/vllm/shadow.py`` and the equivalence
tests. Loaded by :mod:`harness.engines.vllm.plugin` only when the probe is asked for."""

from __future__ import annotations

import atexit
import functools
import os
from pathlib import Path
from typing import Any

import torch

ENV_PROBE = "COMMITBENCH_PROBE_DIR"
ENV_PROBE_STATES = "COMMITBENCH_PROBE_STATES"


class Probe:
    """Committed states and outputs per (layer, speculative step), saved at exit."""

    _instance: "Probe | None" = None

    def __init__(self, folder: str):
        self.path = Path(folder) / f"probe-{os.getpid()}.pt"
        self.records: list[dict[str, Any]] = []
        self.comparisons: list[dict[str, Any]] = []
        self.drafts: list[torch.Tensor] = []  # [n, 3]: MTP top-1 token, top-2 token, logit margin
        self.steps: dict[str, int] = {}
        self.shadow_code: dict[str, str] = {}   # what ran each shadow strategy (code_of)
        self.spec_req_ids: list[str] = []    # the speculative rows' requests, in row order, this step
        atexit.register(self.save)

    @classmethod
    def active(cls) -> "Probe | None":
        folder = os.environ.get(ENV_PROBE)
        if not folder:
            return None
        if cls._instance is None:
            Path(folder).mkdir(parents=True, exist_ok=True)
            cls._instance = cls(folder)
        return cls._instance

    def record(self, layer: str, num_accepted, committed, out) -> None:
        step = self.steps.get(layer, 0)
        self.steps[layer] = step + 1
        n = num_accepted.shape[0]
        rec = {"layer": layer, "step": step, "num_accepted": num_accepted.cpu().clone(),
               "req_ids": list(self.spec_req_ids[:n])}
        if os.environ.get(ENV_PROBE_STATES, "1") != "0":  # "0": acceptance and comparisons only (big models)
            rec.update(committed=committed.float().cpu().clone(), out=out.float().cpu().clone())
        self.records.append(rec)

    def compare(self, layer: str, shadow: str, committed, shadow_committed, out, shadow_out) -> None:
        """A shadow strategy against vLLM on the same inputs: max |x − ref| / max |ref|."""
        def rel(x, ref):
            ref = ref.float()
            return float((x.float() - ref).abs().max() / ref.abs().max().clamp_min(1e-30))

        self.comparisons.append({"layer": layer, "step": self.steps[layer] - 1, "shadow": shadow,
                                 "state_rel_err": rel(shadow_committed, committed),
                                 "out_rel_err": rel(shadow_out, out)})

    def save(self) -> None:
        drafts = torch.cat(self.drafts) if self.drafts else torch.empty(0, 3)
        torch.save({"records": self.records, "comparisons": self.comparisons, "drafts": drafts,
                    "shadow_code": self.shadow_code}, self.path)


def install_draft_probe() -> None:
    """Record the MTP head's top-2 tokens and logit margin per drafted token, so that a token
    that differs between two runs at an accepted-draft position can be traced to a near-tie;
    and which request each speculative row of a step is (the model runner's batch order)."""
    import importlib

    from vllm.v1.worker import gpu_model_runner as gmr

    prepare = gmr.GPUModelRunner._prepare_inputs

    @functools.wraps(prepare)
    def _prepare_inputs(self, *args, **kwargs):
        out = prepare(self, *args, **kwargs)
        probe = Probe.active()
        if probe is not None:
            n = self.input_batch.num_reqs
            drafts = getattr(self, "num_decode_draft_tokens", None)
            spec = drafts.np[:n] >= 0 if drafts is not None else [True] * n   # vLLM's speculative rows
            probe.spec_req_ids = [r for r, m in zip(self.input_batch.req_ids[:n], spec) if m]
        return out

    gmr.GPUModelRunner._prepare_inputs = _prepare_inputs

    for modname in ("qwen3_next_mtp", "qwen3_5_mtp"):
        try:
            mod = importlib.import_module(f"vllm.model_executor.models.{modname}")
        except ImportError:
            continue
        for cls in vars(mod).values():
            if isinstance(cls, type) and cls.__name__.endswith("MTP") and "compute_logits" in vars(cls):
                cls.compute_logits = _probed_logits(cls.compute_logits)


def _probed_logits(fn):
    @functools.wraps(fn)
    def compute_logits(self, *args, **kwargs):
        logits = fn(self, *args, **kwargs)
        probe = Probe.active()
        if probe is not None and logits is not None and logits.dim() == 2 and logits.shape[-1] > 1:
            top = logits.float().topk(2, dim=-1)
            probe.drafts.append(torch.stack([top.indices[:, 0].float(), top.indices[:, 1].float(),
                                             top.values[:, 0] - top.values[:, 1]], -1).cpu())
        return logits
    return compute_logits
