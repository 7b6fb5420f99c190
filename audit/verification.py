"""Verifying the audit trail: the hash chain and every row, file, approval and stored guarantee
it describes (:func:`verify`), and a release folder offline from its signed head file
(:func:`verify_release`). The chain's own walk (links, hashes, signatures; and
:func:`.chain.verify_tail`, for the witness) is :mod:`.chain`'s.

It sits above what it checks: :mod:`.chain` (records, heads, the walk), :mod:`.signing` (keys and
signatures), :mod:`.approvers` and :mod:`.governance` (signed approvals, the registry in effect),
none of which imports it.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from sqlmodel import Session, SQLModel, col, select

from privrelease.audit import approvers, governance, signing
from privrelease.audit import replay as replaying
from privrelease.audit.chain import (
    RELEASE_HEAD_FILE,
    Head,
    Problem,
    check_chain,
    describe,
    primary_key,
    read_head,
    row_sha256,
    signature_problems,
)
from privrelease.audit.models import (
    AUDITED_TABLES,
    GENESIS_HASH,
    AuditEvent,
    ChainHead,
    Output,
    PolicyVersion,
    Report,
    Run,
)
from privrelease.errors import UserError
from privrelease.files import sha256_file, sha256_text

__all__ = ["ReleaseCheck", "VerifyResult", "verify", "verify_release"]


@dataclass
class VerifyResult:
    """``ok`` when nothing was found; ``problems`` sorted by record, ``first`` the first one."""

    records: int
    head: Head
    rows_checked: int = 0
    files_checked: int = 0
    problems: list[Problem] = field(default_factory=list)
    unreplayed: list[Problem] = field(default_factory=list)
    """Stored figures whose event kinds' plugin is not installed here (:data:`.replay.CANNOT_REPLAY`):
    not replayed, not broken."""

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def first(self) -> Problem | None:
        return self.problems[0] if self.problems else None

    def to_dict(self) -> dict[str, Any]:
        first = self.first
        return {
            "ok": self.ok,
            "records": self.records,
            "head": {"seq": self.head.seq, "hash": self.head.hash},
            "rows_checked": self.rows_checked,
            "files_checked": self.files_checked,
            "first_broken": asdict(first) if first else None,
            "problems": [asdict(problem) for problem in self.problems],
            "cannot_replay": [asdict(problem) for problem in self.unreplayed],
        }


def _content_sha256(row: SQLModel) -> str | None:
    """sha256 of the content a row stores next to its hash: a policy's canonical JSON, a
    report's HTML (None for other rows)."""
    if isinstance(row, PolicyVersion):
        return sha256_text(row.canonical_json)
    if isinstance(row, Report):
        return sha256_text(row.html)
    return None


def _check_file(path_text: str, expected: str, output_root: Path | None, what: str, seq: int) -> Problem | None:
    path = Path(path_text)
    if not path.is_absolute():
        path = (output_root or Path.cwd()) / path
    try:
        actual = sha256_file(path)
    except FileNotFoundError:
        return Problem(seq, "file_missing", f"{what} {path} (record {seq}) is missing")
    except OSError as error:
        return Problem(seq, "file_unreadable", f"{what} {path} (record {seq}): {error}")
    if actual != expected:
        return Problem(
            seq,
            "file_edited",
            f"{what} {path} (record {seq}) was edited: sha256 {actual[:16]}... on disk, {expected[:16]}... recorded",
        )
    return None


def verify(
    session: Session,
    *,
    head: Head | None = None,
    output_root: Path | str | None = None,
    check_files: bool = True,
    public_key: Any | None = None,
    replay: bool = False,
    cut_short: bool = False,
) -> VerifyResult:
    """Recompute the chain, every described row's content hash and (``check_files``) the
    sha256 of every output and report file of succeeded runs (the others published nothing), and compare the chain's
    end with the chain-head row and with an external ``head`` (from :func:`read_head`).

    Finds edited, deleted or reordered log records; edited or deleted rows; rows no record
    describes (inserted outside privrelease); a policy or report whose stored content does
    not hash to its recorded sha256; edited or missing files; and, given ``head``,
    records cut off the end (then, or with ``cut_short``: records are known to be missing from
    the end, a row not as its newest record describes may have lost the records describing it,
    and is named so). ``result.first`` names the first broken record. Relative file
    paths are resolved against ``output_root`` (default: the working directory). Given the
    signing key's ``public_key`` (:func:`.signing.public_key`), every record and the external
    head must carry its valid signature: what a database writer without the key added,
    edited or rechained shows. A signed approval whose signature does not verify (against the
    approver registry in effect, else the key it names) is flagged, and so is an unsigned one
    made after a registry was pinned (:func:`.approvers.problems`). With ``replay``, every stored
    guarantee and ledger charge is recomputed from its stored event tree by today's accountants
    (:func:`.replay.problems`): a value that does not match, or a tree that no longer parses, is
    a finding (``guarantee_mismatch``, ``replay_failed``); one whose event kind's plugin is not
    installed here, as its tree records, is listed in ``result.unreplayed`` (not broken).
    """
    root = Path(output_root) if output_root is not None else None
    records = list(session.exec(select(AuditEvent).order_by(col(AuditEvent.seq))).all())
    problems: list[Problem] = []
    newest = check_chain(records, problems)
    last = Head(records[-1].seq, records[-1].hash) if records else Head(0, GENESIS_HASH)
    result = VerifyResult(records=len(records), head=last)

    # the end of the chain: the chain-head row, and the external head
    ends: list[Problem] = []
    stored = session.get(ChainHead, 1)
    if stored is None:
        ends.append(Problem(last.seq + 1, "head_mismatch", "the chain_head row is missing"))
    elif stored.seq > last.seq:
        ends.append(
            Problem(
                last.seq + 1,
                "truncated",
                f"the chain_head row says record {stored.seq} but the log ends at record "
                f"{last.seq}: records {last.seq + 1}..{stored.seq} were removed",
            )
        )
    elif (stored.seq, stored.hash) != (last.seq, last.hash):
        ends.append(
            Problem(
                stored.seq,
                "head_mismatch",
                f"the chain_head row (record {stored.seq}, hash {stored.hash[:16]}...) does "
                f"not match the log, which ends at record {last.seq}",
            )
        )
    if head is not None:
        if head.seq > last.seq:
            ends.append(
                Problem(
                    last.seq + 1,
                    "truncated",
                    f"the log ends at record {last.seq} but the external head says record "
                    f"{head.seq}: records {last.seq + 1}..{head.seq} were removed",
                )
            )
        elif head.seq > 0:
            at = next((record for record in records if record.seq == head.seq), None)
            if at is not None and at.hash != head.hash:
                ends.append(
                    Problem(
                        head.seq,
                        "head_mismatch",
                        f"{describe(at)} differs from the external head: hash "
                        f"{at.hash[:16]}... in the log, {head.hash[:16]}... in the head file",
                    )
                )
    problems += ends
    cut = cut_short or any(problem.kind == "truncated" for problem in ends)

    # rows: the newest record of each row must match the row as it is now
    intact: dict[str, dict[Any, SQLModel]] = {}
    for table, cls in AUDITED_TABLES.items():
        rows = {primary_key(row): row for row in session.exec(select(cls)).all()}
        intact[table] = {}
        for key, row in rows.items():
            result.rows_checked += 1
            found = newest.get((table, key))
            if found is None:
                problems.append(
                    Problem(
                        None,
                        "row_unrecorded",
                        f"{table} row {key!r} is described by no audit record (inserted outside "
                        "privrelease, or the records describing it were removed)",
                    )
                )
            elif found[1].get("row_sha256") != row_sha256(row):
                problems.append(
                    Problem(
                        found[0].seq,
                        "row_edited",
                        f"{table} row {key!r} is not as {describe(found[0])}, its newest remaining record, "
                        "describes: edited, or the records describing it were removed"
                        if cut
                        else f"{table} row {key!r} was edited after {describe(found[0])}",
                    )
                )
            elif _content_sha256(row) not in (None, getattr(row, "sha256", None)):
                problems.append(
                    Problem(
                        found[0].seq,
                        "content_mismatch",
                        f"{table} row {key!r} ({describe(found[0])}): its stored content does not hash to its sha256",
                    )
                )
            else:
                intact[table][key] = row
        for (record_table, key), (record, _payload) in newest.items():
            if record_table == table and key not in rows:
                problems.append(
                    Problem(
                        record.seq,
                        "row_deleted",
                        f"{table} row {key!r} described by {describe(record)} was deleted",
                    )
                )

    problems += _approval_problems(session, intact, newest)
    if replay:
        for finding in replaying.problems(session, {row: record.seq for row, (record, _) in newest.items()}):
            (result.unreplayed if finding.kind == replaying.CANNOT_REPLAY else problems).append(finding)

    # files of succeeded runs (a failed or unfinished run has nothing visible)
    if check_files:
        runs: dict[Any, SQLModel] = intact["run"]
        for table, cls, what in (
            ("output", Output, "output file"),
            ("report", Report, "report"),
        ):
            for key, row in intact[table].items():
                assert isinstance(row, cls)
                run = runs.get(row.run_id)
                path = getattr(row, "path", None)
                if path is None or (isinstance(run, Run) and run.status != "succeeded"):
                    continue
                result.files_checked += 1
                seq = newest[(table, key)][0].seq
                problem = _check_file(path, row.sha256, root, what, seq)
                if problem:
                    problems.append(problem)

    if public_key is not None:
        problems += signature_problems(records, head, public_key)
    problems.sort(key=lambda problem: (problem.seq is None, problem.seq or 0))
    result.problems = problems
    return result


def _approval_problems(
    session: Session, intact: dict[str, dict[Any, SQLModel]], newest: dict[tuple[str, Any], tuple[AuditEvent, Any]]
) -> list[Problem]:
    """Intact approval rows whose signature does not verify against the registry in effect
    when they were made, or unsigned after a pinned approver registry
    (:func:`.approvers.problems`), named by the record describing each; governance records
    ignored for too few signatures, revocations that took effect unsigned by whom they name, and a
    broken governance history (:func:`.governance.state`)."""
    state = governance.state(session)
    policies = {row.sha256: row for row in intact["policy_version"].values() if isinstance(row, PolicyVersion)}
    found = approvers.problems(
        list(intact["approval"].values()),
        policies,
        lambda when: state.registry_at(when) or approvers.configured(),
    )
    problems = [Problem(newest[("approval", key)][0].seq, kind, message) for key, kind, message in found]
    problems += [Problem(seq, "governance_ignored", message) for seq, message in state.ignored]
    problems += [Problem(seq, "revocation_unsigned", message) for seq, message in state.unsigned]
    if state.broken:
        problems.append(Problem(None, "governance_broken", state.broken))
    return problems


@dataclass(frozen=True)
class ReleaseCheck:
    """What :func:`verify_release` found: the ``problems`` (none: as its head lists), whether
    the head carries no signature at all (``unsigned``: published without a signing key, so no
    key vouches for it) and the ``release`` its head names."""

    problems: list[str]
    unsigned: bool = False
    release: dict[str, str] | None = None

    @property
    def status(self) -> str:
        """``broken`` (a problem), ``unsigned`` (none, but nothing signed) or ``intact``."""
        return "broken" if self.problems else "unsigned" if self.unsigned else "intact"


def verify_release(folder: Path, key: Any, *, run: str | None = None, policy: str | None = None) -> ReleaseCheck:
    """Check a release folder offline, from its files alone: its head file carries a valid
    signature of ``key`` over the chain head, every file's sha256 and the release it belongs
    to (folder name, run id, policy), the folder has that name, the release is of ``run`` (an
    id or a prefix of 8+ characters) and ``policy`` (``name@version`` or a sha256 prefix of 12+)
    when given, each listed file has its sha256, and no file is there that the signature does
    not list. A head with no signature is ``unsigned``, not forged: the rest is checked as if
    it were signed."""
    head_file = folder / RELEASE_HEAD_FILE
    try:
        head = read_head(head_file)
    except FileNotFoundError:
        return ReleaseCheck([f"{str(head_file)!r} is missing: the release cannot be checked"])
    if head.files is None:
        return ReleaseCheck([f"{str(head_file)!r} lists no files: not a release head file"])
    problems = []
    if head.signature is not None and not signing.valid(key, head.message(), head.signature):
        problems.append(
            f"{str(head_file)!r} carries no valid signature of this key: forged, altered or signed by another"
        )
    signed = head.signature is not None
    listed = "signed files" if signed else "files its head lists"  # nothing is "signed" in an unsigned release
    problems += _binding_problems(folder, head.release, run, policy, signed)
    for name, digest in head.files.items():
        path = folder / name
        if Path(name).name != name or not path.is_file():
            problems.append(f"{name!r} is listed but missing")
        elif sha256_file(path) != digest:
            sha = f"signed sha256 {digest[:12]}" if signed else f"sha256 {digest[:12]} its head lists"
            problems.append(f"{name!r} does not have the {sha}: it was changed")
    for path in sorted(folder.iterdir()):
        if path.name != head_file.name and path.name not in head.files:
            problems.append(f"{path.name!r} is in the folder but not among the {listed}")
    return ReleaseCheck(problems, not signed, head.release)


RUN_PREFIX, POLICY_PREFIX = 8, 12
"""The fewest characters of a run id (``--run``) and hex digits of a policy sha256 (``--policy``)
that name one: shorter ones would match releases of other runs or policies."""


def check_binding_options(run: str | None, policy: str | None) -> None:
    """:class:`UserError` naming ``--run`` or ``--policy`` when it cannot name one run (8+ hex
    characters of its id) or one policy (``name@version``, or 12+ hex digits of its sha256): a
    user's mistake, not a release of another run or policy."""
    hexadecimal = re.compile(r"[0-9a-fA-F]+")
    if run is not None and not (len(run) >= RUN_PREFIX and hexadecimal.fullmatch(run)):
        raise UserError(
            f"--run must be the run id or at least {RUN_PREFIX} of its hex characters; got {run!r}", field="run"
        )
    if (
        policy is not None
        and "@" not in policy
        and not (len(policy) >= POLICY_PREFIX and hexadecimal.fullmatch(policy))
    ):
        raise UserError(
            f"--policy must be NAME@VERSION or at least {POLICY_PREFIX} hex digits of the policy's sha256; got {policy!r}",
            field="policy",
        )


def _binding_problems(
    folder: Path, release: dict[str, str] | None, run: str | None, policy: str | None, signed: bool
) -> list[str]:
    """The release binding of the head (``signed`` or not) against the folder's name and the
    expected run and policy."""
    if release is None:
        if run is None and policy is None:
            return []
        return ["its head file predates the run binding (it names no run or policy): --run/--policy cannot be checked"]
    problems = []
    name = folder.resolve().name
    if release.get("folder") != name:
        problems.append(
            f"the folder is named {name!r} but its {'signed ' if signed else ''}head is for release "
            f"{release.get('folder')!r}: "
            "renamed or swapped with another release"
        )
    if run is not None and not release.get("run", "").startswith(run.lower()):
        problems.append(f"the release is of run {release.get('run')}, not of --run {run}")
    if policy is not None and not (
        policy == release.get("policy") or release.get("policy_sha256", "").startswith(policy.lower())
    ):
        problems.append(
            f"the release is of policy {release.get('policy')} (sha256 {release.get('policy_sha256', '')[:12]}), "
            f"not of --policy {policy}"
        )
    return problems
