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
