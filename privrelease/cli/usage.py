"""Command-line usage errors (an unknown option or command, a value of the wrong type, a missing
argument) as one line, the way every other user mistake is printed (:func:`.output.fail`):
``error: `privrelease plan` has no option --nope; its options: --chart, --json, --help``, exit 2.

Click (vendored by Typer since 0.2x, plain Click before) raises them; :func:`describe` reads
the exception's public attributes (``ctx``, ``param``, ``option_name``, ``possibilities``),
never its classes, so both work.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Usage:
    """One usage error: the sentence, the option or argument it is about and what is allowed."""

    message: str
    field: str | None = None
    allowed: str | None = None


def usage_errors() -> tuple[type[BaseException], ...]:
    """The exception classes Click raises for the user's input (``ClickException``: usage
    errors exit 2, a few others exit 1), whichever Click Typer uses."""
    import typer

    found: list[type[BaseException]] = []
    if hasattr(typer, "TyperException"):
        found.append(typer.TyperException)
    try:
        import click
    except ImportError:  # pragma: no cover - Typer vendors Click and Click is not installed
        pass
    else:
        found.append(click.ClickException)
    return tuple(found)


def _sentence(text: str) -> str:
    """One line, no trailing period, first letter lower-case (it follows ``error:``)."""
    line = " ".join(str(text).split()).rstrip(".")
    return line[:1].lower() + line[1:] if line[:2] != line[:2].upper() else line


@dataclass(frozen=True)
class _Place:
    """The command an error is about: its path (``privrelease ledger show``) and its Click
    command (None: not known)."""

    path: str
    command: Any = None


def _place(ctx: Any, root: Any, argv: list[str]) -> _Place:
    """The error's command from its context; without one (Click's parser raises some without),
    the deepest command the words of ``argv`` name from ``root``."""
    if ctx is not None:
        return _Place(ctx.command_path, ctx.command)
    path, command = ["privrelease"], root
    for word in argv:
        found = getattr(command, "commands", {}).get(word) if command is not None else None
        if found is None:
            if not word.startswith("-"):
                break
            continue
        path.append(word)
        command = found
    return _Place(" ".join(path), command)


def _options(place: _Place) -> list[str]:
    names: list[str] = []
    for param in getattr(place.command, "params", []):
        if getattr(param, "param_type_name", "") == "option" and not getattr(param, "hidden", False):
            names.extend(name for name in [*param.opts, *param.secondary_opts] if name.startswith("--"))
    if place.command is not None and getattr(place.command, "add_help_option", True):
        names.append("--help")
    return list(dict.fromkeys(names))


def _about(param: Any) -> str:
    """`` (its help, first letter lower-case)``, or nothing."""
    about = " ".join(str(getattr(param, "help", None) or "").split()).rstrip(".")
    return f" ({about[:1].lower() + about[1:]})" if about else ""


def _option(place: _Place, name: str) -> Any:
    return next((p for p in getattr(place.command, "params", []) if name in [*p.opts, *p.secondary_opts]), None)


def _param_name(error: Any) -> str | None:
    param = getattr(error, "param", None)
    if param is None:
        return None
    if getattr(param, "param_type_name", "") == "option":
        opts = [name for name in param.opts if name.startswith("--")] or list(param.opts)
        return opts[0] if opts else param.name
    return str(param.name or "").upper() or None


def _value(error: Any) -> tuple[bool, Any]:
    """The value Typer's validation refused (pydantic keeps it), when known."""
    cause = error.__cause__
    errors = getattr(cause, "errors", None)
    if callable(errors):
        try:
            first = errors()[0]
        except (IndexError, TypeError):
            return False, None
        if "input" in first:
            return True, first["input"]
    return False, None


def describe(error: BaseException, root: Any = None, argv: list[str] | None = None) -> Usage:
    """The one-line :class:`Usage` of a Click exception (see the module's doc); ``root`` (the
    app's Click command) and ``argv`` name the command when the exception carries no context."""
    ctx = getattr(error, "ctx", None)
    place = _place(ctx, root, argv or [])
    where, see = f"`{place.path}`", f"see `{place.path} --help`"
    name = type(error).__name__
    if name == "NoSuchOption":
        option = str(getattr(error, "option_name", "") or "")
        possibilities = sorted(getattr(error, "possibilities", None) or [])
        options = _options(place)
        if possibilities:
            hint = f"did you mean {' or '.join(possibilities)}?"
        else:
            hint = f"its options: {', '.join(options)}" if options else "it takes no options"
        return Usage(f"{where} has no option {option}; {hint}", option, ", ".join(options) or None)
    if name == "MissingParameter":
        param = getattr(error, "param", None)
        kind = getattr(error, "param_type", None) or getattr(param, "param_type_name", "parameter")
        what = _param_name(error) or "a parameter"
        return Usage(f"{where} needs the {kind} {what}{_about(param)}; {see}", what)
    if name == "BadParameter" or hasattr(error, "param"):
        what = _param_name(error) or "a parameter"
        message = _sentence(getattr(error, "message", str(error)))
        known, value = _value(error)
        if message.lower().startswith("input should be "):  # pydantic: "Input should be a valid integer, ..."
            message = f"{what} must be {message[len('input should be ') :]}"
        else:
            message = f"invalid value for {what}: {message}"
        if known and repr(value) not in message:
            message += f"; got {value!r}"
        return Usage(message, what)
    text = _sentence(error.format_message() if hasattr(error, "format_message") else str(error))
    match = re.match(r"no such command '(?P<command>[^']*)'(?P<rest>.*)", text)
    if match:
        commands = list(getattr(place.command, "commands", {}))
        suggested = re.search(r"did you mean (.*?)\??$", match["rest"], re.IGNORECASE)
        hint = f"did you mean {suggested[1]}?" if suggested else f"its commands: {', '.join(commands)}"
        return Usage(
            f"{where} has no command {match['command']!r}; {hint}", match["command"], ", ".join(commands) or None
        )
    named = getattr(error, "option_name", None)
    if getattr(error, "exit_code", 1) == 2:
        about = _about(_option(place, named)) if named else ""
        return Usage(f"{where}: {text}{about}; {see}", named)
    return Usage(text)
