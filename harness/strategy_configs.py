"""Each strategy's config, ``conf/strategies/<name>.yaml``: the module that registers it and the options a run
gives it.

A strategy is one module (its ``@strategies.register(name)`` class: math, footprint, traffic, whether it takes
trees) plus one config here. Reading the config tree imports every named module, so a strategy added as a
module outside ``strategies/`` (on ``PYTHONPATH``) and a config file is in ``strategies.names()`` for every
command: the memory table, the grid, the simulator, the benchmarks and the acceptance gate. The defaults that
define a strategy's math stay in its module; the config sets a run's value (``options``), and the command line
overrides it with ``strategies.<name>.<key>=VALUE``.

    {"replay": {"buffer_len": 16}, "store_all": {}, ...} = options()
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence

from omegaconf import OmegaConf

import strategies

from .config import conf_dir, import_named

_LOADED: dict[Path, dict[str, dict[str, Any]]] = {}


def options() -> dict[str, dict[str, Any]]:
    """Every configured strategy's run options, by name (a copy); importing the modules registers them."""
    root = conf_dir() / "strategies"
    if root not in _LOADED:
        _LOADED[root] = {p.stem: _load(p) for p in sorted(root.glob("*.yaml"))}
    return {name: dict(opts) for name, opts in _LOADED[root].items()}


def _load(path: Path) -> dict[str, Any]:
    name, rel = path.stem, f"conf/strategies/{path.name}"
    raw = OmegaConf.to_container(OmegaConf.load(path), resolve=True) or {}
    module, opts = raw.get("module"), raw.get("options") or {}
    unknown = sorted(set(raw) - {"module", "options"})
    if unknown or not isinstance(module, str) or not isinstance(opts, dict):
        extra = f"; unknown keys {', '.join(unknown)}" if unknown else ""
        raise ValueError(f"{rel}: a strategy's config holds `module:` (the Python module that registers "
                         f"{name}) and `options:` (a mapping){extra}")
    import_named(module, rel)
    if name not in strategies.names():
        raise ValueError(f"{rel}: module {module} registers no strategy named {name} (it has "
                         f"{', '.join(strategies.names())}); decorate its class with @strategies.register({name!r})")
    takes = strategies.get(name).options
    bad = sorted(set(opts) - set(takes))
    if bad:
        raise ValueError(f"{rel}: options {', '.join(bad)}: {name} takes "
                         f"{', '.join(takes) if takes else 'no options'}")
    return opts


def resolved(overrides: Sequence[str] = ()) -> dict[str, dict[str, Any]]:
    """:func:`options` with command-line ``strategies.<name>.<key>=VALUE`` overrides applied (values parsed as
    YAML: ``8`` is an int); an unknown strategy or key is an error naming the valid ones."""
    out = options()
    for text in overrides:
        key, sep, value = text.lstrip("+").partition("=")
        parts = key.split(".")
        if not sep or len(parts) != 3 or parts[0] != "strategies":
            raise ValueError(f"{text}: a strategy's setting is strategies.<name>.<key>=VALUE, "
                             "e.g. strategies.replay.buffer_len=32")
        _, name, opt = parts
        if name not in out:
            raise ValueError(f"{text}: no strategy {name} in conf/strategies/; choose one of {', '.join(sorted(out))}")
        takes = strategies.get(name).options
        if opt not in takes:
            keys = ", ".join(f"strategies.{name}.{t}" for t in takes) or "no options"
            raise ValueError(f"{text}: {name} takes {keys}")
        out[name][opt] = OmegaConf.create({"v": value}).v if value else None
    return out


def of(cfg: Mapping[str, Any], name: str) -> dict[str, Any]:
    """Strategy ``name``'s options in a composed config (its ``strategies`` node, the command line's values
    included), or the config tree's where the config has none (a config built in code)."""
    node = cfg.get("strategies") if isinstance(cfg.get("strategies"), Mapping) else None
    if node is not None and name in node:
        return dict(node[name] or {})
    opts = options()
    if name not in opts:
        strategies.get(name)                   # the error that names the registered strategies
        raise ValueError(f"strategy={name}: registered but has no conf/strategies/{name}.yaml; add one "
                         f"(module: ..., options: {{}})")
    return opts[name]


def of_all(cfg: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Every registered strategy's options in ``cfg`` (see :func:`of`), in display order."""
    return {name: of(cfg, name) for name in strategies.names()}


def configured(cfg: Mapping[str, Any], name: str) -> strategies.Strategy:
    """A ready strategy with its options from ``cfg`` (see :func:`of`; a null option keeps the strategy's
    default)."""
    return strategies.configured(name, of(cfg, name))
