"""Where each engine step's time goes on the host, from the step clock (``stepclock/commitbench_stepclock.py``):
decode-only steps and steps with prompt tokens apart.

  python results/h200-kernel-speed/device/step_clock.py CLOCK_DIR_OR_FILES... [--point SUMMARY] [--json F]

Per step (milliseconds):
- ``interval``: from this step's ``execute_model`` to the next one's; in a steady run, the step time;
- ``wait``: from ``execute_model`` to the end of the step's first GDN metadata build (``tb - t0``). vLLM's
  build waits there for the device (it copies device tensors with CPU masks), so this is the host waiting for the
  previous step's device work: large where the device is the bottleneck, near zero where the host is;
- ``launch``: from there to ``execute_model``'s return (``t1 - tb``): the host building the rest of the inputs
  and launching the forward pass, graphs replayed and, in PIECEWISE mode, every eager attention and GDN layer;
- ``sample``: ``sample_tokens`` (sampling, rejection, the drafter's proposal; ``t3 - t2``).

With the layer clock (``COMMITBENCH_STEPCLOCK_LAYERS=1``), per step and summed over the GDN layers, the host and
device milliseconds of the layer's core (``core``), the plugin's commit of rows leaving the speculative path
(``leave``), the speculative kernel (``spec``), vLLM's own conv1d, gating and chunked-prefill kernels inside the
core (``conv``, ``prep``, ``chunk``; CUDA), the plugin's part of the metadata builds (``build``, host only), and of
the full-attention layers' kernels (``attn``; the drafter's: ``draft_attn``), in a second table. A part whose host
time exceeds its device time is paced by the host.

A step whose ``wait`` is near zero and whose ``launch`` is most of its ``interval`` is host-bound: more host work
per layer makes it longer one for one. ``--point`` keeps the steps of one point's measured run
(``telemetry.run_wall_s``, or in older summaries ``provenance.time_utc`` less ``metrics.duration_s``; the
clock's ``wall`` is ``time.time()`` on the same host).
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import sys
from pathlib import Path

PARTS = ("interval", "wait", "launch", "sample")
LAYER_PARTS = ("core", "leave", "spec", "conv", "prep", "chunk", "build", "attn", "draft_attn")
LAYER_COLUMNS = tuple(f"{p} {side}" for p in LAYER_PARTS for side in ("host", "dev"))


def load(paths: list[Path]) -> list[dict]:
    """Every step of the given files (or ``steps-*.jsonl`` in the given folders), in clock order; a torn last
    line (a process killed mid-append) is skipped."""
    files = [f for p in paths for f in (sorted(p.glob("steps-*.jsonl")) if p.is_dir() else [p] if p.exists() else [])]
    if not files:
        raise ValueError(f"no steps-*.jsonl in {', '.join(map(str, paths))}: was the server started with "
                         "stepclock/ on PYTHONPATH and COMMITBENCH_STEPCLOCK set?")
    rows = []
    for f in files:
        for line in f.read_text().splitlines():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return sorted(rows, key=lambda r: r["t0"])


def timed(rows: list[dict]) -> list[dict]:
    """Each step with its parts in ms; ``interval`` None for the last step (no next one)."""
    out = []
    for r, nxt in zip(rows, rows[1:] + [None]):
        tb = r.get("tb") if r.get("tb") is not None else r["t0"]
        out.append({**r, "kind": "with prompt" if r.get("prompt_tokens") else "decode only",
                    "interval": None if nxt is None else 1e3 * (nxt["t0"] - r["t0"]),
                    "wait": 1e3 * (tb - r["t0"]), "launch": 1e3 * (r["t1"] - tb),
                    "sample": 1e3 * (r["t3"] - r["t2"]) if "t3" in r else None,
                    **{f"{p} host": 1e3 * r[f"{p}_host"] for p in LAYER_PARTS if f"{p}_host" in r},
                    **{f"{p} dev": r[f"{p}_dev"] for p in LAYER_PARTS if f"{p}_dev" in r}})
    return out


def span(summary: dict) -> tuple[float, float]:
    """A point's measured run as ``time.time()`` seconds, from its summary: ``telemetry.run_wall_s`` where the
    engine wrote it, else ``provenance.time_utc`` less ``metrics.duration_s`` widened by a second on each side
    (older summaries: time_utc is whole seconds and is written after the point's analysis, so a run shorter
    than a second could fall outside it)."""
    wall = (summary.get("telemetry") or {}).get("run_wall_s")
    if isinstance(wall, (list, tuple)) and len(wall) == 2 and all(isinstance(x, (int, float)) for x in wall):
        return float(wall[0]), float(wall[1])
    try:
        end = dt.datetime.fromisoformat(summary["provenance"]["time_utc"]).timestamp()
        return end - float(summary["metrics"]["duration_s"]) - 1.0, end + 1.0
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError("the point's summary has neither telemetry.run_wall_s nor provenance.time_utc and "
                         f"metrics.duration_s ({e})") from None


def summarize(steps: list[dict]) -> dict[str, dict]:
    """Per kind: steps, mean decoding requests and prompt tokens, and the median and mean of each part."""
    out = {}
    for kind in ("decode only", "with prompt"):
        sel = [s for s in steps if s["kind"] == kind]
        if not sel:
            continue
        row = {"steps": len(sel), "decode_reqs": statistics.fmean(s["decode_reqs"] for s in sel),
               "prompt_tokens": statistics.fmean(s["prompt_tokens"] for s in sel)}
        for part in PARTS + tuple(c for c in LAYER_COLUMNS if any(c in s for s in sel)):
            xs = [s[part] for s in sel if s.get(part) is not None]
            row[part] = {"median": statistics.median(xs), "mean": statistics.fmean(xs)} if xs else None
        out[kind] = row
    return out


FIT_TERMS = ("const", "per 100 prompt tokens", "per decoding request", "per new request")


def fit(steps: list[dict], part: str = "launch") -> dict[str, float] | None:
    """Least squares of ``part`` (ms) over the steps with prompt tokens against a constant, the prompt tokens
    (per 100), the decoding requests and the new requests: what a step with prompt tokens costs whatever its
    size (``const``) and what each unit adds; ``rms``: the residual. None with fewer steps than terms + 2."""
    import numpy as np

    sel = [s for s in steps if s["kind"] == "with prompt" and s.get(part) is not None]
    if len(sel) < len(FIT_TERMS) + 2:
        return None
    X = np.array([[1.0, s["prompt_tokens"] / 100, s["decode_reqs"], s.get("new_reqs", 0)] for s in sel])
    y = np.array([s[part] for s in sel])
    coef, *_ = np.linalg.lstsq(X, y, rcond=None)
    return {**dict(zip(FIT_TERMS, map(float, coef))), "rms": float(np.sqrt(np.mean((X @ coef - y) ** 2))),
            "steps": len(sel)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("paths", nargs="+", type=Path, help="the clock's folder or its steps-*.jsonl files")
    ap.add_argument("--point", type=Path, help="a point's summary.json: only the steps of its measured run")
    ap.add_argument("--json", type=Path, help="also write the summary here")
    ap.add_argument("--fit", action="store_true", help="also fit the steps with prompt tokens' interval, launch "
                    "and layer-clock columns against their size (fit())")
    args = ap.parse_args(argv)
    try:
        steps = timed(load(args.paths))
        if args.point:
            lo, hi = span(json.loads(args.point.read_text()))
            steps = [s for s in steps if lo <= s["wall"] <= hi]
            if not steps:
                raise ValueError(f"no step of the clock falls in {args.point}'s run: another server's point?")
        summary = summarize(steps)
        if args.fit:
            layer = [c for c in LAYER_COLUMNS if any(c in s for s in steps)]
            summary["fit"] = {part: fit(steps, part) for part in ("interval", "launch", *layer)}
    except (OSError, ValueError) as e:
        print(f"step_clock: {e}", file=sys.stderr)
        return 2
    print(f"{len(steps)} steps; ms, median (mean)")
    print(f"  {'kind':12s} {'steps':>6s} {'decodes':>8s} {'prompt':>7s} " + " ".join(f"{p:>16s}" for p in PARTS))
    kinds = {k: v for k, v in summary.items() if k != "fit"}
    for kind, r in kinds.items():
        cells = " ".join(f"{'-':>16s}" if r[p] is None else f"{r[p]['median']:7.1f} ({r[p]['mean']:6.1f})"
                         for p in PARTS)
        print(f"  {kind:12s} {r['steps']:6d} {r['decode_reqs']:8.1f} {r['prompt_tokens']:7.0f} {cells}")
    layer = [c for c in LAYER_COLUMNS if any(c in r for r in kinds.values())]
    if layer:
        print("summed per step over the layers (layer clock: attn and draft_attn over the attention layers, the "
              "rest over the GDN layers); ms, median (mean)")
        print(f"  {'kind':12s} " + " ".join(f"{c:>16s}" for c in layer))
        for kind, r in kinds.items():
            cells = " ".join(f"{'-':>16s}" if r.get(c) is None else f"{r[c]['median']:7.2f} ({r[c]['mean']:6.2f})"
                             for c in layer)
            print(f"  {kind:12s} {cells}")
    for part, f in (summary.get("fit") or {}).items():
        print(f"fit, steps with prompt tokens, {part} (ms): " + ("too few steps" if f is None else ", ".join(
            f"{t} {f[t]:.2f}" for t in FIT_TERMS) + f"; rms {f['rms']:.1f} over {f['steps']} steps"))
    if args.json:
        args.json.write_text(json.dumps(summary, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
