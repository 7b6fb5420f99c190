"""The dialect of a CSV file, decided from its first line alone: one function for the
fingerprint, the pre-flight, ``policy init`` and the reader (:mod:`privrelease.datasets`), so a
file one of them reads is never refused by another. Light: the standard library's ``csv``
only, so a pre-flight that reads a header loads no Arrow readers."""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from privrelease.errors import UserError

if TYPE_CHECKING:
    import pyarrow.csv as pcsv

SNIFFED_DELIMITERS = ",;\t|"


@dataclass(frozen=True)
class CsvDialect:
    """How a CSV file splits into fields: one ``delimiter`` character and the ``quote``
    character (None: no quoting), as :func:`csv_first_line` decided them."""

    delimiter: str
    quote: str | None

    def parse_options(self) -> pcsv.ParseOptions:
        import pyarrow.csv as pcsv

        return pcsv.ParseOptions(delimiter=self.delimiter, quote_char=self.quote or False)

    def fields(self, line: str) -> list[str]:
        """The fields of one line (its line end dropped) in this dialect."""
        line = line.rstrip("\r\n")
        try:
            if self.quote:
                rows = csv.reader([line], delimiter=self.delimiter, quotechar=self.quote)
            else:
                rows = csv.reader([line], delimiter=self.delimiter, quoting=csv.QUOTE_NONE)
            return next(rows, [])
        except csv.Error:
            return []


def csv_first_line(
    first_line: bytes,
    path: Path,
    *,
    delimiter: str | None = None,
    quote: str | None = '"',
    encoding: str = "utf-8",
) -> tuple[CsvDialect, list[str]]:
    """The dialect of a CSV file and the fields of its first line (its header's names, when it
    has one), from that line only (``first_line``: the file's bytes up to its first newline).

    The one place the dialect is decided: the fingerprint, the pre-flight, ``policy init`` and
    the reader all call it, so a file one of them reads is never refused by another, and no
    data row is read to decide it. The delimiter is the declared one, or else the one of
    ``, ; TAB |`` that splits the line into the most fields with quoting honoured (a delimiter
    inside quotes does not count: ``"city, state";zip`` is two fields split by ``;``); ties go
    to the first in that order, so a single column reads with ``,``."""
    if delimiter is not None and len(delimiter) != 1:
        raise UserError(f"delimiter must be one character; got {delimiter!r}")
    try:
        line = first_line.decode(encoding).removeprefix("\ufeff")
    except (UnicodeDecodeError, LookupError):
        raise UserError(f"dataset file {str(path)!r} is not {encoding} text (its header cannot be decoded)") from None
    if delimiter is not None:
        dialect = CsvDialect(delimiter, quote)
    else:
        dialect = max(
            (CsvDialect(candidate, quote) for candidate in SNIFFED_DELIMITERS),
            key=lambda candidate: len(candidate.fields(line)),
        )
    return dialect, dialect.fields(line)
