"""The HTML disclosure report of a release: Jinja2 template, inline SVG charts, rendering.

The flow fills a :class:`ReportContext` and calls ``report_html(context)`` (one
self-contained, autoescaped HTML document) or ``write_report(context, path) -> sha256``.

>>> from privrelease.reports import example_context, report_html   # doctest: +SKIP
>>> html = report_html(example_context())                           # doctest: +SKIP

Importing this package is cheap (the CLI's ``report`` commands use :func:`write_html`); the
renderer (Jinja2, the calculus) loads on first use of the names re-exported lazily below.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from privrelease.reports.html import jinja_environment, write_html

if TYPE_CHECKING:
    from privrelease.reports.context import ReportContext, example_context
    from privrelease.reports.render import report_html, write_report

__all__ = [
    "ReportContext",
    "jinja_environment",
    "example_context",
    "report_html",
    "write_html",
    "write_report",
]

_LAZY = {
    "ReportContext": "privrelease.reports.context",
    "example_context": "privrelease.reports.context",
    "report_html": "privrelease.reports.render",
    "write_report": "privrelease.reports.render",
}


def __getattr__(name: str) -> Any:
    """Lazy re-exports (PEP 562): ``privrelease.reports.report_html`` etc."""
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
