"""The ``privrelease`` command line: a thin layer over the functions the flows call.

Each command group lives in its own module and is registered here. Commands that need no flow
never import Prefect (they must answer in well under 2 s). Exit codes: 0 ok, 1 a target is not
met (or the operating system refused an operation), 2 invalid input, 3 a release that
`audit verify-release` finds intact but unsigned; user mistakes, usage
errors (:mod:`privrelease.cli.usage`) and system errors print one clear message, never a
traceback or a Click box. A reader that stops reading the output (``| head``) neither stops a
command nor changes its exit code: the rest of its output is discarded.
"""

from __future__ import annotations

import os
import sys
from typing import Annotated, Any

import typer

from privrelease.cli import accuracy, calculus, counts, drafting, lifetime, sums
from privrelease.cli import audit as audit_commands
from privrelease.cli import deploy as deploy_commands
from privrelease.cli import report as report_commands
from privrelease.cli import run as run_commands
from privrelease.cli import server as server_commands
from privrelease.cli import splu as splu_commands
from privrelease.cli import tables as tables_commands
from privrelease.cli.output import fail, say, styled, survive_closed_output
from privrelease.errors import TargetNotMet, UserError

app = typer.Typer(
    name="privrelease",
    help="Publish data about people and prove what the release discloses.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
calculus.register(app)
audit_commands.register(app)
report_commands.register(app)
splu_commands.register(app)
run_commands.register(app)
server_commands.register(app)
deploy_commands.register(app)
lifetime.register(app)
accuracy.register(app)
counts.register(app)
sums.register(app)
tables_commands.register(app)
drafting.register(app)


def _name_subcommands(parent: typer.Typer) -> None:
    """Each command group's help ends with the names of its commands, as ``privrelease --help``
    lists them: the one-line descriptions then never miss a command added by another module."""
    from typer.main import get_command_name

    for group in parent.registered_groups:
        child = group.typer_instance
        assert child is not None
        names = [c.name or get_command_name(c.callback.__name__) for c in child.registered_commands if c.callback]
        names += [g.name for g in child.registered_groups if g.name]
        child.info.help = f"{str(child.info.help).rstrip('.')}. Commands: {', '.join(names)}."
        _name_subcommands(child)


def _flags_take_no_value() -> None:
    """Typer's rich help shows ``<bool>`` beside an on/off flag (``--json``, ``--help``), which
    takes no value: shown with no type, as Click's plain help does."""
    from typer.core import TyperOption

    shown = getattr(TyperOption, "display_type_rich", None)
    if shown is None:  # a Typer without the hook: its help as it is (tests/test_cli_usage.py says so)
        return

    def display_type_rich(self: TyperOption, ctx: Any) -> str | None:
        return None if self.is_flag and not self.count else shown(self, ctx)

    TyperOption.display_type_rich = display_type_rich  # type: ignore[method-assign]


_name_subcommands(app)
_flags_take_no_value()


def _print_version(value: bool) -> None:
    if value:
        from privrelease.version import VERSION

        print(f"privrelease {VERSION}")
        raise typer.Exit()


@app.callback()
def _options(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_print_version, is_eager=True, help="Print the package version and exit."),
    ] = False,
) -> None:
    """Publish data about people and prove what the release discloses."""


def main() -> None:
    """Console-script entry point: run the app, turning user errors into exit codes."""
    survive_closed_output()  # `privrelease ... | head`: the command finishes, its exit code its own
    try:
        from privrelease import resident

        forwarded = resident.forward(sys.argv)  # run/rerun on the runner kept in the work folder
        if forwarded is not None:
            sys.exit(forwarded)
        from privrelease.settings import get_settings, unknown_variables

        for warning in unknown_variables(os.environ):  # a misspelt setting would be ignored silently
            say(styled("[bold yellow]warning:[/] {}", warning), err=True)
        get_settings()  # a malformed PRIVRELEASE_* variable fails every command the same way, first
        code = _run_app()
    except (UserError, TargetNotMet) as error:
        fail(str(error), error.exit_code, field=getattr(error, "field", None), allowed=getattr(error, "allowed", None))
    except FileNotFoundError as error:
        fail(f"file not found: {error.filename}", UserError.exit_code)
    except OSError as error:  # the system refused an operation (file system, disk): failed, not invalid input
        fail(f"the operating system refused an operation: {error}", TargetNotMet.exit_code)
    except Exception as error:
        if not _database_unreachable(error):
            raise
        fail(f"cannot reach the audit database at {_database_url()}: {str(error).splitlines()[0]}", UserError.exit_code)
    sys.exit(code)


def _run_app() -> int:
    """Run the app with Click's own error printing off: a usage error (unknown option or
    command, a bad value, a missing argument) is one ``error:`` line naming the option, the
    value and what is allowed (:mod:`privrelease.cli.usage`), exit 2; help, ``--version`` and
    ``typer.Exit`` keep their exit codes."""
    from privrelease.cli import usage

    try:
        result = app(prog_name="privrelease", standalone_mode=False)
    except (UserError, TargetNotMet):
        raise  # main() prints it; a refusal imports no Click machinery below
    except usage.usage_errors() as error:
        if type(error).__name__ == "NoArgsIsHelpError":  # the help was printed: exit as Click does
            return int(getattr(error, "exit_code", 2))
        described = usage.describe(error, typer.main.get_command(app), sys.argv[1:])
        fail(described.message, int(getattr(error, "exit_code", 1)), field=described.field, allowed=described.allowed)
    except typer.Abort:
        fail("aborted", TargetNotMet.exit_code)
    return result if isinstance(result, int) and not isinstance(result, bool) else 0


def _database_unreachable(error: BaseException) -> bool:
    """SQLAlchemy's connection failures (server down, bad host or credentials)."""
    return type(error).__module__.startswith("sqlalchemy") and type(error).__name__ in (
        "OperationalError",
        "InterfaceError",
    )


def _database_url() -> str:
    from sqlalchemy.engine import make_url

    from privrelease.settings import get_settings

    return make_url(get_settings().db_url).render_as_string(hide_password=True)
