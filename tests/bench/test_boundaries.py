"""The benchmarks stay outside the product: nothing in inference/, kernels/ or playground/ imports `bench`."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def imported_roots(path: Path) -> set[str]:
    roots = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            roots.add(node.module.split(".")[0])
    return roots


def test_no_product_package_imports_the_benchmarks():
    offenders = [str(path.relative_to(REPO)) for package in ("inference", "kernels", "playground")
                 for path in sorted((REPO / package).rglob("*.py")) if "bench" in imported_roots(path)]
    assert offenders == []


def test_the_check_sees_an_import_of_the_benchmarks(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("import os\nfrom bench.serving import clients\n")
    assert imported_roots(module) == {"os", "bench"}
