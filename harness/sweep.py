"""``python -m harness sweep``: expand a grid, run its points into a result store, analyse, report.

The grid: workloads x gmu x load (closed-loop concurrency, or open-loop rates for workloads whose
arrivals are a rate) x draft shape x strategy. Every point is stored atomically; rerunning the
same command resumes (finished points are skipped, failed ones retried); Ctrl-C leaves every
finished point readable.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any, Iterable, Sequence

from omegaconf import DictConfig, OmegaConf

import strategies

from .anchor import CallLog, anchor_store, boot_id
from .anchor import pick as pick_anchor
from .budget import TimeBudget, process_age_s
from .compile_cache import compile_key, compiled_kinds, note_compiled
from .config import compose, conf_dir, parse_draft
from .point import close_engines, point_id, run_point
from .store import Store

AXES = ("workloads", "gmu", "concurrency", "rate", "strategy", "draft")
ALIASES = {"workload": "workloads", "strategies": "strategy", "drafts": "draft"}


def normalize_overrides(overrides: Sequence[str]) -> list[str]:
    """``gmu=0.6,0.75`` (Hydra's sweep syntax) → ``gmu=[0.6,0.75]`` for the grid's axes; aliases."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    out = []
    parser = OverridesParser.create()
    for text in overrides:
        key, sep, value = text.partition("=")
        if not sep:
            out.append(text)
            continue
        key = ALIASES.get(key, key)
        if key.lstrip("+").startswith("workload."):    # a setting of the swept workloads (workload_configs)
            if "," in value and not value.lstrip().startswith(("[", "{", "'", '"')):
                raise ValueError(f"{text}: only the grid's axes take several values ({', '.join(AXES)}); a "
                                 "workload setting takes one (quote a value that holds a comma)")
            out.append(f"++{key.lstrip('+')}={value}")
            continue
        if key == "draft" and value.startswith("parents:"):   # Hydra's grammar reads no ':[' inside a value
            if "]," in value:
                raise ValueError(f"{text}: several shapes with a parents list need a list of quoted shapes, "
                                 f"quoted again for the shell: 'draft=[\"parents:[-1,0,0]\",chain:3]'")
            out.append(f"draft=['{value}']")
            continue
        try:
            ov = parser.parse_override(f"{key}={value}")
        except Exception as e:
            raise ValueError(f"{text}: not a valid override ({e})") from None
        if ov.is_sweep_override():
            if key not in AXES:
                raise ValueError(f"{text}: only the grid's axes take several values ({', '.join(AXES)}); "
                                 "run one sweep per model, GPU, engine and seed")
            values = [str(v) for v in ov.sweep_string_iterator()]
            if key == "draft" and all(v.isdigit() for v in values):
                raise ValueError(f"{text}: Hydra reads this as {len(values)} drafts, one level of width "
                                 f"{' and '.join(dict.fromkeys(values))}; write draft=[{value}] for the ({value}) "
                                 f"tree, or draft=[chain:3,'{value}'] for an axis of several shapes")
            out.append(f"{key}=[{','.join(values)}]")
        else:
            out.append(f"{key}={value}")
    return out


def draft_axis(value: Any) -> list[str | None]:
    """The draft shapes a grid's ``draft`` names, one per point: a flat list of integers is one tree (``[3,3,3]``:
    the (3,3,3) tree), a list of strings or lists is an axis (``[chain:3,'3,3,3',[2,2]]``), a single shape is
    an axis of one; ``none`` (or null) is speculation off. Each shape as a string (``"3,3,3"``)."""
    if isinstance(value, (list, tuple)):
        if value and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            return [",".join(map(str, value))]
        out = []
        for v in value:
            if isinstance(v, (list, tuple)):
                out.append(",".join(map(str, v)))
            elif v is None or isinstance(v, str):
                out.append(v)
            else:
                raise ValueError(f"draft={list(value)}: {v!r} is neither a shape nor a list of widths; a list of "
                                 "integers alone is one tree (draft=[3,3,3]), an axis lists shapes "
                                 "(draft=[chain:3,'3,3,3'], quoted whole for the shell: \"draft=[chain:3,'3,3,3']\", "
                                 "or the inner quotes are lost)")
        return out
    return [value if value is None or isinstance(value, str) else str(value)]


def compose_sweep(overrides: Sequence[str]) -> DictConfig:
    return compose("sweep", normalize_overrides(overrides))


def _as_list(x) -> list:
    if x is None:
        return []
    return list(x) if isinstance(x, (list, tuple)) else [x]


def resolve_engine(name: str, quiet: bool = False) -> str:
    """``auto``: vLLM when a CUDA GPU and vLLM are importable, else the simulator; says which."""
    if name != "auto":
        return name
    try:
        import torch

        cuda = torch.cuda.is_available()
    except ImportError:  # pragma: no cover
        cuda = False
    try:
        import vllm  # noqa: F401
        have_vllm = True
    except ImportError:
        have_vllm = False
    if cuda and have_vllm:
        if not quiet:
            print("engine=auto: a CUDA GPU and vLLM are here: using vLLM (engine: vllm)", file=sys.stderr)
        return "vllm"
    why = "no CUDA GPU" if not cuda else "vLLM not installed"
    if not quiet:
        print(f"engine=auto: using the simulator (engine: sim): {why}; engine=vllm forces vLLM", file=sys.stderr)
    return "sim"


def validate(cfg: dict[str, Any]) -> None:
    """Clear errors, naming the input and the valid choices, before anything runs."""
    known_wl = sorted(p.stem for p in (conf_dir() / "workload").glob("*.yaml"))
    for w in _as_list(cfg.get("workloads")):
        if w not in known_wl:
            raise ValueError(f"workload={w}: unknown; choose from {', '.join(known_wl)} (conf/workload/)")
    for g in _as_list(cfg.get("gmu")):
        if not isinstance(g, (int, float)) or not 0 < float(g) <= 1:
            raise ValueError(f"gmu={g}: must be in (0, 1]")
    kv = (cfg.get("engine") or {}).get("kv_cache_bytes")
    if kv is not None and (not isinstance(kv, int) or isinstance(kv, bool) or kv <= 0):  # True is an int
        raise ValueError(f"engine.kv_cache_bytes={kv}: must be a whole number of bytes > 0 (or null to size the "
                         "pool from gmu)")
    if kv and len(_as_list(cfg.get("gmu"))) > 1:
        raise ValueError(f"gmu={_as_list(cfg.get('gmu'))} with engine.kv_cache_bytes={kv}: the pool is sized by "
                         "kv_cache_bytes, so every gmu would run the same point; give one gmu, or "
                         "engine.kv_cache_bytes=null to sweep gmu")
    for s in _as_list(cfg.get("strategy")):
        if s not in strategies.names():
            raise ValueError(f"strategy={s}: unknown; choose from {', '.join(strategies.names())}")
    for c in _as_list(cfg.get("concurrency")):
        if not isinstance(c, int) or c < 1:
            raise ValueError(f"concurrency={c}: must be a whole number >= 1")
    for r in _as_list(cfg.get("rate")):
        if not isinstance(r, (int, float)) or r <= 0:
            raise ValueError(f"rate={r}: must be > 0 requests/s")
    for d in draft_axis(cfg.get("draft")):
        if d not in (None, "none"):
            tree = parse_draft(d, root=True)
            if tree.num_drafts < 1:
                raise ValueError(f"draft={d}: a draft needs at least one token; draft=none is speculation off")
    for axis in AXES:
        if axis in cfg and isinstance(cfg[axis], (list, tuple)) and not cfg[axis]:
            raise ValueError(f"{axis}=[]: the grid needs at least one value on every axis")
    seed = cfg.get("seed", 0)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"seed={seed}: one whole number per sweep; run one sweep per seed (out=DIR each)")
    jobs = cfg.get("jobs", 1)
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise ValueError(f"jobs={jobs}: must be a whole number >= 1 (points run in parallel on this machine)")


def point_configs(cfg: dict[str, Any]) -> list[dict[str, Any]]:
    """Every point of the grid as a plain, fully resolved config (see harness.point)."""
    cfg = dict(cfg)
    if cfg.get("workload") and isinstance(cfg["workload"], str):   # a point job's scalar axes
        cfg["workloads"] = [cfg["workload"]]
    validate(cfg)
    engine = dict(cfg["engine"])
    engine_name = resolve_engine(engine["name"], quiet=True)
    if engine_name != engine["name"]:     # a config composed without harness.config.compose (which resolves auto)
        if set(engine) != {"name"}:
            raise ValueError(f"engine=auto with engine.{', engine.'.join(sorted(set(engine) - {'name'}))} set: auto "
                             f"has no settings of its own; name the engine (engine={engine_name}) or compose the "
                             "config with harness.config.compose, which resolves auto first")
        engine = OmegaConf.to_container(OmegaConf.load(conf_dir() / "engine" / f"{engine_name}.yaml"))
    rule = cfg["requests"]
    names = _as_list(cfg["workloads"])
    settings = cfg.get("workload") if isinstance(cfg.get("workload"), dict) else {}
    out = []
    for wname, wl in zip(names, workload_configs(names, settings)):
        if (cfg.get("replay") or {}).get(wname):
            wl = replayed(wl, cfg["replay"][wname], wname)
        kind = (wl.get("arrival") or {}).get("kind", "closed")
        if kind == "trace":
            raise ValueError(f"workload={wname} with arrival.kind=trace: a sweep offers open-loop load at the rates "
                             f"of its rate axis, and a trace's timestamps set their own; use arrival.kind=poisson or "
                             f"gamma (workload.arrival.kind=poisson), or see the trace with `python -m harness "
                             f"workloads describe workload={wname} workload.arrival.kind=trace`")
        if kind == "closed":
            loads = [({"kind": "closed", "concurrency": int(c)},
                      max(int(rule["min"]), int(rule["per_concurrency"]) * int(c)))
                     for c in _as_list(cfg["concurrency"])]
        else:
            burst = float((wl.get("arrival") or {}).get("burstiness") or 1.0)
            loads = [({"kind": kind, "rate": float(r), "burstiness": burst},
                      max(int(rule["min"]), int(float(rule["per_rate"]) * float(r))))
                     for r in _as_list(cfg["rate"])]
        for gmu in _as_list(cfg["gmu"]):
            for load, n in loads:
                for draft in draft_axis(cfg["draft"]):
                    no_spec = draft in (None, "none")
                    # Speculation off is one baseline per (workload, gmu, load): no strategy is involved (vLLM
                    # runs its own path, the plugin stays inert), so it runs once, recorded under store_all.
                    for strategy in (["store_all"] if no_spec else _as_list(cfg["strategy"])):
                        out.append({
                            "model": cfg["model"], "gpu": cfg["gpu"], "engine": engine, "workload": wl,
                            "workload_name": wname, "strategy": strategy,
                            "draft": None if no_spec else draft, "gmu": float(gmu), "load": load,
                            "requests": n, "max_num_seqs": cfg["max_num_seqs"],
                            "max_num_batched_tokens": cfg["max_num_batched_tokens"],
                            "max_model_len": cfg["max_model_len"], "seed": cfg.get("seed", 0)})
    return out


def workload_configs(names: Sequence[str], settings: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Each swept workload's config (``conf/workload/<name>.yaml``) with the ``workload.`` settings merged in:
    ``workload.<name>.<key>=`` sets that workload (``workload.burstgpt.path=FILE`` in a grid of several),
    ``workload.<key>=`` every swept workload that has the key (``workload.seed=3``). A key its workloads do not
    have is an error naming the closest keys, never dropped; the points record the merged configs."""
    import difflib

    loaded = [OmegaConf.load(conf_dir() / "workload" / f"{n}.yaml") for n in names]
    settings = dict(settings or {})
    scoped = [(names.index(n), settings.pop(n)) for n in list(settings) if n in names]
    for i, given in scoped:
        if not isinstance(given, dict):
            raise ValueError(f"workload.{names[i]}={given}: set that workload's keys, e.g. "
                             f"workload.{names[i]}.path=FILE")
    for targets, given, label in [(range(len(names)), settings, "")] + \
            [([i], given, f"{names[i]}.") for i, given in scoped]:
        for key, value in _flat(given):
            took = False
            for i in targets:
                if _settable(loaded[i], key):
                    loaded[i], took = OmegaConf.merge(loaded[i], _nested(key, value)), True
            if not took:
                keys = sorted({k for i in targets for k, _ in _flat(OmegaConf.to_container(loaded[i]))})
                near = difflib.get_close_matches(key, keys, n=3) or keys[:8]
                whose = f"{names[targets[0]]} has no" if label else \
                    f"none of the swept workloads ({', '.join(names)}) has"
                raise ValueError(f"workload.{label}{key}={value}: {whose} {key}; "
                                 f"did you mean {' or '.join(f'workload.{label}{k}' for k in near)}?")
    return [OmegaConf.to_container(w, resolve=True) for w in loaded]


def _settable(workload: DictConfig, key: str) -> bool:
    """Whether ``key`` names a setting of ``workload``: a key it has, or one below a key it leaves null (most
    workloads leave ``filters`` null; ``workload.filters.max_prompt_len=1024`` sets one)."""
    parts = key.split(".")
    for n in range(len(parts), 0, -1):
        found = OmegaConf.select(workload, ".".join(parts[:n]), throw_on_missing=False, default=_ABSENT)
        if found is not _ABSENT:
            return n == len(parts) or found is None
    return False


_ABSENT = object()


def _flat(d: dict[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    """``{"arrival": {"kind": "poisson"}}`` → ``[("arrival.kind", "poisson")]``; a leaf is a non-dict value."""
    items = []
    for k, v in d.items():
        if isinstance(v, dict) and v:
            items += _flat(v, f"{prefix}{k}.")
        else:
            items.append((f"{prefix}{k}", v))
    return items


def _nested(key: str, value: Any) -> dict[str, Any]:
    """``("arrival.kind", "poisson")`` → ``{"arrival": {"kind": "poisson"}}`` (the value as it is: no reparsing)."""
    *path, last = key.split(".")
    node: dict[str, Any] = {last: value}
    for part in reversed(path):
        node = {part: node}
    return node


def replayed(wl: dict[str, Any], path: str, name: str) -> dict[str, Any]:
    """``replay.<workload>=FILE``: the same requests from an export (``workloads export``), e.g. on a
    host without the dataset; the point keeps the workload's name and says where they came from."""
    if not Path(path).expanduser().is_file():
        raise ValueError(f"replay.{name}={path}: no such file; write it with `python -m harness workloads export "
                         f"workload={name} out={path}` where the dataset is")
    return {"source": "lengths", "path": str(path), "shuffle": False, "filters": None, "seed": wl.get("seed", 0),
            "arrival": wl.get("arrival"), "num_requests": wl.get("num_requests"), "replay_of": wl}


def default_out(cfg: dict[str, Any]) -> Path:
    engine = resolve_engine(cfg["engine"]["name"], quiet=True)
    name = f"{cfg.get('sweep_name', 'sweep')}-{cfg['model']['name']}-{cfg['gpu']['name']}-{engine}"
    return Path("results") / "sweeps" / name


def run(cfg: DictConfig) -> int:
    from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn,
                               TimeRemainingColumn)

    from .console import console as make_console

    c = OmegaConf.to_container(cfg, resolve=True)
    resolve_engine(c["engine"]["name"])
    validate(c)
    if c.get("baseline") not in _as_list(c.get("strategy")):
        raise ValueError(f"baseline={c.get('baseline')}: must be one of the swept strategies "
                         f"{_as_list(c.get('strategy'))} (it decides which points are memory-bound)")
    points = point_configs(c)
    anchor = pick_anchor(points, c.get("anchor"), c["baseline"])    # before the folder is touched
    engine_name = points[0]["engine"]["name"] if points else "-"
    budget = None
    if c.get("time_budget_s") is not None:                            # so is the budget (and its clock starts)
        shared = engine_name == "vllm"
        budget = TimeBudget(c["time_budget_s"], server_key if shared else None, compile_key if shared else None,
                            spent_s=process_age_s())
        if int(c.get("jobs", 1)) > 1:
            raise ValueError(f"time_budget_s={c['time_budget_s']} with jobs={c.get('jobs')}: the budget decides "
                             "before each point, one at a time; use jobs=1, or time_budget_s=null")
    out = Path(c["out"]) if c.get("out") else default_out(c)
    store = Store(out)
    # time_budget_s belongs to the command, not to the experiment: calls.json records it, sweep.json does not
    store.init({k: v for k, v in c.items() if k not in ("model", "gpu", "time_budget_s")}
               | {"model": c["model"]["name"], "gpu": c["gpu"]["name"]})
    todo = []
    for p in points:
        status = store.status(point_id(p))
        if status == "ok" or (status == "failed" and not c.get("retry_failed", True)):
            continue
        todo.append(p)
    if engine_name == "vllm":
        if int(c.get("jobs", 1)) > 1:
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
            for s in _execute(runs, int(c.get("jobs", 1)), budget, stop):
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
    from analysis.sweep import analyze, write_analysis

    from .summary import print_summary

    result = analyze(store)
    write_analysis(store, result)
    report_path = None
    if c.get("report", True):
        from reports.build import build_report

        report_path = build_report(store, result)
    print_summary(result, console, report_path)
    return 0


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
    return (p["gmu"], p.get("draft") or "", p["strategy"], p["max_num_seqs"], p["max_model_len"])


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
