"""The layout of ``tests/``: no test module imports another, and tests/service/ mirrors service/.

Every ``tests/**/*.py`` is parsed with :mod:`ast` (never imported). Helpers shared between test
modules live in ``conftest.py`` (fixtures) or in plain helper modules (``tests/service/helpers.py``,
``image_fixtures.py``, …); importing a ``test_*`` module from another would run its tests' module
code twice and tie one test file's names to another's (tests/README.md).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TESTS = ROOT / "tests"
SERVICE_TESTS = TESTS / "service"
SERVER_TESTS = "server"  # whole servers over HTTP: they test no one sub-package


def _python_files() -> list[Path]:
    return sorted(path for path in TESTS.rglob("*.py") if "__pycache__" not in path.parts)


def _module_of(path: Path) -> list[str]:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return parts[:-1] if parts[-1] == "__init__" else parts


def _imported_modules(path: Path, source: str | None = None) -> list[tuple[int, str]]:
    """(line, dotted name) of every module ``path`` imports (its text, or ``source`` placed there),
    at module level or inside a function, relative imports resolved; for ``from package import
    name`` the name counts as a module too (it may be one)."""
    text = path.read_text(encoding="utf-8") if source is None else source
    package = _module_of(path) if path.name == "__init__.py" else _module_of(path)[:-1]
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(text, filename=str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            found.append((node.lineno, module))
            found += [(node.lineno, f"{module}.{alias.name}") for alias in node.names]
    return found


def _imports_a_test_module(module: str) -> bool:
    parts = module.split(".")
    return parts[0] == "tests" and any(part.startswith("test_") for part in parts)


def test_no_module_imports_from_a_test_module() -> None:
    offenders = [
        f"{path.relative_to(ROOT)}:{line} imports {module}"
        for path in _python_files()
        for line, module in _imported_modules(path)
        if _imports_a_test_module(module)
    ]
    assert offenders == [], "move the shared names to conftest.py or a helper module:\n" + "\n".join(offenders)


def test_the_check_sees_absolute_relative_and_from_package_imports() -> None:
    source = "from tests.service.test_api import x\nfrom . import test_v2\nimport tests.service.helpers\n"
    path = SERVICE_TESTS / "http" / "test_probe.py"  # never written: only its place resolves `from .`
    found = _imported_modules(path, source)
    assert ("tests.service.http.test_v2" in [module for _, module in found]) is True  # `from .` resolved
    assert {line for line, module in found if _imports_a_test_module(module)} == {1, 2}  # not line 3's helper


def test_every_folder_of_tests_service_mirrors_a_sub_package_of_service() -> None:
    folders = sorted(path for path in SERVICE_TESTS.rglob("*") if path.is_dir() and path.name != "__pycache__")
    assert folders, "tests/service/ has no sub-folders"
    strays, not_packages = [], []
    for folder in folders:
        relative = folder.relative_to(SERVICE_TESTS)
        if not (folder / "__init__.py").is_file():
            not_packages.append(str(relative))
        if relative.parts[0] == SERVER_TESTS:
            continue
        if not (ROOT / "service" / relative / "__init__.py").is_file():
            strays.append(str(relative))
    assert strays == [], f"tests/service/ folders with no service/ sub-package of that name: {strays}"
    assert not_packages == [], f"tests/service/ folders without an __init__.py: {not_packages}"


def test_test_files_sit_in_a_folder_not_at_the_top_of_tests_service() -> None:
    top = sorted(path.name for path in SERVICE_TESTS.glob("test_*.py"))
    assert top == ["test_layout.py"], f"test modules at the top of tests/service/ (put each beside its module): {top}"
