"""workloads export -> source: lengths replays exactly the same requests (the GPU host's path)."""

from __future__ import annotations

import json

import pytest
from omegaconf import OmegaConf

import workloads
from harness.cli import main
from harness.point import build_point
from harness.grid import compose_sweep, point_configs

CLOSED = {"kind": "closed", "max_concurrency": 4}


def test_export_then_replay_gives_the_same_requests(tmp_path):
    out = tmp_path / "sb.jsonl"
    assert main(["workloads", "export", "workload=spec_bench", f"out={out}"]) == 0
    lines = out.read_text().splitlines()
    assert json.loads(lines[0])["exported_from"].startswith("spec_bench") and len(lines) > 300
    original = OmegaConf.to_container(OmegaConf.load("conf/workload/spec_bench.yaml"))
    original["num_requests"] = 120
    want, _ = workloads.build(original).requests()
    got, report = workloads.build({"source": "lengths", "path": str(out), "shuffle": False, "num_requests": 120,
                                   "arrival": original["arrival"]}
                                  ).requests()
    assert [(r.prompt_len, r.output_len, r.source_id) for r in got] == \
        [(r.prompt_len, r.output_len, r.source_id) for r in want]
    assert report.notes and "exported from" in report.notes[0]


def test_sweep_replay_keeps_the_workload_name_and_requests(tmp_path):
    out = tmp_path / "sb.jsonl"
    assert main(["workloads", "export", "workload=spec_bench", f"out={out}"]) == 0
    base = ["workload=spec_bench", "concurrency=8", "strategy=treewy", "engine=sim", "gmu=0.9"]
    a = point_configs(OmegaConf.to_container(compose_sweep(base), resolve=True))
    b = point_configs(OmegaConf.to_container(compose_sweep(base + [f"requests_from.spec_bench={out}"]), resolve=True))
    assert a[0]["workload_name"] == b[0]["workload_name"] == "spec_bench"
    assert b[0]["workload"]["source"] == "lengths" and b[0]["workload"]["export_of"]["source"] == "spec_bench"
    pa, pb = build_point(a[0]), build_point(b[0])
    assert [(r.prompt_len, r.output_len) for r in pa.requests] == [(r.prompt_len, r.output_len) for r in pb.requests]


def test_bad_lengths_files_name_the_file_and_the_fix(tmp_path):
    with pytest.raises(FileNotFoundError, match="workloads export"):
        workloads.build({"source": "lengths", "path": str(tmp_path / "none.jsonl"), "arrival": CLOSED}).requests()
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt_len": 5}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl, line 1.*prompt_len and output_len"):
        workloads.build({"source": "lengths", "path": str(bad), "arrival": CLOSED}).requests()
    with pytest.raises(ValueError, match="requests_from.sharegpt=.*workloads export"):
        point_configs(OmegaConf.to_container(compose_sweep(["workload=sharegpt", "engine=sim",
                                                           f"requests_from.sharegpt={tmp_path / 'x.jsonl'}"]), resolve=True))
