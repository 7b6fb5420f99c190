"""The building blocks of the policy schema: the validated field types, the error type that
points at a YAML location, the frozen model base, and what a mechanism kind's policy section
needs (:mod:`privrelease.mechanisms.kinds`).

Kept apart from :mod:`.schema` so that a kind's module can define its policy section without
importing the whole policy (which is assembled from the kinds).
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, NamedTuple, get_args

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Strict,
    StrictStr,
    ValidationInfo,
    model_validator,
)

from privrelease.mechanisms.limits import MIN_BETA

Loc = tuple[str | int, ...]
Hierarchy = tuple[tuple[str, ...], ...]
"""A parsed ARX hierarchy: one row per leaf, ``row[L]`` is the label at level L, ``row[-1] == "*"``."""


# --------------------------------------------------------------------------- errors and display


@dataclass(frozen=True)
class Issue:
    """One validation failure: where (a path of keys and indices) and what is wrong."""

    loc: Loc
    message: str


UNKNOWN_FIELD = "unknown field"


class FieldError(ValueError):
    """Validation failure(s) at locations relative to the model that raised it."""

    @classmethod
    def at(cls, loc: Loc, message: str) -> FieldError:
        """One issue at ``loc``."""
        return cls(Issue(loc, message))

    def __init__(self, *issues: Issue) -> None:
        assert issues
        self.issues = issues
        super().__init__("; ".join(f"{format_loc(i.loc)}: {i.message}" for i in issues))


def format_loc(loc: Loc) -> str:
    """``("mechanisms", 0, "beta")`` -> ``mechanisms[0].beta``; odd keys are bracket-quoted."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_-]*", part):
            out += f".{part}" if out else part
        else:
            out += f"[{part!r}]"
    return out or "(top level)"


def show(value: Any, limit: int = 80) -> str:
    """A short, readable rendering of a user's value for an error message (the work is bounded
    by ``limit``, whatever the value's size: a YAML alias bomb renders as fast as a number)."""
    text = _render(value, limit + 1)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _render(value: Any, budget: int) -> str:
    """``value`` rendered, stopping once more than ``budget`` characters are written."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return num(value)
    if value is None:
        return "null"
    if isinstance(value, (list, tuple, dict)):
        items = value.items() if isinstance(value, dict) else value
        text = "{" if isinstance(value, dict) else "["
        for item in items:
            if len(text) > budget:
                break
            text += ", " if len(text) > 1 else ""
            if isinstance(value, dict):
                text += _render(item[0], budget - len(text)) + ": " + _render(item[1], budget - len(text))
            else:
                text += _render(item, budget - len(text))
        return text + ("}" if isinstance(value, dict) else "]")
    text = repr(value)
    return text[: budget + 1]


def num(value: float) -> str:
    """``20.0`` -> ``20``; other floats by their shortest round-trip repr."""
    if math.isfinite(value) and value == int(value) and abs(value) < 1e15:
        return str(int(value))
    return repr(value)


# --------------------------------------------------------------------------- field types


@dataclasses.dataclass(frozen=True)
class _Allowed(BeforeValidator):
    """A before-validator that also says what it allows in the JSON Schema (``description``)."""

    allowed: str = ""

    def __get_pydantic_json_schema__(self, core_schema: Any, handler: Any) -> Any:
        schema = handler(core_schema)
        schema["description"] = f"{self.allowed}"
        return schema


def checked(name: str, allowed: str, ok: Callable[[Any], bool], *, integer: bool = False) -> BeforeValidator:
    """A validator raising "``name`` must be ``allowed``; got ``value``" for a wrong type or range.

    Numbers only: booleans, text and non-finite values are refused; an integer field refuses 2.5
    (and 20.0: YAML says what it means).
    """
    kinds: type[int] | tuple[type[int], type[float]] = int if integer else (int, float)

    def check(value: Any) -> Any:
        numeric = isinstance(value, kinds) and not isinstance(value, bool)
        if numeric and not math.isfinite(value):
            raise ValueError(f"{name} must be {allowed}, a finite number; got {show(value)}")
        if not (numeric and ok(value)):
            raise ValueError(f"{name} must be {allowed}; got {show(value)}")
        return value

    return _Allowed(check, allowed=allowed)


def check_option(name: str, field: Any, value: Any) -> Any:
    """A command-line option's ``value`` checked against the policy field type ``field`` (one
    source of truth for bounds): a :class:`~privrelease.errors.UserError` "``name`` must be
    <what the field allows>; got <value>" (exit 2) when the policy would refuse it."""
    from privrelease.errors import UserError

    (rule,) = [meta for meta in get_args(field)[1:] if isinstance(meta, _Allowed)]
    try:
        return rule.func(value)  # type: ignore[call-arg]
    except ValueError:
        raise UserError(f"{name} must be {rule.allowed}; got {show(value)}", field=name, allowed=rule.allowed) from None


def check_options(*options: tuple[str, Any, Any]) -> None:
    """:func:`check_option` for each ``(name, field, value)`` given (a None value is not given)."""
    for name, field, value in options:
        if value is not None:
            check_option(name, field, value)


def _number_as_text(value: Any) -> Any:
    """YAML numbers where text is expected (``version: 1``) are taken as their text."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return num(value) if isinstance(value, float) else str(value)
    return value


def _not_blank(value: str) -> str:
    if not value.strip():
        raise ValueError(f"must be non-empty text; got {show(value)}")
    return value


def _unique(items: tuple[str, ...]) -> tuple[str, ...]:
    seen: set[str] = set()
    for item in items:
        if item in seen:
            raise ValueError(f"must not repeat an entry; {item!r} appears twice in {show(items)}")
        seen.add(item)
    return items


Text = Annotated[StrictStr, BeforeValidator(_number_as_text)]
Name = Annotated[Text, AfterValidator(_not_blank)]
Names = Annotated[tuple[Name, ...], AfterValidator(_unique)]
MAX_MAGNITUDE = 1e15  # every integer up to it is exact in a double; differences stay finite
MAX_K = 100_000  # the SDGS calculus scans cell sizes from k: its work grows with k
MAX_EPSILON = 100.0  # e^epsilon stays finite; beyond it a guarantee says nothing
MIN_RELATIVE_ERROR = 1e-6  # SPLU's T_f is about 2 ln(2 / T_E) / eps^2: below it, past any count (1e15)
MAX_ALPHA = 1_000_000  # SPLU's T_p is a minimum over every count up to alpha: its work grows with alpha


def _bounded(value: float, info: ValidationInfo) -> float:
    if abs(value) > MAX_MAGNITUDE:
        raise ValueError(f"{info.field_name} must be a number within ±1e15; got {show(value)}")
    return value


Number = Annotated[float, Strict(), AfterValidator(_bounded)]


def at_least(count: int, what: str) -> AfterValidator:
    """An after-validator: the list or mapping has at least ``count`` entries.

    (Used instead of ``Field(min_length=...)``, which pydantic also reports when an item fails.)
    """

    def check(value: Any) -> Any:
        if len(value) < count:
            raise ValueError(f"must list at least {count} {what}; got {show(value)}")
        return value

    return AfterValidator(check)


Beta = Annotated[float, checked("beta", f"in [{MIN_BETA:g}, 1]", lambda v: MIN_BETA <= v <= 1)]
K = Annotated[int, checked("k", f"an integer in [1, {MAX_K}]", lambda v: 1 <= v <= MAX_K, integer=True)]
Gamma = Annotated[int, checked("gamma", f"an integer in [2, {MAX_K}]", lambda v: 2 <= v <= MAX_K, integer=True)]
Epsilon = Annotated[float, checked("epsilon", "in [0, 100]", lambda v: 0 <= v <= MAX_EPSILON)]
PositiveEpsilon = Annotated[float, checked("epsilon", "in (0, 100]", lambda v: 0 < v <= MAX_EPSILON)]
Rho = Annotated[float, checked("rho", "in (0, 1)", lambda v: 0 < v < 1)]
Delta = Annotated[float, checked("delta", "in (0, 1)", lambda v: 0 < v < 1)]
Level = Annotated[int, checked("level", "an integer in [0, 1000]", lambda v: 0 <= v <= 1000, integer=True)]
Count = Annotated[int, checked("count", "an integer in [1, 1e15]", lambda v: 1 <= v <= MAX_MAGNITUDE, integer=True)]
RelativeError = Annotated[float, checked("relative_error", "> 0", lambda v: v > 0)]
SpluEpsilon = Annotated[
    float, checked("epsilon", f"in [{MIN_RELATIVE_ERROR:g}, 100]", lambda v: MIN_RELATIVE_ERROR <= v <= MAX_EPSILON)
]
Alpha = Annotated[int, checked("alpha", f"an integer in [1, {MAX_ALPHA}]", lambda v: 1 <= v <= MAX_ALPHA, integer=True)]
Rows = Annotated[int, checked("rows", "an integer in [1, 1e15]", lambda v: 1 <= v <= MAX_MAGNITUDE, integer=True)]


class Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _known_fields_only(cls, data: Any) -> Any:
        """Reject unknown keys with the list of allowed ones (clearer than pydantic's message)."""
        if isinstance(data, dict):
            fields = list(cls.model_fields)
            issues = []
            for key in data:
                if key not in cls.model_fields:
                    close = difflib.get_close_matches(str(key), fields, n=1)
                    hint = f" (did you mean {close[0]!r}?)" if close else ""
                    issues.append(Issue((key,), f"{UNKNOWN_FIELD} {key!r}{hint}; allowed: {', '.join(fields)}"))
            if issues:
                raise FieldError(*issues)
        return data


class ColumnRef(NamedTuple):
    """A column a mechanism uses, where (relative loc) and what it needs."""

    loc: Loc
    column: str
    needs_scheme: bool = False
    numeric: bool = False
    needs_domain: bool = False
