"""The architecture's one-way data flow: strategies is a leaf."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REST = {"harness", "workloads", "analysis", "reports", "conf"}


def test_strategies_imports_nothing_from_the_rest():
    for path in (ROOT / "strategies").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            for name in names:
                assert name.split(".")[0] not in REST, f"{path.name} imports {name}"


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text().splitlines()
    fence = readme.index("```bash")
    commands = readme[fence + 1: fence + 3]
    assert readme[fence + 3] == "```" and len(commands) == 2
    assert commands[1] in (ROOT / ".ci" / "run").read_text()
    assert commands[0].endswith("python -m harness sweep model=qwen35_35b gmu=0.6")


def _imports(path: Path, package: str) -> set[str]:
    """The modules ``path`` imports (function-level imports included), relative ones resolved in ``package``."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.add(f"{package}.{node.module}" if node.level == 1 else node.module)
    return out


def test_the_path_from_config_to_a_point_runs_one_way():
    """config -> grid -> sweep -> point (docs/ARCHITECTURE.md): no module imports one after it, not even inside a
    function (``python -m harness.point`` expands its one point with the grid, never with the sweep), and analysis
    prints nothing (the console summary is harness.summary's)."""
    order = ["harness.config", "harness.grid", "harness.sweep", "harness.point"]
    for i, mod in enumerate(order):
        later = set(order[i + 1:]) - ({"harness.point"} if mod == "harness.sweep" else set())
        got = _imports(ROOT / (mod.replace(".", "/") + ".py"), "harness")
        assert not got & later, f"{mod} imports {sorted(got & later)}"
    assert "harness.sweep" not in _imports(ROOT / "harness/point.py", "harness")
    for path in (ROOT / "analysis").glob("*.py"):
        assert "harness.console" not in _imports(path, "analysis"), path.name
