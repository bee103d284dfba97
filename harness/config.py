"""Hydra composition of ``conf/``: the one place run settings live.

Each command has its primary config (``conf/<command>.yaml``) composed with the
command line's overrides (``model=qwen35_397b draft=3,3,3``).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any, Sequence

from omegaconf import DictConfig, ListConfig, OmegaConf

from strategies import DraftTree

from .model import ModelSpec

ENV_CONF = "COMMITBENCH_CONF"
# The commands whose config gets a ``strategies`` node: every configured strategy's options
# (conf/strategies/<name>.yaml), the command line's ``strategies.<name>.<key>=`` applied.
STRATEGY_CONFIGS = {"sweep", "run", "memory", "bench_strategies", "bench_sim", "bench_kernels", "check_acceptance"}


def conf_dir() -> Path:
    """The config tree: ``$COMMITBENCH_CONF``, else ``conf/`` beside the installed packages."""
    env = os.environ.get(ENV_CONF)
    if env:
        path = Path(env)
        if not (path / "model").is_dir():
            raise FileNotFoundError(f"{ENV_CONF}={env}: no model/ folder there; point it at CommitBench's conf/")
        return path.resolve()
    path = Path(__file__).resolve().parents[1] / "conf"
    if not (path / "model").is_dir():
        raise FileNotFoundError(f"conf/ not found at {path}: install CommitBench from a checkout "
                                f"with `pip install -e .`, or set {ENV_CONF} to its conf/ folder")
    return path


def compose(config_name: str, overrides: Sequence[str] = (), quiet: bool = False) -> DictConfig:
    """``conf/<config_name>.yaml`` with Hydra overrides applied; errors name the bad override.

    ``engine=auto`` (the default engine of ``sweep`` and ``run``) is resolved before the overrides apply: the
    config is composed once without the ``engine.*`` overrides to see which engine it picks, and where that is
    ``auto``, again with ``engine=<sim|vllm>``, so ``engine.mode=graphs`` sets the engine that runs. Hydra's
    ``+key=`` adds a key only where something reads it (:func:`_check_added`). The commands that run
    strategies get their options as ``strategies`` (:mod:`harness.strategy_configs`), where
    ``strategies.<name>.<key>=`` sets one."""
    overrides = list(overrides)
    for o in overrides:
        key = o.split("=", 1)[0].lstrip("+~")
        if key == "engine.name":
            raise ValueError(f"{o}: the engine is a choice of conf/engine/, engine=sim|vllm|auto, not a key to set")
        if key == "strategies":
            raise ValueError(f"{o}: the strategies to run are strategy=[...]; conf/strategies/ holds each one's "
                             "settings (strategies.<name>.<key>=VALUE, e.g. strategies.replay.buffer_len=32)")
    settings = [o for o in overrides if o.lstrip("+~").startswith("strategies.")]
    if settings and config_name not in STRATEGY_CONFIGS:
        raise ValueError(f"{settings[0]}: {config_name} runs no strategy; strategies.<name>.<key>= applies to "
                         f"{', '.join(sorted(STRATEGY_CONFIGS))}")
    overrides = [_calibration_override(o) for o in overrides if o not in settings]
    inside = [o for o in overrides if _sets_engine_key(o)]
    cfg = _compose(config_name, [o for o in overrides if o not in inside])
    auto = (cfg.get("engine") or {}).get("name") == "auto"
    if auto:
        overrides = [o for o in overrides if not o.startswith("engine=")] \
            + [f"engine={resolve_engine('auto', quiet=quiet)}"]
    if auto or inside:
        calibrated = next((o for o in overrides if o.startswith(CALIBRATION_KEY)), None)
        if calibrated and OmegaConf.select(_compose(config_name, [o for o in overrides if o != calibrated]),
                                           "engine.name") != "sim":
            raise ValueError(f"calibration={calibrated.split('=', 1)[1]}: a calibration sets the simulator's "
                             "constants; this command's engine is not the simulator (engine=sim)")
        cfg = _compose(config_name, overrides)
    _check_added(config_name, overrides)
    if config_name in STRATEGY_CONFIGS:
        from omegaconf import open_dict

        from .strategy_configs import resolved

        with open_dict(cfg):
            cfg.strategies = resolved(settings)
    return cfg


def import_named(module: str, where: str) -> None:
    """Imports ``module``, which a config (``where``, e.g. ``conf/strategies/x.yaml``) names so that what it defines
    registers itself (a strategy, an engine, a report figure); a module that does not import is an error naming
    the config and the fix."""
    import importlib

    try:
        importlib.import_module(module)
    except ImportError as e:
        raise ValueError(f"{where}: module {module} does not import ({type(e).__name__}: {e}); put it on "
                         "PYTHONPATH or fix the name") from None


def engine_config(name: str) -> dict[str, Any]:
    """``conf/engine/<name>.yaml`` as a composed engine (its defaults included: the acceptance table of
    ``conf/acceptance/``), for code that needs an engine's settings outside a composed run config."""
    if name == "auto" or not (conf_dir() / "engine" / f"{name}.yaml").is_file():
        known = sorted(p.stem for p in (conf_dir() / "engine").glob("*.yaml") if p.stem != "auto")
        raise ValueError(f"engine={name}: no settings of its own; choose one of {', '.join(known)} (conf/engine/)")
    return OmegaConf.to_container(_compose(None, [f"+engine={name}"]))["engine"]


def _check_added(config_name: str, overrides: list[str]) -> None:
    """Hydra's ``+key=`` adds any key, and a key nothing reads is an experiment silently not run: each one must
    name a key the config has already (``++gmu=0.6``), or a new key of an open map: the server's environment
    (``engine.env``, where the engine has one) or, in a grid (sweep, run), the swept workloads' settings
    (``workload.``, which :func:`harness.grid.workload_configs` checks against the workloads)."""
    for o in overrides:
        key = o.split("=", 1)[0]
        if not key.startswith("+"):
            continue
        path = key.lstrip("+")
        base = OmegaConf.to_container(_compose(config_name, [x for x in overrides if x is not o]))
        if _select(base, path) is not _ABSENT:
            continue
        if (path.rsplit(".", 1)[0] == "engine.env" and isinstance(_select(base, "engine.env"), dict)) or \
                (path.startswith("workload.") and "workloads" in base):
            continue
        raise ValueError(f"{o}: adds a key no config has, which nothing would read "
                         f"({_nearest(config_name, path, overrides)}); '+' adds keys only to engine.env (engine=vllm) "
                         "and, in sweep and run, to the swept workloads' settings (workload.<key>=)")


_ABSENT = object()


def _select(node: Any, path: str) -> Any:
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            return _ABSENT
        node = node[part]
    return node


def _compose(config_name: str | None, overrides: list[str]) -> DictConfig:
    import re

    from hydra import compose as hydra_compose, initialize_config_dir
    from hydra.errors import HydraException

    with initialize_config_dir(config_dir=str(conf_dir()), version_base=None):
        try:
            return hydra_compose(config_name=config_name, overrides=overrides)
        except HydraException as e:
            msg = str(e).split("\nConfig search path")[0].strip()
    if m := re.match(r"Could not override '([^']+)'", msg):    # a key no config has: never '+' it
        bad = next((o for o in overrides if o.split("=", 1)[0] == m[1]), m[1])
        if m[1].startswith("engine.env."):
            raise ValueError(f"{bad}: engine.env takes new keys with '+': +{bad}")
        raise ValueError(f"{bad}: no such key; {_nearest(config_name, m[1], overrides)}")
    groups = sorted(p.name for p in conf_dir().iterdir() if p.is_dir())
    raise ValueError(f"{' '.join(overrides) or config_name}: {msg}\n"
                     f"Config groups: {', '.join(groups)} (see conf/)")


def _nearest(config_name: str, key: str, overrides: Sequence[str]) -> str:
    """"did you mean gmu?": the keys of the config the other overrides compose that are closest to ``key``."""
    import difflib

    rest = [o for o in overrides if o.split("=", 1)[0].lstrip("+~") != key]
    try:
        cfg = OmegaConf.to_container(compose(config_name, rest, quiet=True))
    except ValueError:
        return "see --cfg for the keys"
    keys = []

    def walk(node: Any, prefix: str) -> None:
        for k, v in node.items():
            keys.append(prefix + str(k))
            if isinstance(v, dict):
                walk(v, f"{prefix}{k}.")

    walk(cfg, "")
    # a key that moved under a node (buffer_len -> strategies.replay.buffer_len) is named by its last part
    near = [k for k in keys if k.rsplit(".", 1)[-1] == key.rsplit(".", 1)[-1] and k != key][:3] \
        or difflib.get_close_matches(key, keys, n=3, cutoff=0.6)
    return f"did you mean {' or '.join(near)}?" if near else "python -m harness <command> --cfg lists the keys"


# conf/engine/sim.yaml takes its constants from conf/calibration/ (a group nested in the engine, whose files merge
# into it: Hydra names the choice by its package); users write calibration=NAME
CALIBRATION_KEY = "calibration@engine.calibration="


def _calibration_override(override: str) -> str:
    """``calibration=NAME`` as Hydra addresses it; an unknown NAME is an error listing the calibrations."""
    if not override.startswith("calibration="):
        return override
    name = override.split("=", 1)[1]
    known = sorted(p.stem for p in (conf_dir() / "calibration").glob("*.yaml"))
    if name not in known:
        raise ValueError(f"{override}: no conf/calibration/{name}.yaml; calibrations: {', '.join(known)} "
                         "(python -m harness calibrate writes one)")
    return CALIBRATION_KEY + name


def _sets_engine_key(override: str) -> bool:
    """``engine.mode=graphs``, ``+engine.env.X=1``, ``~engine.x``, ``calibration=NAME``: inside the engine, not
    its choice."""
    return override.lstrip("+~").startswith("engine.") or override.startswith(CALIBRATION_KEY)


def load_model(name_or_cfg: str | Any) -> ModelSpec:
    """A model spec by name (``qwen35_35b``) or from an already composed ``model`` node."""
    if isinstance(name_or_cfg, str):
        path = conf_dir() / "model" / f"{name_or_cfg}.yaml"
        if not path.is_file():
            known = sorted(p.stem for p in (conf_dir() / "model").glob("*.yaml"))
            raise ValueError(f"model={name_or_cfg}: no conf/model/{name_or_cfg}.yaml; choose one of {', '.join(known)}")
        name_or_cfg = OmegaConf.load(path)
    return ModelSpec.from_config(name_or_cfg)


def parse_draft(spec: Any, root: bool = True) -> DraftTree:
    """A draft shape from config: ``chain:3``/``k=3`` (a chain of 3 drafts), widths
    ``3,3,3``/``[3, 3, 3]``, or an explicit ``parents:[-1,0,0]`` list."""
    if isinstance(spec, (list, tuple, ListConfig)):
        return DraftTree.from_widths([int(w) for w in spec], root=root)
    text = str(spec).strip().replace(" ", "")
    try:
        if text.startswith(("chain:", "k=")):
            return DraftTree.chain(int(text.split(":", 1)[-1].split("=", 1)[-1]), root=root)
        if text.startswith("parents:"):
            body = text.removeprefix("parents:").strip("[]()")
            return DraftTree(tuple(int(p) for p in body.split(",")), has_root=False)
        return DraftTree.from_widths([int(w) for w in text.strip("[]()").split(",")], root=root)
    except ValueError as e:
        if "invalid literal" in str(e):
            raise ValueError(f"draft={spec!r}: not a draft shape; write chain:3, 3,3,3 or parents:[-1,0,0]") from None
        raise ValueError(f"draft={spec!r}: {e}") from None


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
