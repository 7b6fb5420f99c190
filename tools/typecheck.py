"""`make typecheck`: run mypy over every package of the ``privrelease`` namespace, as laid out.

``pyproject.toml`` maps top-level folders onto the namespace (``[tool.setuptools] package-dir``:
``policies/`` is ``privrelease.policies``, ...). setuptools' editable install resolves that with an
import hook, which mypy (a static tool) cannot run, so ``import privrelease.policies`` would not be
found. This script (re)builds, on every run, a link tree ``build/typecheck/`` that mirrors the
installed layout with relative symlinks, read from ``package-dir`` itself:

    build/typecheck/privrelease/__init__.py -> privrelease/__init__.py   (one link per entry)
    build/typecheck/privrelease/cli         -> privrelease/cli
    build/typecheck/privrelease/policies    -> policies                   (one link per folder)

``[tool.mypy] mypy_path`` points at ``build/typecheck``, so plain ``mypy`` (and editors that run it)
resolve the namespace once the tree exists. Rebuilding it every run means a new module is always
checked. mypy reports paths through the tree; this script rewrites them to the real files
(``build/typecheck/privrelease/policies/schema.py`` -> ``policies/schema.py``). Extra arguments
are passed on to mypy. The exit status is mypy's.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TREE = Path("build") / "typecheck"


def package_dirs(pyproject: Path) -> dict[str, str]:
    """``{package: folder}`` from ``[tool.setuptools] package-dir``, folders relative to the root."""
    config = tomllib.loads(pyproject.read_text(encoding="utf-8"))
    mapping = config["tool"]["setuptools"]["package-dir"]
    assert isinstance(mapping, dict) and mapping, "pyproject.toml has no [tool.setuptools] package-dir"
    return {str(package): str(folder) for package, folder in mapping.items()}


def _link(target: Path, link: Path) -> None:
    link.symlink_to(os.path.relpath(target, link.parent), target_is_directory=target.is_dir())


def build_tree(root: Path, mapping: dict[str, str]) -> Path:
    """Recreate ``root/build/typecheck`` mirroring ``mapping``; returns the tree's directory.

    A package with mapped sub-packages becomes a real directory holding one link per entry of its
    folder (so the sub-packages' links can sit beside them); any other package is one link to its
    folder, so files added inside it later are seen without rebuilding.
    """
    tree = root / TREE
    if tree.exists() or tree.is_symlink():
        shutil.rmtree(tree)
    tree.mkdir(parents=True)
    parents = {package.rpartition(".")[0] for package in mapping}
    for package in sorted(mapping, key=lambda name: name.count(".")):
        source = root / mapping[package]
        assert (source / "__init__.py").is_file(), f"package-dir maps {package} to {source}, not a package"
        where = tree.joinpath(*package.split("."))
        where.parent.mkdir(parents=True, exist_ok=True)
        if package not in parents:
            _link(source, where)
            continue
        where.mkdir()
        for entry in sorted(source.iterdir()):
            if entry.name != "__pycache__" and not (where / entry.name).exists():
                _link(entry, where / entry.name)
    return tree


def real_path(line: str, mapping: dict[str, str]) -> str:
    """``line`` with every path through the tree replaced by the real file's path."""
    prefix = TREE.as_posix() + "/"
    by_length = sorted(mapping, key=len, reverse=True)

    def one(match: re.Match[str]) -> str:
        text = match.group(0)
        for package in by_length:
            mirrored = prefix + package.replace(".", "/") + "/"
            if text.startswith(mirrored):
                return mapping[package].rstrip("/") + "/" + text[len(mirrored) :]
        return text

    return re.sub(rf"{re.escape(prefix)}[\w./-]+", one, line)


def main(argv: list[str]) -> int:
    os.chdir(ROOT)
    mapping = package_dirs(ROOT / "pyproject.toml")
    build_tree(ROOT, mapping)
    process = subprocess.Popen(
        [sys.executable, "-m", "mypy", *argv], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    assert process.stdout is not None
    for line in process.stdout:
        sys.stdout.write(real_path(line, mapping))
    return process.wait()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
