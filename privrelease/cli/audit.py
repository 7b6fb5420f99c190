"""``privrelease policy``, ``audit`` and ``ledger``: approvals, chain verification and the privacy
ledger, read from and written to the audit database (``PRIVRELEASE_DB_URL``).

These commands never import Prefect (``audit recover`` does, only to mark crashed flow runs);
the database schema is created or upgraded on first use.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from privrelease.cli.output import console, print_json, say, styled

policy_app = typer.Typer(
    help="Draft a policy, approve, revoke, list and show its versions, and print the policy format's JSON Schema.",
    no_args_is_help=True,
)
audit_app = typer.Typer(help="Check the hash-chained audit log.", no_args_is_help=True)
governance_app = typer.Typer(
    help="Sign and apply governance requests (production mode, approver registry, revocations) for a quorum.",
    no_args_is_help=True,
)
audit_app.add_typer(governance_app, name="governance")
ledger_app = typer.Typer(
    help="The lifetime privacy budget of each dataset (dataset.id) and its files.", no_args_is_help=True
)

JsonFlag = Annotated[bool, typer.Option("--json", help="Print one JSON document.")]

UNSIGNED_EXIT = 3
"""`audit verify-release`'s exit code for a release intact as its head lists but unsigned."""


def register(app: typer.Typer) -> None:
    """Add the ``policy``, ``audit`` and ``ledger`` command groups to ``app``."""
    app.add_typer(policy_app, name="policy")
    app.add_typer(audit_app, name="audit")
    app.add_typer(ledger_app, name="ledger")


def _engine() -> Any:
    from privrelease.audit.database import open_database

    return open_database()


@contextmanager
def checked_session() -> Iterator[Any]:
    """A read-only session of the audit database whose snapshot passed the check a run makes
    before spending (:func:`~privrelease.audit.witness.spending_problem`, without the write
    lock: nothing is written): the ledger commands show figures only of a ledger that matches its
    audit records, read from the snapshot checked (else :class:`AuditRefused`, exit 1)."""
    from privrelease.audit import witness
    from privrelease.audit.database import session
    from privrelease.errors import AuditRefused

    with session(_engine(), readonly=True) as s:
        problem = witness.spending_problem(s, lock=False)
        if problem is not None:
            raise AuditRefused(
                f"the ledger does not match its audit records ({problem}): no figures shown "
                "(`privrelease audit verify` names every problem)"
            )
        yield s


def runs_fit(runway: Any, which: str) -> str:
    """``2 more runs {which} fit`` / ``1 more run {which} fits`` (``100000+`` when capped)."""
    one = runway.runs == 1 and not runway.capped
    return (
        f"{runway.runs}{'+' if runway.capped else ''} more run{'' if one else 's'} {which} {'fits' if one else 'fit'}"
    )


def _when(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat(timespec="seconds")


def _minute(iso: str | None) -> str:
    """An ISO timestamp to the minute, for tables."""
    return "" if iso is None else iso[:16].replace("T", " ")


def _short(digest: str) -> str:
    return digest[:12]


# --- policy ---------------------------------------------------------------------------------

POLICY_YAML_NOTE = (
    "the approved content as YAML, from the audit database's canonical form: schema field order, defaults "
    "filled in, mappings sorted by key; the file's comments and layout are not stored"
)


def _approval_dict(approval: Any, policy: Any = None, registry: Any = None, *, verdict: Any = None) -> dict[str, Any]:
    """An approval for people and scripts; given its ``policy``, with its key fingerprint and
    signature status against ``registry`` (:func:`privrelease.audit.approvers.check`), or the
    ``verdict`` of that check already made."""
    from privrelease.audit import approvers, bindings

    document = {
        "id": approval.id,
        "sha256": approval.policy_sha256,
        "approved_by": approval.approved_by,
        "os_user": approval.os_user,
        "approved_at": _when(approval.approved_at),
        "note": approval.note,
        "binds": {
            "binds": approval.binds,
            "path": approval.data_path,
            "sha256": approval.data_sha256,
            "description": bindings.bound(approval),
        },
    }
    if verdict is None and policy is not None:
        verdict = approvers.check(policy, approval, registry)
    if verdict is not None:
        document.update(key=verdict.fingerprint, signature=verdict.status, verified=verdict.verified)
    return document


KeysOption = Annotated[
    list[Path] | None,
    typer.Option("--key", help="An approver's private key file: signs the governance record (repeat for a quorum)."),
]
ProposeOption = Annotated[
    Path | None,
    typer.Option(
        "--propose",
        help="Write the (signed) request to this file instead of applying it: other approvers sign it with "
        "`audit governance sign`, then `audit governance apply` records it.",
    ),
]


def _proposed(propose: Path | None) -> dict[str, Any]:
    return {} if propose is None else {"proposed": str(propose)}


def _print_proposed(propose: Path | None) -> None:
    if propose is not None:
        say(
            f"request written to {propose}: each approver runs `privrelease audit governance sign {propose} --key KEY`, "
            f"then `privrelease audit governance apply {propose}` records it"
        )


@policy_app.command("approve")
def policy_approve(
    policy: Annotated[Path, typer.Argument(help="The policy YAML file.")],
    by: Annotated[str, typer.Option("--by", help="Who approves (recorded with the OS user).")],
    note: Annotated[str | None, typer.Option("--note", help="A note kept with the approval.")] = None,
    key: Annotated[
        Path | None,
        typer.Option("--key", help="The approver's private key file (privrelease audit keygen): signs the approval."),
    ] = None,
    binds: Annotated[
        str,
        typer.Option(
            "--binds",
            help="What of the data the approval binds: 'data' (the bytes at dataset.path now, or the pinned "
            "dataset.sha256, from any path) or 'path' (whatever is at the resolved dataset.path when a run "
            "reads it, e.g. a monthly extract).",
        ),
    ] = "data",
    json_output: JsonFlag = False,
) -> None:
    """Record an approval of the policy's exact content (its canonical sha256) and of its data
    (--binds), signed with the approver's key when --key is given (required once an approver
    registry is in effect)."""
    from privrelease.approving import approve

    approved = approve(policy, by, note=note, key=key, binds=binds)
    facts, approval, head = approved.policy, approved.approval, approved.chain_head
    document = {
        "policy": facts.name,
        "version": facts.version,
        **_approval_dict(approval, verdict=approved.signature),
        "dataset_id": approved.dataset_id,
        "chain_head": {"seq": head.seq, "hash": head.hash},
    }
    if json_output:
        print_json(document)
        return
    say(
        styled(
            "approved [bold]{}@{}[/] (sha256 {}) by {} (OS user {}) at {}",
            facts.name,
            facts.version,
            facts.sha256,
            approval.approved_by,
            approval.os_user,
            document["approved_at"],
        )
    )
    say(f"binds: dataset {approved.dataset_id or '(no dataset.id)'}; data: {document['binds']['description']}")
    if document["key"]:
        say(f"signed with key {document['key']}: {document['signature']}")


@policy_app.command("revoke")
def policy_revoke(
    ref: Annotated[str, typer.Argument(help="NAME@VERSION or a sha256 prefix of the approved version.")],
    by: Annotated[str, typer.Option("--by", help="Who revokes (recorded).")],
    reason: Annotated[str, typer.Option("--reason", help="Why (recorded).")],
    keys: KeysOption = None,
    propose: ProposeOption = None,
    json_output: JsonFlag = False,
) -> None:
    """Withdraw every current approval of a policy version: production runs refuse it until it
    is approved again. The revocation is a governance record, signed by an approver (--key) once
    a registry is pinned; the approvals stay on record."""
    from privrelease.approving import revoke

    revoked = revoke(ref, by=by, reason=reason, keys=keys or (), propose=propose)
    facts, count = revoked.policy, revoked.revoked
    if json_output:
        print_json(
            {
                "policy": facts.name,
                "version": facts.version,
                "sha256": facts.sha256,
                "revoked": count,
                **_proposed(propose),
            }
        )
        return
    done = "proposed revoking" if propose else "revoked"
    say(f"{done} {count} approval(s) of {facts.name}@{facts.version} (sha256 {facts.sha256[:12]}): {reason}")
    _print_proposed(propose)


@policy_app.command("list")
def policy_list(json_output: JsonFlag = False) -> None:
    """Every registered policy version and its approvals."""
    from privrelease.audit import approvals
    from privrelease.audit.database import session

    with session(_engine(), readonly=True) as s:
        rows: list[dict[str, Any]] = []
        for version in approvals.list_policies(s):
            approved = approvals.current_approvals(s, version.sha256)
            short = approvals.shortfall(s, approvals.PolicyFacts.recorded(s, version.sha256))
            rows.append(
                {
                    "name": version.name,
                    "version": version.version,
                    "sha256": version.sha256,
                    "registered_at": _when(version.registered_at),
                    "approved": short is None,
                    "shortfall": short,
                    "approvals": [_approval_dict(a) for a in approved],
                }
            )
    if json_output:
        print_json({"policies": rows})
        return
    if not rows:
        console.print("no policies registered (privrelease policy approve POLICY.yaml --by NAME)")
        return
    table = Table("name", "version", "sha256", "registered (UTC)", "approved by")
    for row in rows:
        last = row["approvals"][-1] if row["approvals"] else None
        by = f"{last['approved_by']} ({_minute(last['approved_at'])})" if last else ""
        table.add_row(
            row["name"],
            row["version"],
            _short(row["sha256"]),
            _minute(row["registered_at"]),
            by if row["approved"] else styled(f"[red]{row['shortfall']}[/]") + (f": {by}" if by else ""),
        )
    console.print(table)


@policy_app.command("show")
def policy_show(
    ref: Annotated[str, typer.Argument(help="NAME, NAME@VERSION or a sha256 prefix.")],
    json_output: JsonFlag = False,
) -> None:
    """One policy version: the approved content as YAML, then its approvals (approver, time, OS
    user, signature status)."""
    from privrelease.audit import approvals
    from privrelease.audit.database import session
    from privrelease.policies.canonical import canonical_yaml

    with session(_engine(), readonly=True) as s:
        version = approvals.find_policy(s, ref)
        approved = approvals.approvals_of(s, version.sha256)
        current = {a.id for a in approvals.current_approvals(s, version.sha256)}
        short = approvals.shortfall(s, approvals.PolicyFacts.recorded(s, version.sha256))
        registry = approvals.effective_registry(s)
        others = [
            v.version for v in approvals.list_policies(s) if v.name == version.name and v.sha256 != version.sha256
        ]
    document = {
        "name": version.name,
        "version": version.version,
        "sha256": version.sha256,
        "registered_at": _when(version.registered_at),
        "approved": short is None,
        "shortfall": short,
        "approvals": [{**_approval_dict(a, version, registry), "revoked": a.id not in current} for a in approved],
        "other_versions": others,
        "policy": json.loads(version.canonical_json),
        "policy_yaml": canonical_yaml(version.canonical_json),
    }
    if json_output:
        print_json(document)
        return
    say(
        f"# {version.name}@{version.version}  sha256 {version.sha256}  registered {_minute(document['registered_at'])} UTC"
    )
    say(f"# {POLICY_YAML_NOTE}")
    sys.stdout.write(document["policy_yaml"])
    sys.stdout.flush()
    say("")
    if not document["approvals"]:
        console.print(styled("approvals: [red]none[/] (privrelease policy approve POLICY.yaml --by NAME)"))
    else:
        say("approvals")
        table = Table("approved (UTC)", "by", "OS user", "signature", "binds", "note")
        for approval in document["approvals"]:
            signature = approval["signature"] + (f" (key {approval['key']})" if approval["key"] else "")
            table.add_row(
                (approval["approved_at"] or "")[:19].replace("T", " "),
                approval["approved_by"],
                approval["os_user"],
                signature,
                approval["binds"]["description"],
                (approval["note"] or "") + (" REVOKED" if approval["revoked"] else ""),
            )
        console.print(table)
        if not current:
            console.print(styled("[red]no current approval[/]: every approval of this version was revoked"))
        elif short:
            console.print(styled(f"[red]not approved for a production run[/]: {short}"))
    if others:
        say(f"other versions: {', '.join(others)}")


# --- audit ----------------------------------------------------------------------------------


@audit_app.command("verify")
def audit_verify(
    head: Annotated[
        Path | None,
        typer.Option("--head", help="A chain-head file written beside outputs: detects cut-off."),
    ] = None,
    output_root: Annotated[
        Path | None,
        typer.Option("--output-root", help="Base of relative output paths."),
    ] = None,
    files: Annotated[
        bool,
        typer.Option("--files/--no-files", help="Re-hash output and report files."),
    ] = True,
    public_key: Annotated[
        str | None,
        typer.Option(
            "--public-key",
            help="The signing key's public key (base64, or its .pub file): every record and the --head "
            "file must carry its valid signature.",
        ),
    ] = None,
    releases: Annotated[
        list[Path] | None,
        typer.Option(
            "--releases",
            help="A folder to check for release folders and files no recorded release published "
            "(repeatable; default: every folder releases were published into, the work directory's releases/ "
            "and the site file's published folders).",
        ),
    ] = None,
    json_output: JsonFlag = False,
) -> None:
    """Recompute the hash chain, every row's content hash and the output checksums; replay every
    stored guarantee and ledger charge from its stored event tree with today's accountants
    (a mismatch beyond a relative 1e-9, or a tree that no longer parses, is a finding:
    privrelease.audit.replay); check that everything visible in the release folders was
    published by a recorded run, and that the database still holds the witness's head and every
    signed release head (cut short or rolled back otherwise). The key defaults to the site
    file's. Exit 0 when intact, 1 naming the first broken record."""
    from privrelease.audit import chain, signing, verification, witness
    from privrelease.audit.database import session
    from privrelease.flows.recovery import release_folder_problems, release_roots
    from privrelease.settings import get_settings

    settings = get_settings()
    external = chain.read_head(head) if head is not None else None
    key = signing.public_key(public_key) if public_key is not None else settings.site.verifying_key()
    with session(_engine(), readonly=True) as s:
        folders = set(witness.head_folders())  # the work folder's releases/ and the site's published folders
        roots = releases or sorted(release_roots(s, output_root=output_root) | folders)
        outside = witness.outside_heads(s, key, sorted({*roots, *folders}))
        result = verification.verify(
            s,
            head=external,
            output_root=output_root,
            check_files=files,
            public_key=key,
            replay=True,
            cut_short=any(problem.kind == "rolled_back" for problem in outside),
        )
        result.problems += outside
        for root in roots:
            found = release_folder_problems(s, root.expanduser(), output_root=output_root)
            result.problems += [chain.Problem(None, "unrecorded_release", message) for message in found]
    if json_output:
        print_json(result.to_dict())
    elif result.ok:
        say(
            styled(
                "[green]intact[/]: {} records, {} rows, {} files; head seq {} hash {}",
                result.records,
                result.rows_checked,
                result.files_checked,
                result.head.seq,
                result.head.hash,
            )
        )
        for problem in result.unreplayed:
            say(styled("[yellow]not replayed[/]: {}", problem.message))
    else:
        first = result.first
        assert first is not None
        say(styled("[bold red]BROKEN[/]: {}", first.message))
        for problem in result.problems[1:]:
            say(f"  also: {problem.message}")
    if not result.ok:
        raise typer.Exit(1)


@audit_app.command("verify-release")
def audit_verify_release(
    folder: Annotated[Path, typer.Argument(help="A release folder (as published, e.g. copied from a file share).")],
    public_key: Annotated[
        str, typer.Option("--public-key", help="The agency's published public key (base64, or its .pub file).")
    ],
    run: Annotated[
        str | None, typer.Option("--run", help="The run the folder must be a release of (its id, or 8+ characters).")
    ] = None,
    policy: Annotated[
        str | None,
        typer.Option(
            "--policy", help="The policy it must be a release of (name@version, or 12+ digits of its sha256)."
        ),
    ] = None,
    json_output: JsonFlag = False,
) -> None:
    """Check a release offline, from its folder alone: the head file's signature by the agency's
    key over the chain head, every file's sha256 and the release it belongs to (folder name, run,
    policy), the folder's name, the expected run and policy, and each file's bytes. Exit 0 when
    intact, 1 naming what is not, 3 when it is otherwise intact but unsigned (published without a
    signing key: no key vouches for it)."""
    from privrelease.audit import signing, verification
    from privrelease.errors import UserError

    if not folder.is_dir():
        raise UserError(f"release folder {str(folder)!r} does not exist or is not a folder")
    verification.check_binding_options(run, policy)
    found = verification.verify_release(folder, signing.public_key(public_key), run=run, policy=policy)
    problems, release = found.problems, found.release
    if json_output:
        print_json(
            {
                "ok": found.status == "intact",
                "status": found.status,
                "unsigned": found.unsigned,
                "folder": str(folder),
                "release": None if problems else release,
                "problems": problems,
            }
        )
    elif problems:
        say(styled("[bold red]BROKEN[/]: {}", problems[0]))
        for problem in problems[1:]:
            say(f"  also: {problem}")
        if found.unsigned:
            say("  also: its head file carries no signature, so no key vouches for it")
    elif found.unsigned:
        say(
            styled(
                "[bold yellow]UNSIGNED[/]: {} was published without a signing key (its chain-head.json carries no "
                "signature): its files are as its head lists, but no key vouches for them, so anyone who could "
                "write the folder could have written it; sign releases with PRIVRELEASE_SIGNING_KEY (SECURITY.md)",
                folder,
            )
        )
    elif release is None:
        say(
            styled(
                "[green]intact[/]: {} signed by this key; [yellow]warning[/]: its head file predates the run "
                "binding, so which run and policy it belongs to is not signed",
                folder,
            )
        )
    else:
        say(
            styled(
                "[green]intact[/]: {} signed by this key: run {}, policy {}",
                folder,
                release.get("run", ""),
                release.get("policy", ""),
            )
        )
    if found.status != "intact":
        raise typer.Exit(1 if problems else UNSIGNED_EXIT)


@audit_app.command("keygen")
def audit_keygen(
    out: Annotated[
        Path, typer.Option("--out", help="The private key file to create (its public key goes to OUT.pub).")
    ],
    json_output: JsonFlag = False,
) -> None:
    """Make the Ed25519 signing key. Keep the private file outside the database (its holder can
    write history) and set PRIVRELEASE_SIGNING_KEY to it on every writer; publish OUT.pub."""
    from privrelease.audit import signing

    public = signing.generate(out)
    if json_output:
        print_json({"private_key_file": str(out), "public_key_file": f"{out}.pub", "public_key": public})
        return
    say(f"private key: {out} (mode 0600; set PRIVRELEASE_SIGNING_KEY={out})")
    say(f"public key:  {public} (also in {out}.pub)")


@audit_app.command("head")
def audit_head(
    write: Annotated[
        Path | None,
        typer.Option("--write", help="Also write the head to this JSON file."),
    ] = None,
    json_output: JsonFlag = False,
) -> None:
    """The chain's newest record (seq, hash): keep it outside the database."""
    from privrelease.audit import chain
    from privrelease.audit.database import session

    with session(_engine(), readonly=True) as s:
        current = chain.head(s)
    if write is not None:
        chain.write_head(write, current)
    if json_output:
        print_json({"seq": current.seq, "hash": current.hash})
    else:
        say(f"seq {current.seq} hash {current.hash}")


MODES = ("production", "development")


@audit_app.command("mode")
def audit_mode(
    mode: Annotated[
        str | None, typer.Argument(help="production or development; omit it to show the current mode.")
    ] = None,
    by: Annotated[str | None, typer.Option("--by", help="Who proposes the mode (recorded).")] = None,
    note: Annotated[str | None, typer.Option("--note", help="Why (kept with the record).")] = None,
    registry_file: Annotated[
        Path | None,
        typer.Option(
            "--approvers",
            help="The approver registry to pin with production mode (default: PRIVRELEASE_APPROVERS, if set; else a registry already pinned stays).",
        ),
    ] = None,
    keys: KeysOption = None,
    propose: ProposeOption = None,
    json_output: JsonFlag = False,
) -> None:
    """Show or set the audit database's mode. In production mode every run refuses a policy
    whose exact content is not approved, whatever its runner's settings; with an approver
    registry pinned, only approvals signed by a registered key count, and development mode or
    another registry needs the signatures (--key) of the registry's quorum of approvers."""
    from privrelease.approving import govern
    from privrelease.audit import approvals, approvers, governance
    from privrelease.audit.database import session
    from privrelease.errors import UserError
    from privrelease.settings import get_settings

    engine = _engine()
    if mode is not None:
        if mode not in MODES:
            raise UserError(
                f"mode must be one of {', '.join(MODES)}; got {mode!r}", field="mode", allowed=", ".join(MODES)
            )
        if by is None:
            raise UserError("--by is required to set the mode (who decides it is recorded)", field="--by")
        registry = None
        if mode == "production":
            registry = approvers.load(registry_file, what="--approvers") if registry_file else approvers.configured()
        with session(engine) as s:
            request = approvals.mode_request(s, mode == "production", by=by, note=note, registry=registry)
            govern(s, request, keys, propose)
    with session(engine, readonly=True) as s:
        state = governance.state(s)
    database, pinned = state.production, state.registry
    settings = get_settings()
    site, environment = settings.site, settings.production
    effective = "production" if database or environment else "development"
    document: dict[str, Any] = {
        "mode": effective,
        "database": "production" if database else "development",
        "environment": environment,
        "site": {"file": str(site.source), "production": site.production, "approvers": str(site.approvers)}
        if site.source
        else None,
        **_proposed(propose),
    }
    if pinned is not None:
        document["approver_registry"] = {
            "source": pinned.source,
            "sha256": pinned.sha256,
            "approvers": sorted(pinned.keys),
            "quorum": pinned.quorum,
        }
    problems = [message for _seq, message in [*state.ignored, *state.unsigned]] + (
        [state.broken] if state.broken else []
    )
    if problems:
        document["governance_problems"] = problems
    if json_output:
        print_json(document)
        return
    why = (
        "the audit database"
        if database
        else f"the site file {site.source}"
        if site.production
        else "PRIVRELEASE_PRODUCTION"
        if environment
        else "the default"
    )
    say(f"mode: {effective} (set by {why})")
    for file in site.writable():
        say(styled("[yellow]warning:[/] this account can write {}: the site file pins nothing against it", file))
    if site.approvers is not None:
        say(
            f"approver registry: {site.approvers}, pinned by the site file {site.source} (the database's does not count)"
        )
    if pinned is not None:
        say(
            f"approver registry pinned: {pinned.source} (sha256 {pinned.sha256[:12]}; governance quorum "
            f"{pinned.quorum}): {', '.join(sorted(pinned.keys))}"
        )
    for problem in document.get("governance_problems", []):
        say(styled("[yellow]governance:[/] {}", problem))
    _print_proposed(propose)


@governance_app.command("sign")
def governance_sign(
    request: Annotated[Path, typer.Argument(help="A request file written by --propose.")],
    keys: Annotated[list[Path], typer.Option("--key", help="Your approver private key file (repeatable).")],
    json_output: JsonFlag = False,
) -> None:
    """Add your signature to a governance request (production mode, approver registry,
    revocation); it reads no database."""
    from privrelease.audit import governance, signing

    document = governance.load(request)
    governance.sign(document, [signing.private_key(str(key), "--key") for key in keys])
    governance.dump(document, request)
    fingerprints = [signing.fingerprint(entry["public_key"]) for entry in document["signatures"]]
    if json_output:
        print_json({"request": document["request"], "signed_by_keys": fingerprints})
        return
    say(
        f"signed {request}: {document['request']['action']} proposed by {document['request'].get('by')!r}; "
        f"keys that signed it: {', '.join(fingerprints)}"
    )


@governance_app.command("apply")
def governance_apply(
    request: Annotated[Path, typer.Argument(help="A request file written by --propose and signed.")],
    json_output: JsonFlag = False,
) -> None:
    """Record a signed governance request; refused (exit 2) when it lacks the quorum of the
    registry in effect or another governance record was appended since it was proposed."""
    from privrelease.audit import governance
    from privrelease.audit.database import session

    document = governance.load(request)
    with session(_engine()) as s:
        record = governance.apply(s, document)
    if json_output:
        print_json({"seq": record.seq, "kind": record.kind, "request": document["request"]})
        return
    say(f"applied {request}: audit record {record.seq} ({record.kind})")


@audit_app.command("recover")
def audit_recover(
    runs: Annotated[
        list[str] | None,
        typer.Option(
            "--run",
            help="Also settle this run (id or unique prefix) although its process cannot be checked from "
            "here (it ran on another host). Use only for a run known to be dead.",
        ),
    ] = None,
    json_output: JsonFlag = False,
) -> None:
    """Settle the runs a crash left unfinished: roll back the unpublished ones (their
    reservation is released), roll forward the ones whose charge was committed (their staged
    outputs are made visible when whole) and mark their Prefect flow runs Crashed."""
    from privrelease.audit import records
    from privrelease.audit.database import session
    from privrelease.errors import UserError
    from privrelease.flows import recovery

    engine = _engine()
    forced = []
    with session(engine, readonly=True) as s:
        for ref in runs or []:
            run = records.find_run(s, ref)
            if run.status not in recovery.UNSETTLED:
                raise UserError(f"--run {ref}: run {run.id} is {run.status}; only an unfinished run can be settled")
            owner = recovery.started_facts(s, run.id).get("owner")
            if owner is not None and recovery.owner_alive(owner):
                raise UserError(f"--run {ref}: run {run.id} is still running (pid {owner['pid']} on this host)")
            forced.append(run.id)
    settled = recovery.recover(engine, force=forced)
    crashed, warning = [], None
    if any(done.flow_run_id for done in settled):
        try:
            crashed = recovery.crash_flow_runs(settled)
        except Exception as error:  # the audit side is settled; the Prefect side can be retried
            warning = f"could not mark the Prefect flow runs Crashed: {error}"
    if json_output:
        print_json({"settled": [done.to_dict() for done in settled], "flow_runs_crashed": crashed, "warning": warning})
        return
    if not settled:
        say("nothing to recover: no unfinished run of a dead process")
    for done in settled:
        say(f"run {done.run_id[:12]} (was {done.was}): {done.action}; {done.detail}")
    if crashed:
        say(f"{len(crashed)} Prefect flow run(s) marked Crashed")
    if warning:
        say(warning)


@audit_app.command("init")
def audit_init(json_output: JsonFlag = False) -> None:
    """Create the audit database (PRIVRELEASE_DB_URL; default PRIVRELEASE_WORK_DIR/audit.db).
    Other commands never create one: they refuse a database that does not exist."""
    import os

    from privrelease.audit.database import current_revision, exists, get_engine, open_database
    from privrelease.settings import get_settings

    engine = get_engine()
    existed = exists(engine)
    open_database(create=True)
    shown = engine.url.render_as_string(hide_password=True)
    revision = current_revision(engine)
    if json_output:
        print_json({"db_url": shown, "revision": revision, "created": not existed})
    else:
        what = "already exists" if existed else "created"
        say(f"{shown}: {what}, schema at revision {revision}")
    settings = get_settings()
    from_cwd = settings.site.work is None and not any(name.upper() == "PRIVRELEASE_WORK_DIR" for name in os.environ)
    if not existed and from_cwd and settings.db_url == f"sqlite:///{settings.work_dir / 'audit.db'}":
        say(
            styled(
                "[bold yellow]warning:[/] the work folder {} follows the current directory: `audit init` in another "
                "folder starts another audit database, whose ledger gives the same dataset.id a budget of its own; "
                "keep one with PRIVRELEASE_WORK_DIR, or the site file's `work:` (README: The site file)",
                settings.work_dir,
            ),
            err=True,
        )


@audit_app.command("migrate")
def audit_migrate(json_output: JsonFlag = False) -> None:
    """Create or upgrade the audit database schema (Alembic ``upgrade head``)."""
    from privrelease.audit.database import current_revision, open_database

    engine = open_database(create=True)
    shown = engine.url.render_as_string(hide_password=True)
    revision = current_revision(engine)
    if json_output:
        print_json({"db_url": shown, "revision": revision})
    else:
        say(f"{shown}: schema at revision {revision}")


# --- ledger ---------------------------------------------------------------------------------


def _entry_dict(status: Any, entry: Any) -> dict[str, Any]:
    return {
        "id": entry.id,
        "run_id": entry.run_id,
        "state": status.effective_state(entry),
        "epsilon": entry.epsilon,
        "delta": entry.delta,
        "created_at": _when(entry.created_at),
        "updated_at": _when(entry.updated_at),
        "expires_at": _when(entry.expires_at),
        "reason": entry.reason,
        "event": json.loads(entry.event_json),
    }


def _vintage_dict(vintage: Any) -> dict[str, Any]:
    file = vintage.dataset
    return {
        "fingerprint": file.fingerprint,
        "label": file.label,
        "size_bytes": file.size_bytes,
        "row_count": file.row_count,
        "registered_at": _when(file.registered_at),
        "first_read": _when(vintage.first_read),
        "runs": vintage.runs,
    }


@ledger_app.command("show")
def ledger_show(
    dataset: Annotated[
        str, typer.Argument(help="Dataset id (dataset.id), or a file's fingerprint, fingerprint prefix or label.")
    ],
    json_output: JsonFlag = False,
) -> None:
    """A dataset's budget, its files (vintages) and its charges (the stored trees composed), and
    the unit of privacy they are for."""
    from privrelease.audit import ledger
    from privrelease.mechanisms.events import describe_relation

    with checked_session() as s:
        found = ledger.dataset_ledger(s, dataset)
    status, latest, ahead = found.status, found.latest, found.runway
    vintages = [_vintage_dict(v) for v in found.vintages]
    ds = status.dataset
    document = {
        "dataset": ds.id,
        "migrated": ds.migrated,
        "note": ds.note,
        "notion": ds.notion,
        "neighbours": status.neighbours or None,
        "budget": status.budget.as_dict(),
        "spent": None if status.cannot_compose else status.spent.as_dict(),
        "remaining": None if status.cannot_compose else status.remaining.as_dict(),
        "at_lifetime_delta": status.at_lifetime_delta,
        "cannot_compose": status.cannot_compose or None,
        "counting_entries": len(status.counting),
        "runway": (
            None
            if ahead is None or latest is None
            else {"runs": ahead.runs, "capped": ahead.capped, "like_run": latest.run_id}
        ),
        "vintages": vintages,
        "entries": [_entry_dict(status, entry) for entry in status.entries],
    }
    if json_output:
        print_json(document)
        return
    if ds.id != dataset.strip():
        say(f"{dataset!r} is a file of dataset {ds.id}")
    say(styled("dataset [bold]{}[/]; accountant: {}", ds.id, ds.notion))
    if ds.note:
        say(styled("[yellow]note:[/] {}", ds.note))
    say(f"lifetime budget  {status.budget}")
    if status.neighbours:
        say(f"unit of privacy  {describe_relation(status.neighbours)} (every charge below is for it)")
    trees = len(status.counting)
    how = f"composition of {trees} stored tree{'s' * (trees != 1)}"
    if status.at_lifetime_delta:
        how = f"the smallest epsilon at the lifetime delta; {how}"
    if status.cannot_compose:
        say(styled("spent            [yellow]not composed here[/]: {}", status.cannot_compose))
        say("remaining        unknown here (each entry's recorded charge is below)")
    else:
        say(f"spent            {status.shown(status.spent)}  ({how})")
        say(f"remaining        {status.shown(status.remaining)}")
    if ahead is not None and latest is not None:
        say(f"runway           {runs_fit(ahead, f'like the latest ({latest.run_id[:12]})')} the budget")
    files = Table("file (sha256)", "label", "rows", "first read (UTC)", "runs")
    for v in vintages:
        files.add_row(
            v["fingerprint"][:12],
            v["label"] or "",
            str(v["row_count"]),
            _minute(v["first_read"]) if v["first_read"] else "never",
            str(len(v["runs"])),
        )
    console.print(files)
    if not status.entries:
        console.print("no releases charged yet")
        return
    table = Table("entry", "run", "state", "epsilon", "delta", "created (UTC)", "note")
    for entry in status.entries:
        table.add_row(
            str(entry.id),
            entry.run_id[:12],
            ledger.STATE_WORDS[status.effective_state(entry)],
            f"{entry.epsilon:.6g}",
            f"{entry.delta:.6g}",
            _minute(_when(entry.created_at)),
            entry.reason or "",
        )
    console.print(table)
    say(
        "each entry: its own release's (epsilon, delta) as recorded when charged; spent is not their sum: "
        f"it is {how} (counting entries only)"
    )


@ledger_app.command("list")
def ledger_list(json_output: JsonFlag = False) -> None:
    """Every registered dataset: its lifetime budget, its files and what its trees compose to."""
    from privrelease.audit import ledger

    with checked_session() as s:
        found = ledger.dataset_ledgers(s)
    rows: list[dict[str, Any]] = []
    for each in found:
        ds, status = each.dataset, each.status
        rows.append(
            {
                "dataset": ds.id,
                "migrated": ds.migrated,
                "files": [v.dataset.label or v.dataset.fingerprint[:12] for v in each.vintages],
                "notion": ds.notion,
                "budget": {
                    "epsilon": ds.lifetime_epsilon,
                    "delta": ds.lifetime_delta,
                },
                "spent": None if status.cannot_compose else status.spent.as_dict(),
                "at_lifetime_delta": status.at_lifetime_delta,
                "cannot_compose": status.cannot_compose or None,
                "counting_entries": len(status.counting),
            }
        )
    if json_output:
        print_json({"datasets": rows})
        return
    if not rows:
        console.print("no datasets registered yet")
        return
    table = Table("dataset", "files", "accountant", "epsilon spent / budget")
    table.add_column("delta spent / budget")
    table.add_column("releases")
    for row in rows:
        budget, spent = row["budget"], row["spent"]
        delta_spent = f"{spent['delta']:.3g}" if spent else "not composed here"
        table.add_row(
            row["dataset"],
            ", ".join(row["files"]),
            row["notion"],
            f"{spent['epsilon']:.4g} / {budget['epsilon']:.4g}"
            if spent
            else f"not composed here / {budget['epsilon']:.4g}",
            f"not spent: epsilon is at the lifetime delta {budget['delta']:.3g}"
            if row["at_lifetime_delta"]
            else f"{delta_spent} / {budget['delta']:.3g}",
            str(row["counting_entries"]),
        )
    console.print(table)
