"""Load a policy YAML: parse safely, validate, read its hierarchy files, hash it.

Every problem raises :class:`privrelease.errors.UserError` whose message names the file, the
line, the field path inside the YAML (``mechanisms[0].beta``), the bad value and what is allowed:

    adult.yaml, line 12, mechanisms[0].beta: beta must be in (0, 1]; got 1.2

YAML is read with PyYAML's safe loader, with YAML 1.2 scalars (only ``true``/``false`` are
booleans, so ``NO`` stays text; ``1e-9`` is a float) and duplicate keys rejected. Relative paths
are resolved against the policy file's folder.
"""

from __future__ import annotations

import copy
import csv
import functools
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any
from urllib.parse import urlparse
from urllib.request import url2pathname

import yaml
from pydantic import ValidationError
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from privrelease import identity
from privrelease.errors import UserError
from privrelease.mechanisms.schemes import ColumnScheme

from .canonical import policy_canonical_json, policy_sha256
from .fields import MIN_BETA, UNKNOWN_FIELD, FieldError, Hierarchy, Loc, format_loc, show
from .schema import MECHANISM_TYPES, HierarchyScheme, Policy

HIERARCHY_DELIMITER = ";"


@dataclass(frozen=True)
class LoadedPolicy:
    """A validated policy with its hierarchies read and its canonical content hash."""

    policy: Policy
    path: Path | None
    """The policy file (None when loaded from text)."""
    base_dir: Path
    """Folder that relative paths in the policy are resolved against."""
    hierarchies: Mapping[str, Hierarchy]
    """Column -> the parsed rows of its hierarchy file (one hierarchy file per column)."""
    sha256: str
    """:func:`privrelease.policies.policy_hash` of this policy."""

    def resolve(self, path: str) -> Path:
        """A path from the policy (relative, absolute or ``file://``) as an absolute path."""
        return resolve_path(path, self.base_dir)

    @property
    def dataset_path(self) -> Path:
        """Where the dataset is."""
        return self.resolve(self.policy.dataset.path)

    def data_file(self, override: str | Path | None = None) -> Path:
        """The real path of the data file a run reads: ``override`` (``--data``) or the
        policy's, confined to the policy's folder and the data roots (:func:`confine`); the run
        opens exactly that path (:func:`privrelease.datafiles.open_checked`)."""
        path = resolved(Path(override).expanduser()) if override else self.dataset_path
        folder_ok = self.policy.dataset.format == "parquet"
        return confine(path, self.base_dir, what="dataset" if folder_ok else "dataset file", folder_ok=folder_ok)

    def require_dataset_id(self) -> str | None:
        """``dataset.id``; :class:`UserError` when it is missing and a release charges the
        lifetime budget (which belongs to the people, so a run must say who they are)."""
        dataset_id = self.policy.dataset.id
        if dataset_id is None and self.policy.charges_budget:
            where = f"policy {self.policy.name}@{self.policy.version}" + (f" ({self.path})" if self.path else "")
            raise UserError(
                f"{where}: dataset.id is required for a release that charges the lifetime privacy "
                "budget; it names the population the data is about, and every file about the same "
                f"people shares its budget. Add it under dataset:, e.g. `id: {identity.EXAMPLE}`"
            )
        return dataset_id

    def scheme(self, column: str, candidate: str | None = None) -> ColumnScheme:
        """The compiled scheme of ``column`` (from ``candidate`` when it defines the column)."""
        scheme = self.policy.scheme_for(column, candidate)
        if scheme is None:
            raise KeyError(f"no generalization scheme for column {column!r}")
        return scheme.to_scheme(self.hierarchies.get(column))

    def schemes(self, columns: Iterable[str], candidate: str | None = None) -> dict[str, ColumnScheme]:
        """Compiled schemes of ``columns``, in that order."""
        return {column: self.scheme(column, candidate) for column in columns}

    def published_schemes(self, columns: Iterable[str]) -> dict[str, ColumnScheme]:
        """Compiled schemes of ``columns``, in that order; a column the policy generalizes by
        no scheme is published as it is (:class:`~privrelease.mechanisms.schemes.Keep`)."""
        from privrelease.mechanisms.schemes import Keep

        return {
            column: self.scheme(column) if self.policy.scheme_for(column) is not None else Keep() for column in columns
        }

    def labels(self, columns: Iterable[str], candidate: str | None = None) -> dict[str, list[str]]:
        """The labels each column can be published with, fixed by the policy alone: its
        declared ``values`` generalized by its scheme (``candidate``'s when it defines the
        column; kept as they are without one), or, for a hierarchy column without declared
        values, every label at the hierarchy's level. A column with neither has no declared
        domain: KeyError (the policy checks refuse it)."""
        import pyarrow as pa

        from privrelease.mechanisms.generalization import generalize
        from privrelease.mechanisms.schemes import Keep

        found: dict[str, list[str]] = {}
        for column in columns:
            spec = self.policy.dataset.columns[column]
            scheme = self.policy.scheme_for(column, candidate)
            if spec.values is None:
                if not isinstance(scheme, HierarchyScheme):
                    raise KeyError(f"column {column!r} declares no values and has no hierarchy")
                found[column] = sorted({row[scheme.level] for row in self.hierarchies[column]})
                continue
            array = pa.array(
                spec.values, type={"integer": pa.int64(), "float": pa.float64()}.get(spec.type, pa.string())
            )
            compiled = Keep() if scheme is None else self.scheme(column, candidate)
            generalized = generalize(pa.table({column: array}), {column: compiled})
            found[column] = sorted(set(generalized.column(column).to_pylist()))
        return found

    def label_count(self, column: str, candidate: str | None = None) -> int | None:
        """How many labels ``column`` can be published with under its scheme (``candidate``'s
        when it defines the column), from the policy alone: its declared values generalized
        (:meth:`labels`), else what the scheme fixes by itself (1 when suppressed, a label per
        bin, a map's labels and its default, a hierarchy's labels at its level). None when
        nothing bounds it: a column kept raw or top/bottom coded with no declared values."""
        from privrelease.policies.schema import BinsScheme, MapScheme, SuppressScheme

        scheme = self.policy.scheme_for(column, candidate)
        if self.policy.dataset.columns[column].values is not None or isinstance(scheme, HierarchyScheme):
            return len(self.labels([column], candidate)[column])
        if isinstance(scheme, SuppressScheme):
            return 1
        if isinstance(scheme, BinsScheme):
            return len(set(scheme.labels)) if scheme.labels else len(scheme.bins) - 1
        if isinstance(scheme, MapScheme):
            return len(set(scheme.map.values()) | ({scheme.default} if scheme.default is not None else set()))
        return None


def canonical_json(loaded: LoadedPolicy) -> str:
    """The canonical JSON text of a loaded policy."""
    return policy_canonical_json(loaded.policy, loaded.hierarchies)


def policy_hash(loaded: LoadedPolicy) -> str:
    """sha256 (hex) of :func:`canonical_json`."""
    return policy_sha256(loaded.policy, loaded.hierarchies)


def load_policy(path: str | Path) -> LoadedPolicy:
    """Read, validate and hash the policy file at ``path``."""
    text, path = read_policy_file(path)
    return _load(text, path.parent, source=str(path), path=path)


def read_policy_file(path: str | Path) -> tuple[str, Path]:
    """The text of the policy file at ``path`` and its real path; a UserError naming the
    path when it is missing, not a regular file, too large, unreadable or not UTF-8."""
    path = resolved(Path(path))
    try:
        if path.exists() and not path.is_dir() and not path.is_file():
            raise UserError(f"policy path is not a regular file (a device, pipe or socket): {path}")
        if path.is_file() and path.stat().st_size > MAX_POLICY_BYTES:
            raise UserError(f"policy file {path} is {path.stat().st_size} bytes; at most {MAX_POLICY_BYTES} (1 MiB)")
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UserError(f"policy file not found: {path}") from None
    except IsADirectoryError:
        raise UserError(f"policy path is a folder, not a YAML file: {path}") from None
    except UnicodeDecodeError as exc:
        raise UserError(f"policy file {path} is not UTF-8 text (byte {exc.start}); save it as UTF-8") from None
    except OSError as exc:
        raise UserError(f"cannot read policy file {path}: {exc.strerror}") from None
    return text, path


def load_policy_text(
    text: str, base_dir: str | Path, *, source: str = "<policy>", path: str | Path | None = None
) -> LoadedPolicy:
    """Validate and hash policy ``text``; relative paths resolve against ``base_dir``.

    ``source`` names the text in error messages; ``path``: the file it was read from, if any.
    """
    return _load(text, resolved(Path(base_dir)), source=source, path=None if path is None else Path(path))


PSEUDO_FILE_SYSTEMS = (Path("/proc"), Path("/sys"), Path("/dev"))


def confine(path: Path, policy_dir: Path, *, what: str, folder_ok: bool = False) -> Path:
    """The real path of ``path`` (every symlink resolved), once checked: it must be a regular file
    (or, ``folder_ok``, a folder: of Parquet files, each confined in turn when it is read)
    inside the policy's folder or a data root (``PRIVRELEASE_DATA_ROOTS``), never into a
    pseudo file system. The error names the path and the roots, never anything in the file."""
    from privrelease.settings import get_settings

    real = resolved(path)
    roots = (resolved(policy_dir), *get_settings().roots)
    if any(real.is_relative_to(pseudo) for pseudo in PSEUDO_FILE_SYSTEMS) or not any(
        real.is_relative_to(root) for root in roots
    ):
        shown = ", ".join(str(root) for root in roots)
        raise UserError(
            f"{what} {str(path)!r} is outside the folders data may be read from ({shown}); "
            "add its folder to PRIVRELEASE_DATA_ROOTS"
        )
    if real.exists() and not real.is_file() and not (folder_ok and real.is_dir()):
        kind = "a folder" if real.is_dir() else "not a regular file (a device, pipe or socket)"
        raise UserError(f"{what} {str(path)!r} is {kind}")
    return real


def resolve_path(path: str, base_dir: Path) -> Path:
    """A relative path (against ``base_dir``), an absolute path or a ``file://`` URI, as a Path."""
    if path.lower().startswith("file://"):
        parsed = urlparse(path)
        return Path(url2pathname(parsed.path))
    candidate = Path(path).expanduser()
    return candidate if candidate.is_absolute() else resolved(base_dir / candidate)


def resolved(path: Path) -> Path:
    """``path.resolve()``: absolute, every symlink resolved. A symlink on it swapped for a file
    while it is resolved makes ``resolve`` raise a bare ``OSError: [Errno 22]`` (``readlink`` of
    what is no longer a link): a :class:`UserError` naming the path instead."""
    try:
        return path.resolve()
    except OSError as error:
        raise UserError(
            f"{str(path)!r} changed while its symbolic links were resolved ({error.strerror or error}): "
            "nothing was read from it; run again"
        ) from None


# --------------------------------------------------------------------------- the steps


def _load(text: str, base_dir: Path, *, source: str, path: Path | None) -> LoadedPolicy:
    root, data = _parse_yaml(text, source)
    policy = _validate(data, root, source)
    hierarchies = _read_hierarchies(policy, base_dir, root, source)
    return LoadedPolicy(
        policy=policy,
        path=path,
        base_dir=base_dir,
        hierarchies=MappingProxyType(hierarchies),
        sha256=policy_sha256(policy, hierarchies),
    )


def _fail(source: str, root: Node | None, loc: Loc, message: str) -> UserError:
    """A UserError "``source``, line N, path: message" for the YAML location ``loc``."""
    line = _line_of(root, loc) if root is not None else None
    where = f"{source}, line {line}" if line else source
    return UserError(f"{where}, {format_loc(loc)}: {message}")


# --------------------------------------------------------------------------- YAML


_BOOL = "tag:yaml.org,2002:bool"
_FLOAT = "tag:yaml.org,2002:float"
_STR = "tag:yaml.org,2002:str"
_RETAGGED = ("tag:yaml.org,2002:int", _FLOAT, _BOOL, "tag:yaml.org,2002:timestamp")


class _PolicyYamlLoader(yaml.SafeLoader):
    """SafeLoader with YAML 1.2 booleans (true/false only) and floats (``1e-9`` included)."""


_PolicyYamlLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag not in (_BOOL, _FLOAT)]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_PolicyYamlLoader.add_implicit_resolver(_BOOL, re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF"))
_PolicyYamlLoader.add_implicit_resolver(
    _FLOAT,
    re.compile(
        r"""^(?:[-+]?(?:[0-9][0-9_]*\.[0-9_]*|\.[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)?
            |[-+]?[0-9][0-9_]*[eE][-+]?[0-9]+
            |[-+]?\.(?:inf|Inf|INF)
            |\.(?:nan|NaN|NAN))$""",
        re.VERBOSE,
    ),
    list("-+0123456789."),
)


def _parse_yaml(text: str, source: str) -> tuple[MappingNode, Any]:
    """The node tree (for line numbers) and the plain data of a policy document."""
    if len(text) > MAX_POLICY_BYTES:
        raise UserError(f"{source}: the policy is {len(text)} characters; at most {MAX_POLICY_BYTES} (1 MiB)")
    loader = _PolicyYamlLoader(text)
    try:
        root = loader.get_single_node()
        if root is None:
            raise UserError(f"{source}: the policy is empty; expected a YAML mapping with name, version, ...")
        if not isinstance(root, MappingNode):
            raise UserError(
                f"{source}, line {root.start_mark.line + 1}: the policy must be a YAML mapping "
                f"(name: ..., dataset: ...); got a {'list' if isinstance(root, SequenceNode) else 'scalar'}"
            )
        _check_size(root, source)
        _reject_duplicate_keys(root, (), source, set())
        _keep_text_raw(root)
        data = loader.construct_document(root)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"{source}, line {mark.line + 1}, column {mark.column + 1}" if mark else source
        problem = " ".join(p for p in (exc.context, exc.problem) if p)
        raise UserError(f"{where}: invalid YAML: {problem}") from None
    except yaml.YAMLError as exc:
        raise UserError(f"{source}: invalid YAML: {exc}") from None
    except RecursionError:
        raise UserError(f"{source}: invalid YAML: nested deeper than {MAX_DEPTH} levels") from None
    finally:
        loader.dispose()
    return root, data


MAX_POLICY_BYTES = 1 << 20
MAX_DEPTH = 50  # a policy nests about five levels
MAX_VALUES = 100_000  # YAML values after expanding aliases: bounds the work of every later step


def _check_size(root: Node, source: str) -> None:
    """Refuse a document nested deeper than :data:`MAX_DEPTH`, with a recursive alias, or
    holding more than :data:`MAX_VALUES` values once its aliases are expanded (an "alias bomb":
    500 bytes that expand to billions of values). Iterative; each node is counted once."""
    expanded: dict[int, int] = {}
    open_nodes: set[int] = set()
    stack: list[tuple[Node, int, bool]] = [(root, 1, False)]
    while stack:
        node, depth, finished = stack.pop()
        children = [part for pair in node.value for part in pair] if isinstance(node, MappingNode) else []
        if isinstance(node, SequenceNode):
            children = list(node.value)
        where = f"{source}, line {node.start_mark.line + 1}"
        if finished:
            open_nodes.discard(id(node))
            expanded[id(node)] = 1 + sum(expanded[id(child)] for child in children)
            if expanded[id(node)] > MAX_VALUES:
                raise UserError(
                    f"{where}: the policy expands to more than {MAX_VALUES} values through YAML aliases "
                    "(anchors repeated inside each other); a policy is a few hundred values"
                )
            continue
        if id(node) in expanded:
            continue
        if id(node) in open_nodes:
            raise UserError(f"{where}: a YAML alias refers to a node that contains it (a recursive structure)")
        if depth > MAX_DEPTH:
            raise UserError(f"{where}: invalid YAML: nested deeper than {MAX_DEPTH} levels")
        open_nodes.add(id(node))
        stack.append((node, depth, True))
        stack.extend((child, depth + 1, False) for child in children)


def _reject_duplicate_keys(node: Node, loc: Loc, source: str, seen: set[int]) -> None:
    if id(node) in seen:
        return
    seen.add(id(node))
    if isinstance(node, MappingNode):
        first_line: dict[str, int] = {}
        for key, value in node.value:
            if isinstance(key, ScalarNode):
                line = key.start_mark.line + 1
                if key.value in first_line:
                    raise UserError(
                        f"{source}, line {line}, {format_loc((*loc, key.value))}: duplicate key "
                        f"{key.value!r} (first at line {first_line[key.value]}); each key may appear once"
                    )
                first_line[key.value] = line
                _reject_duplicate_keys(value, (*loc, key.value), source, seen)
    elif isinstance(node, SequenceNode):
        for i, item in enumerate(node.value):
            _reject_duplicate_keys(item, (*loc, i), source, seen)


def _keep_text_raw(root: MappingNode) -> None:
    """Read plain scalars where the schema wants text as written: ``version: 1.10`` is "1.10",
    a map key ``01`` stays "01" (not the number 1)."""
    top = _pairs(root)
    for field in ("name", "version", "description"):
        _as_text(top.get(field))
    dataset = _pairs(top.get("dataset"))
    _as_text_items(dataset.get("missing_values"))
    for spec in _pairs(dataset.get("columns")).values():
        spec_pairs = _pairs(spec)
        type_node = spec_pairs.get("type")
        if isinstance(type_node, ScalarNode) and type_node.value == "string":
            _as_text_items(spec_pairs.get("values"))
    schemes = list(_pairs(top.get("generalization")).values())
    for candidate in _pairs(top.get("candidate_schemes")).values():
        schemes.extend(_pairs(candidate).values())
    for scheme in schemes:
        scheme_pairs = _pairs(scheme)
        _as_text_items(scheme_pairs.get("labels"))
        _as_text(scheme_pairs.get("default"))
        map_node = scheme_pairs.get("map")
        if isinstance(map_node, MappingNode):
            for key, value in map_node.value:
                _as_text(key)
                _as_text(value)


def _pairs(node: Node | None) -> dict[str, Node]:
    if not isinstance(node, MappingNode):
        return {}
    return {k.value: v for k, v in node.value if isinstance(k, ScalarNode)}


def _as_text(node: Node | None) -> None:
    """Retag a plain (unquoted) number, boolean or date scalar as text."""
    if isinstance(node, ScalarNode) and node.style is None and node.tag in _RETAGGED:
        node.tag = _STR


def _as_text_items(node: Node | None) -> None:
    if isinstance(node, SequenceNode):
        for item in node.value:
            _as_text(item)


def _line_of(root: Node, loc: Loc) -> int:
    """The 1-based line of the deepest node of ``loc`` present in the YAML (a key's own line)."""
    node = root
    line = root.start_mark.line + 1
    for part in loc:
        if isinstance(node, MappingNode):
            for key, value in node.value:
                if isinstance(key, ScalarNode) and key.value == str(part):
                    node, line = value, key.start_mark.line + 1
                    break
            else:
                return line
        elif isinstance(node, SequenceNode) and isinstance(part, int) and 0 <= part < len(node.value):
            node = node.value[part]
            line = node.start_mark.line + 1
        else:
            return line
    return line


# --------------------------------------------------------------------------- validation errors


_TYPE_PHRASES = {
    "int_type": "must be an integer",
    "int_parsing": "must be an integer",
    "int_from_float": "must be an integer",
    "float_type": "must be a number",
    "float_parsing": "must be a number",
    "finite_number": "must be a finite number",
    "string_type": "must be text",
    "bool_type": "must be true or false",
    "bool_parsing": "must be true or false",
    "list_type": "must be a list",
    "tuple_type": "must be a list",
    "dict_type": "must be a mapping (key: value)",
    "model_type": "must be a mapping (key: value)",
    "model_attributes_type": "must be a mapping (key: value)",
}


_REQUIRED_HINTS = {
    "name": "non-empty text",
    "version": 'text such as "1"',
    "dataset": "a mapping with path and columns (and optionally format, csv, rows, missing)",
    "path": "a file path (relative to the policy's folder) or a file:// URI",
    "columns": "the columns used, each with its type",
    "mechanisms": f"a list of mechanisms ({', '.join(MECHANISM_TYPES)})",
    "k": "an integer in [1, 100000]",
    "beta": f"a number in [{MIN_BETA:g}, 1]",
    "epsilon": "a number in (0, 100]",
    "gamma": "an integer in [2, 100000]",
    "rho": "a number in (0, 1)",
    "query": "count, sum or mean",
    "sensitive": "a list of sensitive columns",
    "candidates": "a list of candidate scheme names",
    "hierarchy": "the path of an ARX hierarchy CSV",
    "level": "an integer in [0, 1000]",
    "bins": "a list of increasing edges",
    "t_p": "a number in (0, 1)",
    "alpha": "an integer >= 1",
    "t_e": "a number in (0, 1)",
    "t_f": "a number > 0",
}
"""What a required field takes, for "``field`` is required: ..." messages."""


def _validate(data: Any, root: Node, source: str) -> Policy:
    """The validated policy, or one UserError listing every problem. An unknown field stops
    pydantic inside its mapping, so validation is repeated without the unknown keys (at most
    once per nesting level) until what remains shows its own problems."""
    problems: list[tuple[Loc, str]] = []
    for _ in range(MAX_DEPTH):
        try:
            policy = Policy.model_validate(data)
        except ValidationError as exc:
            errors = _one_per_alternative(exc.errors(include_url=False))
            found = [problem for error in errors for problem in _describe(error, data)]
            problems += found
            unknown = [loc for loc, message in found if message.startswith(UNKNOWN_FIELD)]
            if not unknown:
                break
            data = copy.deepcopy(data)
            for loc in unknown:
                _delete(data, loc)
            continue
        if not problems:
            return policy
        break
    raise _user_error(problems, root, source)


def _delete(data: Any, loc: Loc) -> None:
    """Remove the key at ``loc`` from nested dicts and lists (if it is there)."""
    for part in loc[:-1]:
        try:
            data = data[part]
        except (KeyError, IndexError, TypeError):
            return
    if isinstance(data, dict):
        data.pop(loc[-1], None)


def _user_error(problems: list[tuple[Loc, str]], root: Node, source: str) -> UserError:
    """One UserError listing every problem, one per line in line order (each with the file,
    line, YAML path, value and what is allowed)."""
    located = sorted(((_line_of(root, loc), loc, msg) for loc, msg in problems), key=lambda p: p[0])
    lines = list(dict.fromkeys(f"{source}, line {line}, {format_loc(loc)}: {msg}" for line, loc, msg in located))
    count = f"{len(lines)} problems in this policy:\n" if len(lines) > 1 else ""
    return UserError(count + "\n".join(lines), field=format_loc(located[0][1]))


_LIST_TYPES = ("tuple_type", "list_type")


def _one_per_alternative(errors: list[Any]) -> list[Any]:
    """Pydantic's errors, a field that is one value or a list of them (``sigma: S`` or one per
    table) refused once: given one value, its own error, saying that a list of such values is
    allowed too, without the list alternative's "must be a list" beside it; given a list, its
    entries' errors, without the one value's refusing the list."""
    listed = {tuple(error["loc"][:-1]) for error in errors if error["type"] in _LIST_TYPES and error["loc"]}
    entries = {
        tuple(error["loc"][:-2])
        for error in errors
        if len(error["loc"]) >= 2 and isinstance(error["loc"][-1], int) and "[" in str(error["loc"][-2])
    }
    found = []
    for error in errors:
        if error["loc"] and tuple(error["loc"][:-1]) in entries and isinstance(error.get("input"), (list, tuple)):
            continue  # the one-value alternative refusing a list: the entries' errors say what is wrong
        if error["loc"] and tuple(error["loc"][:-1]) in listed:
            if error["type"] in _LIST_TYPES:
                continue
            error = {**error, "or_list": True}
        found.append(error)
    return found


def _describe(error: Mapping[str, Any], data: Any) -> list[tuple[Loc, str]]:
    """(location in the YAML, message) pairs for one pydantic error in ``data`` (a value that
    may also be a list: :func:`_one_per_alternative`)."""
    described = _described(error, data)
    if not error.get("or_list"):
        return described
    return [(loc, _or_a_list(message)) for loc, message in described]


def _or_a_list(message: str) -> str:
    """``message`` ("X must be A; got V") saying that a list of such values is allowed too."""
    rule, got, value = message.partition("; got ")
    return f"{rule} (or a list of such values){got}{value}"


def _described(error: Mapping[str, Any], data: Any) -> list[tuple[Loc, str]]:
    """(location in the YAML, message) pairs for one pydantic error in ``data``."""
    kind, raw = error["type"], tuple(error["loc"])
    loc = _in_document(raw, data, missing=kind == "missing")
    ctx = error.get("ctx") or {}
    cause = ctx.get("error")
    if isinstance(cause, FieldError):
        # an issue's own parts name fields (the last may be missing), after pydantic's location
        return [
            (_in_document((*raw, *issue.loc), data, missing=bool(issue.loc)), issue.message) for issue in cause.issues
        ]
    if cause is not None:
        return [(loc, str(cause))]
    name = next((str(p) for p in reversed(loc) if isinstance(p, str)), "value")
    value = show(error.get("input"))
    if kind == "missing" and raw and isinstance(raw[-1], int):  # a fixed-length list, too short
        given = functools.reduce(lambda node, part: node[part], loc, data)
        return [(loc, f"{name} has too few entries: entry {raw[-1] + 1} is missing; got {show(given)}")]
    if kind == "missing":
        hint = _REQUIRED_HINTS.get(name)
        return [(loc, f"{name} is required" + (f": {hint}" if hint else ""))]
    if kind == "union_tag_invalid":
        return [
            (
                (*loc, "type"),
                f"type must be one of {', '.join(MECHANISM_TYPES)}; got {show(ctx.get('tag'))}",
            )
        ]
    if kind == "union_tag_not_found":
        return [((*loc, "type"), f"type is required: one of {', '.join(MECHANISM_TYPES)}")]
    if kind == "scheme_form":
        return [(loc, f"{error['msg']}; got {value}")]
    if kind == "literal_error":
        return [(loc, f"{name} must be one of {ctx.get('expected')}; got {value}")]
    if kind == "too_short":
        count = ctx.get("min_length", 1)
        return [
            (
                loc,
                f"{name} must have at least {count} entr{'y' if count == 1 else 'ies'}; got {value}",
            )
        ]
    phrase = _TYPE_PHRASES.get(kind)
    if phrase is not None:
        return [(loc, f"{name} {phrase}; got {value}")]
    return [(loc, f"{name}: {error['msg']}; got {value}")]


def _in_document(loc: Loc, data: Any, *, missing: bool = False) -> Loc:
    """``loc`` as a path in the YAML document ``data``, without the parts pydantic adds that name
    nothing in it: a union's tag (``mechanisms.0.sdgs.beta``, ``...noise.gaussian.sigma``; also
    when the tag is a key of the same mapping, ``generalization.age.hierarchy.level``), ``[key]``,
    anything below a scalar. With ``missing`` the last part stays: the missing field."""
    parts: list[Any] = []
    node = data
    for index, part in enumerate(loc):
        after = loc[index + 1 :]
        if _has(node, part) and not (after and _has(node, after[0]) and not _has(node[part], after[0])):
            parts.append(part)
            node = node[part]
        elif missing and isinstance(node, dict) and not after:
            parts.append(part)
    return tuple(parts)


def _has(node: Any, part: Any) -> bool:
    if isinstance(node, dict):
        return part in node
    return isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node)


# --------------------------------------------------------------------------- hierarchies


def _read_hierarchies(policy: Policy, base_dir: Path, root: Node, source: str) -> dict[str, Hierarchy]:
    """Parse every hierarchy file the policy names; one file per column; check each level."""
    files: dict[str, tuple[Path, Loc]] = {}
    hierarchies: dict[str, Hierarchy] = {}
    for loc, column, scheme in policy.scheme_locations():
        if not isinstance(scheme, HierarchyScheme):
            continue
        file = resolve_path(scheme.hierarchy, base_dir)
        if column in files and files[column][0] != file:
            first_path, first_loc = files[column]
            raise _fail(
                source,
                root,
                (*loc, "hierarchy"),
                f"column {column!r} already uses hierarchy {first_path} (at {format_loc(first_loc)}); "
                f"got {file}: one hierarchy file per column",
            )
        if column not in hierarchies:
            try:
                hierarchies[column] = read_hierarchy(confine(file, base_dir, what="hierarchy file"))
            except (ValueError, UserError) as exc:
                raise _fail(source, root, (*loc, "hierarchy"), str(exc)) from None
            files[column] = (file, loc)
        rows = hierarchies[column]
        depth = len(rows[0]) - 1
        if scheme.level > depth:
            raise _fail(
                source,
                root,
                (*loc, "level"),
                f"level must be between 0 and {depth} for hierarchy {file.name} ({depth + 1} columns: "
                f"levels 0..{depth}); got {scheme.level}",
            )
        spec = policy.dataset.columns[column]
        if spec.values is not None:
            leaves = {row[0] for row in rows}
            missing = [v for v in spec.values if str(v) not in leaves]
            if missing:
                raise _fail(
                    source,
                    root,
                    (*loc, "hierarchy"),
                    f"declared value(s) {show(missing)} of column {column!r} are not leaves of hierarchy {file}",
                )
    return hierarchies


def read_hierarchy(path: Path) -> Hierarchy:
    """Parse an ARX hierarchy CSV (``value;level1;...;*``, no header); ValueError if malformed.

    Blank lines are skipped. Every row has the same number (>= 2) of columns, leaves are unique
    and the last column is ``*`` everywhere.
    """
    try:
        with path.open(newline="", encoding="utf-8-sig") as handle:
            numbered = [
                (n, tuple(row)) for n, row in enumerate(csv.reader(handle, delimiter=HIERARCHY_DELIMITER), 1) if row
            ]
    except FileNotFoundError:
        raise ValueError(
            f"hierarchy file not found: {path} (relative paths resolve against the policy's folder)"
        ) from None
    except IsADirectoryError:
        raise ValueError(f"hierarchy path is a folder, not a CSV file: {path}") from None
    except UnicodeDecodeError as exc:
        raise ValueError(f"hierarchy file {path} is not UTF-8 text (byte {exc.start})") from None
    except csv.Error as exc:
        raise ValueError(f"hierarchy file {path} is not valid CSV: {exc}") from None
    if not numbered:
        raise ValueError(f"hierarchy file {path} is empty; expected rows value;level1;...;*")
    first_line, first = numbered[0]
    if len(first) < 2:
        raise ValueError(
            f"hierarchy file {path} has one column (row {first_line}: {show(first)}); expected at least "
            f"value;* separated by {HIERARCHY_DELIMITER!r}"
        )
    leaves: dict[str, int] = {}
    for line, row in numbered:
        if len(row) != len(first):
            raise ValueError(
                f"hierarchy file {path} is ragged: row {line} has {len(row)} columns but row {first_line} "
                f"has {len(first)}; every row must have the same number of columns"
            )
        if row[-1] != "*":
            raise ValueError(
                f"hierarchy file {path}: row {line} ends with {row[-1]!r}; the last column must be '*' in every row"
            )
        if row[0] in leaves:
            raise ValueError(
                f"hierarchy file {path}: leaf {row[0]!r} appears in rows {leaves[row[0]]} and {line}; "
                "each value may appear once"
            )
        leaves[row[0]] = line
    return tuple(row for _, row in numbered)
