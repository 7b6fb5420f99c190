"""The two things every HTML page of privrelease needs: the Jinja2 environment over the
package's templates and the atomic writer of an HTML file. Cheap to import (Jinja2 loads on
first use); :mod:`.render` and :mod:`.index` build on it, and the package re-exports both."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from privrelease.files import sha256_bytes, write_atomic

__all__ = ["jinja_environment", "write_html"]


def jinja_environment(**filters: Any) -> Any:
    """A Jinja2 environment over the package's templates: autoescape on, undefined names are
    errors, with ``filters`` added (Jinja2 loads on first use)."""
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.PackageLoader("privrelease.reports", "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(filters)
    return env


def write_html(html: str, path: str | Path) -> str:
    """Write ``html`` as UTF-8 atomically (temp file in the same folder, fsync, rename; the
    folder is created); returns the sha256 of the bytes written."""
    data = html.encode("utf-8")
    write_atomic(path, data, make_folder=True, mode=0o644)
    return sha256_bytes(data)
