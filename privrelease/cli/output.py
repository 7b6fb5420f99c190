"""Printing for the CLI: Rich tables for people, one JSON document for scripts (``--json``)."""

from __future__ import annotations

import json
import math
import os
import sys
from typing import Any, NoReturn, TextIO

from rich.console import Console, ConsoleDimensions
from rich.markup import escape
from rich.text import Text

PIPED_WIDTH = 100_000
"""The width a console has when it does not write to a terminal: wide enough that no table cell
is folded and no line is wrapped, so piped output has one line per table row (``grep``, ``cut``)."""


class _Console(Console):
    """A Rich console as wide as the terminal it writes to; when its stream is not a terminal
    (a pipe, a file, a test's captured output), :data:`PIPED_WIDTH` wide, whatever the terminal
    on another stream (stdin, stderr) measures, unless ``COLUMNS`` asks for a width. Tables are
    only as wide as their content, so nothing is padded."""

    @property
    def size(self) -> ConsoleDimensions:
        size = super().size
        if self._width is None and not self.is_terminal and not self._environ.get("COLUMNS", "").isdigit():
            return ConsoleDimensions(PIPED_WIDTH, size.height)
        return size

    @size.setter
    def size(self, new_size: tuple[int, int]) -> None:
        self._width, self._height = new_size


class _ReaderMayLeave:
    """A standard stream whose reader may stop reading (``privrelease run ... | head``): a write
    or flush that meets the closed pipe (``BrokenPipeError``) points the stream's descriptor at
    ``/dev/null`` and goes on, so the command finishes what it was doing (a release is still
    published and charged once) and exits with its own code; only the output nobody reads is lost."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            self._discard()
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            self._discard()

    def _discard(self) -> None:
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, self._stream.fileno())
        finally:
            os.close(devnull)
        self._stream.flush()  # what was buffered for the pipe goes to /dev/null


def survive_closed_output() -> None:
    """Let every command outlive a reader that stops reading its stdout or stderr
    (:class:`_ReaderMayLeave`); called first by the entry point."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if stream is not None and not isinstance(stream, _ReaderMayLeave):
            setattr(sys, name, _ReaderMayLeave(stream))


# Markup off: user text (names, notes, approvers, data labels) always prints as written, in
# table cells too; our own styling goes through :func:`styled`.
_CONSOLES: tuple[dict[str, Any], dict[str, Any]] = ({"markup": False}, {"stderr": True, "markup": False})
console = _Console(**_CONSOLES[0])
error_console = _Console(**_CONSOLES[1])


def reset_consoles() -> None:
    """Set both consoles up again for this process's streams and environment, as at import (a
    runner's child, :mod:`privrelease.resident`: its streams and terminal are the command's)."""
    for each, arguments in zip((console, error_console), _CONSOLES, strict=True):
        Console.__init__(each, **arguments)


def styled(template: str, *values: Any) -> Text:
    """Rich markup of ours with user ``values`` put in as plain text:
    ``styled("approved [bold]{}[/]", name)``."""
    return Text.from_markup(template.format(*(escape(str(value)) for value in values)))


def say(text: str | Text, *, err: bool = False) -> None:
    """One line for people on stdout (stderr with ``err``), as written: no highlighting, wrapped
    by the terminal (styles only from :func:`styled`)."""
    (error_console if err else console).print(text, highlight=False, soft_wrap=True)


def _jsonable(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: _jsonable(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(item) for item in value]
    return value


def print_json(document: Any) -> None:
    """One JSON document on stdout (non-finite floats become null)."""
    sys.stdout.write(json.dumps(_jsonable(document), indent=2, default=str) + "\n")


def fail(message: str, exit_code: int, *, field: str | None = None, allowed: str | None = None) -> NoReturn:
    """Print ``error: message`` on stderr, verbatim (never read as Rich markup), and exit with
    ``exit_code``; with ``--json`` on the command line, one JSON object on stdout instead:
    ``{error, field, allowed, exit_code}``."""
    if "--json" in sys.argv[1:]:
        print_json({"error": message, "field": field, "allowed": allowed, "exit_code": exit_code})
    else:
        say(styled("[bold red]error:[/] {}", message), err=True)
    sys.exit(exit_code)


def cells_sentence(
    each: float, confidence: float, cells: int | None = None, together: float | None = None, unit: str = "cell"
) -> str:
    """The half-width of each cell (or a statistic's group) in words, and the simultaneous
    one for ``cells`` of them (more than one)."""
    truth = "count" if unit == "cell" else "value"
    sentence = (
        f"each {unit} within +-{each:.4g} of its true {truth} with probability >= {confidence:g} ({unit} by {unit})"
    )
    if cells is not None and cells > 1 and together is not None:
        sentence += f"; all {cells:,} {unit}s at once within +-{together:.4g}"
    return sentence
