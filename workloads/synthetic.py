"""Synthetic length shapes with no text: prompt and output lengths drawn from seeded distributions.

Each shape's parameters live in its ``conf/workload/*.yaml`` (``balanced_chat``,
``generation_heavy``, ``summarize_heavy``): a log-normal per length, given by its median and
its spread ``sigma`` (of the log), clipped to ``[min, max]`` tokens. Outputs are exact (ignore-EOS).
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from .base import LoadReport, Workload
from .request import Request


def _lengths(rng: np.random.Generator, spec: Mapping[str, Any], n: int, what: str) -> np.ndarray:
    try:
        median, sigma = float(spec["median"]), float(spec.get("sigma", 0.0))
        lo, hi = int(spec.get("min", 1)), int(spec.get("max", 1 << 20))
    except (KeyError, TypeError, ValueError):
        raise ValueError(f"workload.{what}={dict(spec) if spec else spec}: needs median (tokens), and optionally "
                         "sigma, min, max") from None
    if median < 1 or sigma < 0 or not 1 <= lo <= hi:
        raise ValueError(f"workload.{what}: median={median}, sigma={sigma}, min={lo}, max={hi}: need median >= 1, "
                         "sigma >= 0, 1 <= min <= max")
    x = median * np.exp(sigma * rng.standard_normal(n))
    return np.clip(np.rint(x), lo, hi).astype(int)


class Synthetic(Workload):
    name = "synthetic"

    def load(self):
        shape = self.cfg.get("shape", "synthetic")
        n = int(self.cfg.get("pool_size", self.cfg.get("num_requests") or 1000))
        rng = np.random.default_rng(self.seed)
        p = _lengths(rng, self.cfg.get("prompt"), n, "prompt")
        o = _lengths(rng, self.cfg.get("output"), n, "output")
        reqs = [Request(prompt_len=int(a), output_len=int(b), category=shape, source_id=f"{shape}:{i}")
                for i, (a, b) in enumerate(zip(p, o, strict=True))]
        report = LoadReport(source=f"synthetic:{shape}", tokenizer=None, counts={"generated": n},
                            notes=["lengths drawn from the config's log-normals; no text (engines make token ids)"])
        return reqs, report, None
