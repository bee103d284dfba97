"""``python -m harness workloads describe|build-tokenizer`` and ``bench workloads``."""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from omegaconf import DictConfig, OmegaConf

import workloads

from .console import console as make_console, table as make_table

PCTS = (1, 10, 50, 90, 99)


def stats(reqs: list[workloads.Request]) -> dict[str, Any]:
    """Count, length percentiles (tokens) and arrival statistics of a request list."""
    out: dict[str, Any] = {"count": len(reqs)}
    for what in ("prompt_len", "output_len"):
        x = np.array([getattr(r, what) for r in reqs])
        out[what] = {"mean": float(x.mean()), **{f"p{p}": float(np.percentile(x, p)) for p in PCTS},
                     "max": int(x.max()), "min": int(x.min())}
    times = np.array([r.arrival_s for r in reqs if r.arrival_s is not None])
    if len(times) > 1:
        gaps, span = np.diff(times), float(times[-1] - times[0])
        # all at one instant (a burst): no rate and no interarrival spread to report, rather than a division by 0
        out["arrivals"] = {"span_s": span, "rate_req_s": (len(times) - 1) / span if span > 0 else None,
                           "interarrival_cv": float(gaps.std() / gaps.mean()) if span > 0 else None}
    return out


def histogram(values: list[int], bins: int, width: int = 40) -> list[str]:
    """Terminal histogram rows: range, count, bar."""
    x = np.array(values)
    if x.min() == x.max():
        return [f"{int(x[0]):>6}        {len(x):>6} {'█' * width}"]
    counts, edges = np.histogram(x, bins=min(bins, int(x.max() - x.min()) + 1))
    top = max(int(counts.max()), 1)
    return [f"{int(lo):>6}-{int(hi):<6} {int(c):>6} {'█' * max(int(round(width * c / top)), 1 if c else 0)}"
            for lo, hi, c in zip(edges[:-1], edges[1:], counts, strict=True)]


def describe(cfg: DictConfig) -> int:
    wl = OmegaConf.to_container(cfg.workload, resolve=True)
    t0 = time.perf_counter()
    reqs, report = workloads.build(wl).requests()
    elapsed = time.perf_counter() - t0
    info = {"workload": wl, "report": report.as_dict(), "stats": stats(reqs), "load_s": elapsed}
    if cfg.format == "json":
        print(json.dumps(info, indent=2))
        return 0
    if cfg.format != "table":
        raise ValueError(f"format={cfg.format}: must be table or json")
    console = make_console()
    arrival = workloads.Arrival.from_config({"seed": wl.get("seed", 0), **(wl.get("arrival") or {})})
    console.print(f"[bold]{wl.get('source')}[/] ({wl.get('shape', '') or report.source}): {len(reqs)} requests, "
                  f"{arrival.describe()}; lengths by {report.tokenizer or 'the source itself'}; "
                  f"loaded in {elapsed:.1f} s{' (cache)' if report.cache_hit else ''}")
    for note in report.notes:
        console.print(f"  note: {note}")
    for stage, n in report.counts.items():
        console.print(f"  {stage}: {n:,}")
    t = make_table("lengths (tokens)", ["", "mean", *[f"p{p}" for p in PCTS], "max"])
    st = info["stats"]
    for what in ("prompt_len", "output_len"):
        s = st[what]
        t.add_row(what, f"{s['mean']:.0f}", *[f"{s[f'p{p}']:.0f}" for p in PCTS], str(s["max"]))
    console.print(t)
    if "arrivals" in st:
        a = st["arrivals"]
        if a["rate_req_s"] is None:
            console.print(f"arrivals: all {st['count']} at one instant (a burst)")
        else:
            console.print(f"arrivals: {a['rate_req_s']:.3g} req/s over {a['span_s']:.1f} s, "
                          f"inter-arrival CV {a['interarrival_cv']:.2f}")
    for what in ("prompt_len", "output_len"):
        console.print(f"[bold]{what}[/] histogram")
        for row in histogram([getattr(r, what) for r in reqs], int(cfg.bins)):
            console.print("  " + row, highlight=False)
    return 0


def build_tokenizer(cfg: DictConfig) -> int:
    from workloads.sharegpt import default_path, first_exchange, parse_records
    from workloads.tokens import BUNDLED, BundledBPE, train_bpe

    path = Path(cfg.path) if cfg.path else default_path()
    records, notes = parse_records(path.read_text(encoding="utf-8", errors="replace"), path.name)
    texts = [t for r in records if (pair := first_exchange(r)) for t in pair]
    out = train_bpe(texts, Path(cfg.out) if cfg.out else BUNDLED, int(cfg.vocab_size))
    print(f"trained on {len(texts):,} turns of {len(records):,} conversations; wrote {out} "
          f"({BundledBPE(out).name})")
    return 0


def bench(cfg: DictConfig) -> int:
    """Cold load (fresh cache dir) then warm loads, timed on this machine."""
    wl = OmegaConf.to_container(cfg.workload, resolve=True)
    console = make_console()
    old = os.environ.get("COMMITBENCH_CACHE")
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["COMMITBENCH_CACHE"] = tmp
        try:
            t0 = time.perf_counter()
            reqs, report = workloads.build(wl).requests()
            cold = time.perf_counter() - t0
            warm = []
            for _ in range(int(cfg.repeats_warm)):
                t0 = time.perf_counter()
                _, rep = workloads.build(wl).requests()
                warm.append(time.perf_counter() - t0)
                assert rep.cache_hit
        finally:
            if old is None:
                os.environ.pop("COMMITBENCH_CACHE", None)
            else:
                os.environ["COMMITBENCH_CACHE"] = old
    console.print(f"{wl.get('source')}: {report.counts}; tokenizer {report.tokenizer}")
    console.print(f"cold load (parse + tokenise + filter): {cold:.2f} s; warm (cache): "
                  f"{min(warm):.3f} s min of {len(warm)}; {len(reqs)} requests (this machine's wall time)")
    return 0


def export(cfg: DictConfig) -> int:
    """The workload's requests, in order, as JSONL lengths (``source: lengths`` reads them back)."""
    wl = OmegaConf.to_container(cfg.workload, resolve=True)
    if (wl.get("arrival") or {}).get("kind", "closed") == "trace":
        raise ValueError("workloads export: a trace's timestamps are not exported; export a closed-loop or "
                         "rate workload (workload.arrival.kind=poisson)")
    reqs, report = workloads.build(wl).requests()
    out = Path(cfg.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    head = {"exported_from": f"{wl.get('source')}:{wl.get('path') or 'default'}", "tokenizer": report.tokenizer,
            "seed": wl.get("seed", 0), "filters": wl.get("filters"), "counts": report.counts}
    with open(out, "w") as f:
        f.write(json.dumps(head) + "\n")
        for r in reqs:
            f.write(json.dumps({"prompt_len": r.prompt_len, "output_len": r.output_len, "category": r.category,
                                "source_id": r.source_id}) + "\n")
    print(f"wrote {len(reqs):,} requests to {out}; a sweep runs them as requests_from.<workload>={out}, a "
          f"workload config as workload.source=lengths workload.path={out} workload.shuffle=false "
          "workload.filters=null")
    return 0
