"""``python -m harness sweep``: run a grid's points (harness.grid) into a result store, analyse, report.

The order (the anchor first, then one server start per kind), the time budget, resume: every point is stored
atomically; rerunning the
same command resumes (finished points are skipped, failed ones retried); Ctrl-C leaves every
finished point readable.
"""

from __future__ import annotations

import itertools
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any, Iterable

from omegaconf import DictConfig, OmegaConf

from .anchor import CallLog, anchor_store, boot_id
from .anchor import pick as pick_anchor
from .budget import TimeBudget, process_age_s
from .compile_cache import compile_key, compiled_kinds, note_compiled
from .config import resolve_engine
from .grid import AXES, as_list, point_configs, validate
from .point import close_engines, point_id, run_point
from .identity import sweep_identity, with_hash
from .store import IdentityMismatch, Store


def default_out(cfg: dict[str, Any]) -> Path:
    engine = resolve_engine(cfg["engine"]["name"], quiet=True)
    name = f"{cfg.get('sweep_name', 'sweep')}-{cfg['model']['name']}-{cfg['gpu']['name']}-{engine}"
    return Path("results") / "sweeps" / name


def run(cfg: DictConfig) -> int:
    c = OmegaConf.to_container(cfg, resolve=True)
    resolve_engine(c["engine"]["name"])
    validate(c)
    if c.get("baseline") not in as_list(c.get("strategy")):
        raise ValueError(f"baseline={c.get('baseline')}: must be one of the swept strategies "
                         f"{as_list(c.get('strategy'))} (it decides which points are memory-bound)")
    points = point_configs(c)
    anchor = pick_anchor(points, c.get("anchor"), c["baseline"])    # before the folder is touched
    engine_name = points[0]["engine"]["name"] if points else "-"
    budget = None
    if c.get("time_budget_s") is not None:                            # so is the budget (and its clock starts)
        shared = engine_name == "vllm"
        budget = TimeBudget(c["time_budget_s"], server_key if shared else None, compile_key if shared else None,
                            spent_s=process_age_s())
        if int(c["jobs"]) > 1:
            raise ValueError(f"time_budget_s={c['time_budget_s']} with jobs={c.get('jobs')}: the budget decides "
                             "before each point, one at a time; use jobs=1, or time_budget_s=null")
    out = Path(c["out"]) if c.get("out") else default_out(c)
    identity = with_hash(sweep_identity(points, c["baseline"], c.get("thresholds"), c.get("requests")))
    store, stack = claim(out, identity, c.get("identity_mismatch", "refuse"))
    with stack:
        return _run(c, points, anchor, engine_name, budget, store, identity)


def claim(out: Path, identity: dict[str, Any], on_mismatch: str) -> tuple[Store, ExitStack]:
    """The store this command writes into, locked for it (a second writer fails at once, naming the first), and
    checked to hold the same experiment (:mod:`harness.identity`): on a mismatch, refused, or with
    ``identity_mismatch=new_folder`` the next free ``<out>-N``, said so. Nothing is written before this."""
    if on_mismatch not in ("refuse", "new_folder"):
        raise ValueError(f"identity_mismatch={on_mismatch}: choose refuse (the default) or new_folder")
    for n in itertools.count(1):
        folder = out if n == 1 else out.with_name(f"{out.name}-{n}")
        if folder.exists() and not folder.is_dir():
            if n > 1:
                continue
            raise ValueError(f"out={folder}: a file, not a folder; give a folder (it is created if missing)")
        store = Store(folder)
        try:
            store.root.mkdir(parents=True, exist_ok=True)
            tempfile.NamedTemporaryFile(dir=store.root, prefix=".write-test.").close()
        except OSError as e:
            raise ValueError(f"out={folder}: cannot write there ({type(e).__name__}: {e.strerror or e}); give a "
                             "folder you can write to") from None
        stack = ExitStack()
        stack.enter_context(store.lock())
        try:
            store.check_identity(identity)
        except IdentityMismatch as e:
            stack.close()
            if on_mismatch == "refuse":
                raise
            print(f"identity_mismatch=new_folder: {folder} holds another experiment ({e.diff[0]}, ...)")
            continue
        if folder != out:
            print(f"identity_mismatch=new_folder: writing into {folder}")
        return store, stack
    raise AssertionError("unreachable")


def _run(c: dict[str, Any], points: list[dict[str, Any]], anchor: dict[str, Any] | None, engine_name: str,
         budget: TimeBudget | None, store: Store, identity: dict[str, Any]) -> int:
    from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn,
                               TimeRemainingColumn)

    from .console import console as make_console

    out = store.root
    # time_budget_s belongs to the command, not to the experiment: calls.json records it, sweep.json does not.
    # The grid is the union of the grids run into the folder, so sweep.json describes every point it holds.
    store.init(grown(store.sweep_config(), {k: v for k, v in c.items() if k not in ("model", "gpu", "time_budget_s")}
                     | {"model": c["model"]["name"], "gpu": c["gpu"]["name"], "identity": identity}))
    todo, damaged = [], {}
    for p in points:
        status = store.status(point_id(p))
        if status == "ok" or (status == "failed" and not c["retry_failed"]):
            continue
        if status == "damaged":
            damaged[point_id(p)] = store.damage(point_id(p))
        todo.append(p)
    if engine_name == "vllm":
        if int(c["jobs"]) > 1:
            raise ValueError(f"jobs={c.get('jobs')}: engine=vllm points share one server and GPU; use jobs=1")
    calls = CallLog(out)
    # the kinds whose graphs this host's caches hold run first (a budget also counts the kinds this host ran)
    compiled = set(compiled_kinds(points[0])) if engine_name == "vllm" else set()
    if budget is not None:
        budget_history(budget, store, calls, points, compiled)
    warm = budget.warm if budget else compiled
    todo = run_order(todo, anchor, engine_name == "vllm", grid=points, warm=warm)
    remeasure = anchor is not None and bool(todo) and store.status(point_id(anchor)) == "ok"
    console = make_console()
    console.print(f"[bold]sweep {c.get('sweep_name')}[/]: {len(points)} points, {len(points) - len(todo)} already "
                  f"in {out}, {len(todo)} to run (engine: {engine_name})"
                  + (f"; anchor {point_id(anchor)} measured again first" if remeasure else ""))
    for pid, why in damaged.items():
        console.print(f"  [yellow]damaged[/]: {pid}: {why}; runs again")
    call = calls.begin(point_id(anchor) if anchor else None, remeasure) if todo else None
    if call is not None and budget is not None:
        call["time_budget_s"] = budget.seconds
    runs = [(anchor, anchor_store(out, call))] if remeasure else []
    runs += [(p, store) for p in todo]
    by_id = {point_id(p): p for p, _ in runs}
    t0 = time.perf_counter()
    failed = 0
    stop: dict[str, Any] = {}
    try:
        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      TextColumn("ETA"), TimeRemainingColumn(), console=console, transient=False) as bar:
            task = bar.add_task("points", total=len(runs))
            for s in _execute(runs, int(c["jobs"]), budget, stop):
                failed += s["status"] != "ok"
                calls.finished(call, s["point_id"])
                if engine_name == "vllm" and s["status"] == "ok":     # its graphs are in vLLM's caches now
                    note_compiled([by_id[s["point_id"]]])
                bar.update(task, advance=1, description=f"{s['point_id'][:60]:<60}")
    except KeyboardInterrupt:
        done = sum(1 for _ in store.summaries())
        console.print(f"interrupted: {done} points are stored and readable in {out}; rerun the same command to "
                      "resume")
        return 130
    finally:
        close_engines()
        if call is not None:
            if stop:     # why this command left points to the next one, for whoever reads the call log
                call["stopped"] = {"by": "time_budget_s", "budget_s": budget.seconds,
                                   "before": stop["point_id"], "estimate_s": round(stop["estimate_s"], 1),
                                   "left_s": round(stop["left_s"], 1), "points_left": stop["points_left"]}
            calls.end(call)
    ran = len(runs) - stop.get("points_left", 0)
    console.print(f"ran {ran} points in {time.perf_counter() - t0:.1f} s ({failed} failed)")
    if stop:
        est = f"{stop['estimate_s']:.0f} s expected" + (" with a server start" if stop["opens_server"] else "")
        console.print(f"[bold]time_budget_s={c['time_budget_s']}[/]: stopped before {stop['point_id']} ({est}, "
                      f"{max(stop['left_s'], 0):.0f} s left); {stop['points_left']} points left for the next "
                      "command: rerun the same command to resume")
    from analysis.goodput import SLO
    from analysis.sweep import analyze, write_analysis

    from .summary import print_summary

    result = analyze(store, slo=SLO.from_config(c.get("slo")))
    write_analysis(store, result)
    report_path = None
    if c["report"] and result["counts"]["ok"]:
        from analysis.metrics import Percentiles
        from reports.build import build_report

        report_path = build_report(store, result, Percentiles.from_config(c.get("percentiles")))
    elif c["report"]:
        console.print(f"no report: no point in {out} finished (the reasons are below)")
    print_summary(result, console, report_path)
    # a grid point left failed (now, or by an earlier command that this one did not retry) fails the command:
    # its numbers are missing from every ratio, and scripts driving the sweep must see it
    failed_now = [point_id(p) for p in points if store.status(point_id(p)) == "failed"]
    if failed_now:
        console.print(f"[bold red]{len(failed_now)} of {len(points)} points failed[/] (exit status 1); a rerun of the "
                      "same command retries them" + ("" if c["retry_failed"] else " with retry_failed=true"))
    return 1 if failed_now else 0


def grown(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """sweep.json for a folder that held ``old`` after a command with ``new``: the new command's settings, each
    grid axis the union of both (old values first), the identity's workloads and variants those of both, and a
    union of sub-grids (``grids``) every sub-grid of both."""
    out = dict(new)
    for axis in AXES:
        if axis in old and axis in new:
            merged = as_list(old[axis]) + [v for v in as_list(new[axis]) if v not in as_list(old[axis])]
            out[axis] = merged if isinstance(new[axis], list) or len(merged) > 1 else merged[0]
    if (old.get("identity") or {}).get("workloads"):
        out["identity"] = {**new["identity"],
                           "workloads": {**old["identity"]["workloads"], **new["identity"]["workloads"]}}
    held, ident = old.get("identity") or {}, out.get("identity")
    if ident is not None and held.get("variants"):
        ident = out["identity"] = {**ident, "variants": {**held["variants"], **(ident.get("variants") or {})}}
    if ident is not None and "engine" not in ident and held.get("engine"):  # a command that ran only a variant's points
        out["identity"] = {**ident, "engine": held["engine"]}
    if old.get("grids") and new.get("grids") is not None:   # a union of sub-grids: each once, old ones first
        out["grids"] = list(old["grids"]) + [g for g in new["grids"] if g not in old["grids"]]
    return out


def run_order(todo: list[dict[str, Any]], anchor: dict[str, Any] | None, shared_server: bool,
              grid: list[dict[str, Any]] | None = None, warm: Iterable[tuple] = ()) -> list[dict[str, Any]]:
    """The order a command runs its points in. The anchor first, so a call cut short by its time limit still
    has it (measured as a grid point the first time, again into anchors/ by every later command). On a shared
    server (vLLM) points with equal :func:`server_key` run back to back, one start per (gmu, draft, strategy),
    those of the anchor's server first, since the anchor has just started it. Then the servers whose start is
    cheap (~90-105 s on the H200 instead of 250-370 s): those of the anchor's kind (:func:`compile_key`), whose
    graphs the anchor's start has just compiled, and those of the kinds in ``warm`` (compile keys whose graphs
    this host's caches hold), all in the order of ``grid``, so a call with little time left runs the config's
    first points among them. Then the cold kinds, one kind at a time (each start after its first loads the
    compiled graphs), kinds and servers in the order of ``grid``. ``grid`` is the whole grid, done points
    included (default ``todo``): its gmu, strategies and drafts as the config lists them, so a campaign cut
    short has the first ones, and a kind whose first points are done keeps its place rather than moving behind
    kinds that come later in the config. The simulator keeps the grid's order throughout."""
    out = list(todo)
    if shared_server:
        first = server_key(anchor) if anchor is not None else None
        cheap = set(warm) | ({compile_key(anchor)} if anchor is not None else set())
        ordered = list(grid if grid is not None else out) + out            # kinds and servers not in grid go last
        kinds = {k: i for i, k in reversed(list(enumerate(compile_key(p) for p in ordered)))}  # first appearance
        servers = {k: i for i, k in reversed(list(enumerate(server_key(p) for p in ordered)))}
        out.sort(key=lambda p: (server_key(p) != first, compile_key(p) not in cheap,
                                0 if compile_key(p) in cheap else kinds[compile_key(p)], servers[server_key(p)]))
    if anchor is not None and anchor in out:
        out.remove(anchor)
        out.insert(0, anchor)
    return out


def server_key(p: dict[str, Any]) -> tuple:
    """What decides a vLLM server's settings; points with equal keys reuse one server."""
    return (p["gmu"], p.get("draft") or "", p["strategy"], p["max_num_seqs"], p["max_model_len"],
            p.get("variant") or "")


def budget_history(budget: TimeBudget, store: Store, calls: CallLog, points: list[dict[str, Any]],
                   compiled: Iterable[tuple] = ()) -> None:
    """What the folder tells the budget: the timings of its finished points and anchors, oldest first (how long
    a warm and a cold server start take; the latest run, for the command's first point), and which kinds of
    server this host (same boot) started and ran a point on in earlier commands, whose compiled graphs its
    caches still hold. ``compiled``: kinds whose graphs the caches hold by their notes
    (:func:`harness.compile_cache.compiled_kinds`), e.g. restored from another host; warm too."""
    summaries = list(store.summaries())
    for anchors in sorted((store.root / "anchors").glob("call-*")):
        summaries += list(Store(anchors).summaries())
    summaries.sort(key=lambda x: (x.get("provenance") or {}).get("time_utc") or "")
    budget.learn(summaries)
    ok = {x.get("point_id") for x in summaries if x.get("status") == "ok"}
    boot = boot_id()
    by_id = {point_id(p): p for p in points}
    budget.warm |= {compile_key(by_id[i]) for call in calls.calls if boot and call.get("boot_id") == boot
                    for i in call.get("points", []) if i in by_id and i in ok}
    budget.warm |= set(compiled)


def _execute(runs: list[tuple[dict[str, Any], Store]], jobs: int, budget: TimeBudget | None = None,
             stop: dict[str, Any] | None = None):
    """Run each (point, store it goes to) pair; yields the summaries as they finish. With a ``budget`` (jobs=1)
    it stops before the first point not expected to fit and says why in ``stop``."""
    if budget is not None and (jobs > 1 or stop is None):
        raise ValueError("_execute: a budget needs jobs=1 and a stop dict to say why it stopped")
    if jobs <= 1:
        for i, (p, store) in enumerate(runs):
            if budget is None:
                yield run_point(p, store)
                continue
            fits, est = budget.fits(p)
            if not fits:
                stop.update(point_id=point_id(p), estimate_s=est, left_s=budget.left(),
                            opens_server=budget.opens_server(p), points_left=len(runs) - i)
                return
            t = budget.clock()
            s = run_point(p, store)
            budget.record(p, budget.clock() - t, s)
            yield s
        return
    from joblib import Parallel, delayed

    yield from Parallel(n_jobs=jobs, return_as="generator_unordered")(delayed(run_point)(p, st) for p, st in runs)
