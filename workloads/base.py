"""What every workload source shares: its report, seeded order, filters and arrival times."""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from .arrivals import Arrival
from .filters import LengthFilter
from .request import Request


@dataclass
class LoadReport:
    """How a source became requests: counts per stage (in order), notes, the tokenizer used."""

    source: str
    tokenizer: str | None
    counts: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    cache_hit: bool = False

    def as_dict(self) -> dict[str, Any]:
        return {"source": self.source, "tokenizer": self.tokenizer, "counts": dict(self.counts),
                "notes": list(self.notes), "cache_hit": self.cache_hit}


class Workload(ABC):
    """A request source. ``requests()`` gives the filtered, seeded, arrival-stamped list."""

    name = ""

    def __init__(self, cfg: Mapping[str, Any]):
        self.cfg = dict(cfg)
        self.seed = int(self.cfg.get("seed", 0))
        self.num_requests = self.cfg.get("num_requests")
        self.arrival = Arrival.from_config({"seed": self.seed, **dict(self.cfg.get("arrival") or {})})
        flt = self.cfg.get("filters")
        self.filter = LengthFilter(**flt) if flt is not None else None

    @abstractmethod
    def load(self) -> tuple[list[Request], LoadReport, list[float] | None]:
        """Every request the source offers (before filters), its report, and trace times if any."""

    def requests(self) -> tuple[list[Request], LoadReport]:
        reqs, report, times = self.load()
        if self.filter is not None:     # a trace's times go with their requests (an item is the pair)
            pairs = list(zip(reqs, times, strict=True)) if times else reqs
            kept, dropped = self.filter.apply(pairs, [(r.prompt_len, r.output_len) for r in reqs])
            reqs, times = ([r for r, _ in kept], [t for _, t in kept]) if times else (kept, times)
            for why, n in dropped.items():
                report.counts[f"dropped: {why}"] = n
            report.counts["after filters"] = len(reqs)
        if self.arrival.kind != "trace" and self.cfg.get("shuffle", True):
            order = list(range(len(reqs)))
            random.Random(self.seed).shuffle(order)  # seeded, like vllm bench serve's sampling
            reqs = [reqs[i] for i in order]
            times = [times[i] for i in order] if times else times
        if not reqs:
            raise ValueError(f"workload={self.name}: no requests left after filtering ({_summary(report.counts)}); "
                             "loosen workload.filters or check the source")
        if self.num_requests is not None:
            n = int(self.num_requests)
            if n < 1:
                raise ValueError(f"workload.num_requests={n}: must be >= 1 (or null for all)")
            if n > len(reqs) and self.arrival.kind == "trace":
                raise ValueError(f"workload.num_requests={n}: workload={self.name} has {len(reqs)} requests after "
                                 f"filters, and trace arrivals cannot be repeated; set workload.num_requests<="
                                 f"{len(reqs)} (or null for all), or workload.arrival.kind=poisson")
            if n > len(reqs):
                report.notes.append(f"num_requests={n} > the {len(reqs)} requests available: reused them in order")
                reqs = [reqs[i % len(reqs)] for i in range(n)]
            else:
                reqs = reqs[:n]
        offsets = self.arrival.offsets(len(reqs), times)
        if offsets is not None:
            reqs = [r.at(float(t)) for r, t in zip(reqs, offsets, strict=True)]
        report.counts["requests"] = len(reqs)
        return reqs, report


def _summary(counts: Mapping[str, int]) -> str:
    return ", ".join(f"{k}: {v}" for k, v in counts.items()) or "nothing loaded"


def count_dict(counter: Counter) -> dict[str, int]:
    return {k: int(v) for k, v in counter.most_common()}


def read_text(path: Path, what: str) -> str:
    """A text data file as UTF-8, strictly: a file in another encoding fails naming it and the fix, instead of
    its bad bytes becoming U+FFFD silently. A multi-byte character cut off by the file's end (a download cut
    mid-record) is dropped: the record it is in is incomplete anyway. ``what`` names the input in messages."""
    data = path.read_bytes()
    for bom, enc in ((b"\xff\xfe\x00\x00", "UTF-32"), (b"\x00\x00\xfe\xff", "UTF-32"), (b"\xff\xfe", "UTF-16"),
                     (b"\xfe\xff", "UTF-16")):
        if data.startswith(bom):
            raise ValueError(f"{what}={path}: the file is {enc} (it starts with a {enc} byte-order mark); convert it "
                             f"to UTF-8: iconv -f {enc} -t UTF-8 {path} > {path.stem}.utf8{path.suffix}")
    if data[:200].count(b"\x00") > 20:
        raise ValueError(f"{what}={path}: the file holds NUL bytes, as UTF-16 without a byte-order mark does; "
                         f"convert it to UTF-8: iconv -f UTF-16LE -t UTF-8 {path} > {path.stem}.utf8{path.suffix}")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        if e.start >= len(data) - 3 and e.reason == "unexpected end of data":
            return data[:e.start].decode("utf-8")
        line = data.count(b"\n", 0, e.start) + 1
        raise ValueError(f"{what}={path}: not UTF-8 (byte 0x{data[e.start]:02x} at line {line:,}, offset "
                         f"{e.start:,}); a Latin-1 or Windows-1252 file converts with iconv -f LATIN1 -t UTF-8 "
                         f"{path} > {path.stem}.utf8{path.suffix}") from None
