"""``policy schema`` and ``policy init``: help writing a policy (reads no data values)."""

from __future__ import annotations

from pathlib import Path

import typer

from privrelease.cli.output import console, say, styled


def register(app: typer.Typer) -> None:
    from privrelease.cli.audit import policy_app

    policy_app.command("schema")(policy_schema)
    policy_app.command("init")(policy_init)


def policy_schema(
    out: Path | None = typer.Option(None, "--out", help="Write the JSON Schema to this file instead of printing it."),
) -> None:
    """The JSON Schema of the policy format, for editors (a YAML language server reads the
    `# yaml-language-server: $schema=FILE` comment at the top of a policy)."""
    from privrelease.policies.reference import schema_text

    if out is None:
        typer.echo(schema_text(), nl=False)
        return
    _check_folder(out)
    out.write_text(schema_text(), encoding="utf-8")
    say(f"wrote {out}", err=True)


def policy_init(
    data: Path = typer.Argument(
        ...,
        help="The data file (CSV or Parquet), in the draft's folder or PRIVRELEASE_DATA_ROOTS as for `run`: "
        "only its header or schema is read.",
    ),
    dataset_id: str = typer.Option(..., "--id", help="The population the data is about, e.g. adult-census."),
    out: Path | None = typer.Option(
        None, "--out", help="Write the draft here (refused if it exists) instead of printing it."
    ),
) -> None:
    """Draft a policy from a data file's header and column types only (never its values: the
    scheme must be fixed before the data is read), with every choice commented."""
    from privrelease.drafting import draft_policy
    from privrelease.errors import UserError

    if out is not None and out.exists():
        raise UserError(f"--out {str(out)!r} exists: the draft never overwrites a file")
    if out is not None:
        _check_folder(out)
    folder = out.parent if out is not None else Path.cwd()
    text = draft_policy(data, dataset_id, folder)
    if out is None:
        console.print(text, end="", highlight=False, markup=False, soft_wrap=True)
    else:
        out.write_text(text, encoding="utf-8")
        say(f"wrote {out}: review it, then `privrelease plan {out}`", err=True)
    for warning in draft_warnings(text, folder):
        say(styled("[yellow]before a run, decide:[/] {}", warning), err=True)


def _check_folder(out: Path) -> None:
    """:class:`UserError` naming ``--out`` when the folder it is to be written in does not exist."""
    from privrelease.errors import UserError

    if not out.parent.is_dir():
        raise UserError(f"--out {str(out)!r}: its folder {str(out.parent)!r} does not exist", field="--out")


def draft_warnings(text: str, folder: Path) -> list[str]:
    """What ``plan`` would warn of the draft ``text`` (its kinds' plan warnings: a draft keeps
    every column raw, with no declared domain, so its cells may never reach k)."""
    from privrelease.policies import load_policy_text

    loaded = load_policy_text(text, folder)
    return [warning for spec in loaded.policy.mechanisms for warning in spec.plan_warnings(loaded)]
