"""``python -m harness <command> [hydra overrides...]``.

Every command composes its config from ``conf/`` (``conf/<command>.yaml``) and
takes Hydra overrides after it, e.g. ``python -m harness memory model=qwen35_397b``.
Only commands that exist are listed.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Callable


def _sweep_names() -> str:
    """The grids in the config tree's sweep/ (default first), so the help lists each one that exists."""
    from .config import conf_dir

    try:
        names = sorted(f.stem for f in (conf_dir() / "sweep").glob("*.yaml"))
    except FileNotFoundError:     # no config tree: every command says so, with the fix, when it runs
        names = []
    return "|".join(["default"] + [n for n in names if n != "default"])

# (command words, config name, one-line help, runner module:function, positional args)
COMMANDS: list[tuple[tuple[str, ...], str, str, str, tuple[str, ...]]] = [
    (("sweep",), "sweep",
     f"run a grid (sweep={_sweep_names()}, gmu=0.6,0.9, strategy=..., "
     "engine=auto|sim|vllm) into a result folder, resumable; analyse it and write report.html / report.pdf",
     "harness.sweep:run", ()),
    (("run",), "run", "one point (workload=, gmu=, concurrency= or rate=, strategy=, draft=) into out=DIR",
     "harness.results_cli:run_one", ()),
    (("analyze",), "analyze", "memory-bound points and regime-split ratios of a result folder",
     "harness.results_cli:analyze_cmd", ("dir",)),
    (("report",), "report", "write report.html and report.pdf for a result folder, or one report of several "
     "(report DIR DIR ... baseline=STRATEGY out=DIR)",
     "harness.results_cli:report_cmd", ("dir",)),
    (("compare",), "compare", "two result folders point by point (e.g. sim against vllm)",
     "harness.results_cli:compare_cmd", ("a", "b")),
    (("calibrate",), "calibrate",
     "fit the simulator's constants to measured vLLM runs (calibrate DIR DIR ... layer=FILE split=workload): "
     "writes conf/calibration/<name>.yaml, its fit and held-out errors",
     "harness.calibrate:run", ("dir",)),
    (("check-acceptance",), "check_acceptance",
     "the acceptance-length gate: every strategy reproduces the reference's decoding (exit status = verdict)",
     "harness.acceptance.cli:run", ()),
    (("acceptance", "train"), "acceptance_train",
     "train the small Qwen3-Next whose MTP head drafts (2 CPU cores, ~10 min) into a Hugging Face model dir",
     "harness.acceptance.cli:train", ()),
    (("acceptance", "vllm"), "acceptance_vllm",
     "the acceptance gate inside vLLM on the trained model: every strategy against store_all, speculation off "
     "and the torch reference (exit status = verdict)",
     "harness.acceptance.cli:vllm_gate", ()),
    (("checkpoints",), "checkpoints",
     "the fork/checkpoint write-up's claims on real states and drafts: draft confidences, selective fork's skipped "
     "checkpoints and recoveries, delta checkpoints' compression per GDN layer (CPU, ~30 s)",
     "harness.checkpoints:run", ()),
    (("memory",), "memory",
     "speculative GDN state per request for each strategy and draft shape (model=..., drafts=...)",
     "harness.memory_table:run", ()),
    (("workloads", "describe"), "workloads_describe",
     "a workload's request count, length percentiles and histograms (workload=sharegpt|spec_bench|...)",
     "harness.workloads_cli:describe", ()),
    (("workloads", "export"), "workloads_export",
     "a workload's requests as a JSONL of lengths (out=FILE), replayable anywhere with workload.source=lengths",
     "harness.workloads_cli:export", ()),
    (("workloads", "build-tokenizer"), "workloads_build_tokenizer",
     "retrain the bundled fallback BPE tokenizer from the ShareGPT package",
     "harness.workloads_cli:build_tokenizer", ()),
    (("bench", "strategies"), "bench_strategies",
     "CPU micro-benchmark: each strategy's verify+commit time relative to store_all, and its state bytes",
     "harness.bench.strategies:run", ()),
    (("bench", "sim"), "bench_sim",
     "the paper's 35B grid on the simulator, every strategy: memory-bound count, ratios, wall time",
     "harness.bench.sim:run", ()),
    (("bench", "workloads"), "bench_workloads",
     "time loading the whole ShareGPT package, cold and from the cache",
     "harness.workloads_cli:bench", ()),
    (("bench", "kernels"), "bench_kernels",
     "the strategies' Triton kernels on a CUDA GPU: time, bytes and bandwidth vs the copy roofline, solve vs N",
     "harness.bench.kernels:run", ()),
    (("bench", "loadgen"), "bench_loadgen",
     "the streaming load generator against a stub server: achieved rate and schedule lag (rate=500, chunks=16)",
     "harness.bench.loadgen:run", ()),
]
# Commands that take more than one result folder (report DIR DIR ... out=DIR).
MANY_FOLDERS = {"report", "calibrate"}
# Commands whose overrides may use Hydra's sweep syntax on the grid's axes (gmu=0.6,0.9).
GRID_CONFIGS = {"sweep", "run"}


def _runner(target: str) -> Callable:
    import importlib

    module, func = target.split(":")
    return getattr(importlib.import_module(module), func)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m harness",
        description="CommitBench: how GDN state-commit strategies pay for speculative decoding.",
        epilog="Overrides are Hydra's: key=value, group=option (e.g. model=qwen35_397b). "
               "Configs live in conf/.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    groups: dict[str, argparse._SubParsersAction] = {}
    for words, config, help_text, target, positional in COMMANDS:
        if len(words) == 1:
            p = sub.add_parser(words[0], help=help_text, description=help_text)
        else:
            if words[0] not in groups:
                gp = sub.add_parser(words[0], help=f"{words[0]} " + "|".join(
                    w[1] for w, *_ in COMMANDS if w[0] == words[0] and len(w) > 1))
                groups[words[0]] = gp.add_subparsers(dest="subcommand", metavar="NAME", required=True)
            p = groups[words[0]].add_parser(words[1], help=help_text, description=help_text)
        for name in positional:
            p.add_argument(name, metavar=name.upper() if name != "dir" else "DIR", help="a result folder")
        p.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help=f"overrides for conf/{config}.yaml")
        p.add_argument("--cfg", action="store_true", help="print the composed config and exit")
        p.set_defaults(config=config, target=target, positional=positional)
    return parser


def _folder(name: str, value: str) -> str:
    """A positional result folder. ``out=DIR`` / ``dir=DIR`` (how ``sweep`` names its folder) mean DIR."""
    import os

    key, sep, rest = value.partition("=")
    if sep and key in ("out", "dir", name) and not os.path.exists(value):
        return rest
    if sep and not os.path.exists(value):
        raise ValueError(f"{name.upper()} is a result folder given as a plain path "
                         f"(e.g. python -m harness analyze results/sweeps/quick), got {value!r}")
    return value


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "config", None):
        parser.print_help()
        return 0 if args.command is None else 2
    from .config import compose

    try:
        extra = list(args.overrides)
        folders = []
        if args.config in MANY_FOLDERS:     # report DIR DIR ...: the words without "=" are further folders
            folders = [w for w in extra if "=" not in w]
            extra = [w for w in extra if "=" in w]
            missing = [w for w in folders if not os.path.isdir(w)]
            if missing:
                raise ValueError(f"{missing[0]}: not a folder; report takes result folders, then settings as "
                                 "key=value (report DIR DIR baseline=store_all out=DIR)")
        overrides = [f"{name}={_folder(name, getattr(args, name))}" for name in args.positional] + extra
        if args.config in GRID_CONFIGS:
            from .grid import normalize_overrides

            overrides = normalize_overrides(overrides)
        cfg = compose(args.config, overrides)
        if folders:
            from omegaconf import open_dict

            with open_dict(cfg):      # paths as they are: a Hydra list override would parse commas and quotes
                cfg.more = folders
        if args.cfg:
            from omegaconf import OmegaConf

            points = None
            if args.config in GRID_CONFIGS:    # what the command would refuse before its first point, --cfg too
                from .grid import point_configs
                from .point import point_id

                points = [point_id(p) for p in point_configs(OmegaConf.to_container(cfg, resolve=True))]
            print(OmegaConf.to_yaml(cfg))
            if points and len(points) > 1:     # the grid as it expands (a union of sub-grids is not the axes' product)
                print(f"# the grid: {len(points)} points\n" + "\n".join(f"#   {i}" for i in points))
            return 0
        return int(_runner(args.target)(cfg) or 0)
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
