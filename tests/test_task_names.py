"""No code outside service/tasks/ compares a task's name: it asks the registry (issue 16, STYLE item 13)."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import ROOT

TASK_NAMES = {"classification", "detection"}
SKIPPED = {".git", "tests", "runs", "data", "build", "node_modules"}
# The Open Inference Protocol's extension is named "classification" (its server metadata and the
# output parameter): a protocol name, not our task's.
PROTOCOL_NAME = {("service/http/routes/v2.py", "classification"), ("service/v2/protocol.py", "classification")}


def python_files() -> list[Path]:
    files = []
    for path in ROOT.rglob("*.py"):
        parts = path.relative_to(ROOT).parts
        if (
            parts[0] in SKIPPED
            or parts[0].startswith(".venv")
            or parts[:2] in {("service", "tasks"), ("bench", ".work")}
        ):
            continue
        files.append(path)
    return files


def test_no_task_name_literal_outside_service_tasks() -> None:
    files = python_files()
    assert any(p.name == "manifest.py" for p in files) and len(files) > 50  # the walk finds the tree
    found = []
    for path in files:
        where = path.relative_to(ROOT).as_posix()
        for node in ast.walk(ast.parse(path.read_text(), filename=where)):
            if isinstance(node, ast.Constant) and node.value in TASK_NAMES and (where, node.value) not in PROTOCOL_NAME:
                found.append(f"{where}:{node.lineno}: {node.value!r}")
    assert found == [], "compare with service.tasks (e.g. classification.TASK.name) instead:\n" + "\n".join(found)
