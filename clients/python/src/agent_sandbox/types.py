"""Typed documents of the protocol (docs/protocol.md): tickets, run requests, run results,
session requests and results, the daemon's counters.

Each class has `to_json()` (a dict ready for `json.dumps`) and `from_json(doc)`.

Decoding answers (RunResult, SessionResult, ServiceStats and their parts) is
forward-compatible but never lossy: a field this version does not know is kept in the
object's `extra` dict and written back by `to_json()`, so a result decoded and re-encoded is
the document the daemon sent. A missing required field (`code` of a run result, `end` of a
session result, ...) or a known field of the wrong type raises ProtocolError naming it; an
omitted optional field takes the protocol's default. Code and reason strings are kept as
strings, so values appended within version 1 decode too; compare them with `Code`.

Request documents (Ticket, RunRequest, SessionRequest) are what this client sends; decoding
one refuses unknown fields, as the daemon would. Fields left `None` are not written, so the
daemon applies the protocol's defaults.
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass, field
from typing import Any, Mapping, Self

from .errors import ProtocolError

__all__ = [
    "Code", "Ticket", "EgressRule", "InputFile", "FilesOut", "RunRequest", "StreamSummary", "OutputFile",
    "DroppedFile", "Usage", "RuntimeInfo", "EgressAttempt", "QueueInfo", "RunResult",
    "SessionRequest", "SessionResult", "PoolStats", "ServiceStats", "RichOutput", "CellResult",
]


class Code(enum.StrEnum):
    """The stable codes of a run_result (docs/protocol.md, "Codes"). A StrEnum: members
    compare equal to the wire strings (`result.code == Code.TIMEOUT`)."""

    OK = "ok"
    INVALID_REQUEST = "invalid_request"
    SOURCE_TOO_LARGE = "source_too_large"
    ACTION_DENIED = "action_denied"
    APPROVAL_REQUIRED = "approval_required"
    APPROVAL_DENIED = "approval_denied"
    NETWORK_DISABLED = "network_disabled"
    TIMEOUT = "timeout"
    OOM = "oom"
    SECCOMP_VIOLATION = "seccomp_violation"
    OUTPUT_LIMIT = "output_limit"
    BLOB_NOT_FOUND = "blob_not_found"
    QUEUE_TIMEOUT = "queue_timeout"
    CAPACITY = "capacity"
    RUNTIME_UNAVAILABLE = "runtime_unavailable"
    DIGEST_MISMATCH = "digest_mismatch"
    INTERNAL = "internal"
    PIDS_LIMIT = "pids_limit"
    ERROR = "error"


# --- decoding helpers ----------------------------------------------------------------------

_REQUIRED: Any = object()
_NAMES = {int: "an integer", str: "a string", bool: "a boolean", list: "an array",
          dict: "an object", type(None): "null"}


def _is(value: Any, types: tuple[type, ...]) -> bool:
    if isinstance(value, bool):
        return bool in types
    return isinstance(value, types)


def _get(doc: Mapping[str, Any], key: str, types: tuple[type, ...], path: str,
         default: Any = _REQUIRED) -> Any:
    """doc[key] checked against `types` (bool is not an int), or `default` when absent."""
    if key not in doc:
        if default is _REQUIRED:
            raise ProtocolError(f"{path}{key}: required field is missing")
        return default
    value = doc[key]
    if not _is(value, types):
        expected = " or ".join(_NAMES.get(t, t.__name__) for t in types)
        raise ProtocolError(f"{path}{key}: expected {expected}")
    return value


def _object(doc: Any, path: str) -> Mapping[str, Any]:
    if not isinstance(doc, Mapping):
        raise ProtocolError(f"{path.rstrip('.') or 'document'}: expected an object")
    return doc


def _extra(doc: Mapping[str, Any], cls: type) -> dict[str, Any]:
    known = {f.name for f in dataclasses.fields(cls)}
    return {k: v for k, v in doc.items() if k not in known}


def _strict(doc: Mapping[str, Any], cls: type, path: str) -> None:
    known = {f.name for f in dataclasses.fields(cls)}
    for key in doc:
        if key not in known:
            raise ProtocolError(f"{path}unknown field {key!r}")


def _strings(doc: Mapping[str, Any], key: str, path: str) -> list[str] | None:
    values = _get(doc, key, (list,), path, None)
    if values is not None and not all(isinstance(v, str) for v in values):
        raise ProtocolError(f"{path}{key}: expected an array of strings")
    return values


def _list(doc: Mapping[str, Any], key: str, path: str, item: Any) -> list[Any]:
    return [item(_object(v, f"{path}{key}[{i}]."), f"{path}{key}[{i}].")
            for i, v in enumerate(_get(doc, key, (list,), path, []))]


def _sparse(obj: Any, skip: tuple[str, ...] = ()) -> dict[str, Any]:
    """The fields of a request dataclass that are set (not None), nested ones encoded."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if value is None or f.name in skip:
            continue
        if isinstance(value, list):
            value = [v.to_json() if hasattr(v, "to_json") else v for v in value]
        elif hasattr(value, "to_json"):
            value = value.to_json()
        out[f.name] = value
    return out


# --- requests -------------------------------------------------------------------------------

@dataclass
class Ticket:
    """What the host allows (docs/protocol.md, "ticket"). Sent with every run and session.

    `actions`: `code.execute`, `code.network`, `tool.run`. `isolation`: the minimum level,
    `process`, `container`, `gvisor` or `microvm`. `max_timeout_ms` (ms) and
    `max_memory_bytes` (bytes) are the ceilings of a run's limits (for a session, of its
    lifetime). `egress` is required with `code.network`, `tools` with `tool.run`;
    `expires_at` is `YYYY-MM-DDTHH:MM:SSZ`. `secrets` names the host-held secrets runs may
    use; `egress_rules` (EgressRule, only with `code.network`) narrow what runs may send to
    the hosts they name. `approval` is the approval request a derived
    ticket answers (a dict). A daemon with `--trusted-keys` takes signed ticket documents
    instead: pass those as plain dicts.
    """

    id: str
    tenant: str
    actions: list[str]
    isolation: str
    max_timeout_ms: int
    max_memory_bytes: int
    v: int = 1
    runtime_digest: str | None = None
    egress: list[str] | None = None
    expires_at: str | None = None
    derived_from: list[str] | None = None
    tools: list[str] | None = None
    profile: str | None = None
    approval: dict[str, Any] | None = None
    secrets: list[str] | None = None
    egress_rules: list[EgressRule] | None = None

    def to_json(self) -> dict[str, Any]:
        """The ticket document; fields left None are absent."""
        return _sparse(self)

    @classmethod
    def from_json(cls, doc: Mapping[str, Any], path: str = "") -> Ticket:
        """Decodes a ticket; raises ProtocolError on a missing, mistyped or unknown field."""
        doc = _object(doc, path)
        _strict(doc, cls, path)
        return cls(
            id=_get(doc, "id", (str,), path), tenant=_get(doc, "tenant", (str,), path),
            actions=_strings(doc, "actions", path) or [],
            isolation=_get(doc, "isolation", (str,), path),
            max_timeout_ms=_get(doc, "max_timeout_ms", (int,), path),
            max_memory_bytes=_get(doc, "max_memory_bytes", (int,), path),
            v=_get(doc, "v", (int,), path, 1),
            runtime_digest=_get(doc, "runtime_digest", (str,), path, None),
            egress=_strings(doc, "egress", path),
            expires_at=_get(doc, "expires_at", (str,), path, None),
            derived_from=_strings(doc, "derived_from", path),
            tools=_strings(doc, "tools", path),
            profile=_get(doc, "profile", (str,), path, None),
            approval=_get(doc, "approval", (dict,), path, None),
            secrets=_strings(doc, "secrets", path),
            egress_rules=(_list(doc, "egress_rules", path, EgressRule.from_json)
                          if "egress_rules" in doc else None))


@dataclass
class EgressRule:
    """An L7 egress rule of a ticket (docs/security.md, "L7 rules"): requests to `host` (an
    egress pattern the ticket's `egress` allows) must use one of `methods` (`GET`, `HEAD`,
    `POST`, `PUT`, `PATCH`, `DELETE`, `OPTIONS`) on a path under one of `paths` (prefixes
    starting with `/`, compared as sent, never decoded); `max_requests` and `max_bytes`
    (bytes of request and response bodies) are optional budgets over a whole run. `name`
    (`[a-z0-9-]`, 1-64, unique in the ticket) is what a refusal and an EgressAttempt name.
    The daemon validates the rest (protocol.md, "ticket")."""

    name: str
    host: str
    methods: list[str]
    paths: list[str]
    max_requests: int | None = None
    max_bytes: int | None = None

    def to_json(self) -> dict[str, Any]:
        """The rule's document; budgets left None are absent."""
        return _sparse(self)

    @classmethod
    def from_json(cls, doc: Mapping[str, Any], path: str = "") -> EgressRule:
        """Decodes a rule; raises ProtocolError on a missing, mistyped or unknown field."""
        doc = _object(doc, path)
        _strict(doc, cls, path)
        return cls(_get(doc, "name", (str,), path), _get(doc, "host", (str,), path),
                   _strings(doc, "methods", path) or [], _strings(doc, "paths", path) or [],
                   _get(doc, "max_requests", (int,), path, None),
                   _get(doc, "max_bytes", (int,), path, None))


@dataclass
class InputFile:
    """An input file of a run: `name` (1-255 bytes, no `/`) and the `blob` id
    (`sha256:<64 hex>`) of the tenant's blob holding its content (see Client.put_blob). The
    program finds it in `$SANDBOX_INPUT_DIR`."""

    name: str
    blob: str

    def to_json(self) -> dict[str, Any]:
        """`{"name": ..., "blob": ...}`."""
        return {"name": self.name, "blob": self.blob}

    @classmethod
    def from_json(cls, doc: Mapping[str, Any], path: str = "") -> InputFile:
        """Decodes one `files_in` entry."""
        doc = _object(doc, path)
        _strict(doc, cls, path)
        return cls(_get(doc, "name", (str,), path), _get(doc, "blob", (str,), path))


@dataclass
class FilesOut:
    """Caps on the output files a run returns (from `$SANDBOX_OUTPUT_DIR`): `max_files`
    (default 16) and `max_bytes` (bytes, default 8 MiB); the host clamps them."""

    max_files: int | None = None
    max_bytes: int | None = None

    def to_json(self) -> dict[str, Any]:
        """The set caps."""
        return _sparse(self)

    @classmethod
    def from_json(cls, doc: Mapping[str, Any], path: str = "") -> FilesOut:
        """Decodes a `files_out` object."""
        doc = _object(doc, path)
        _strict(doc, cls, path)
        return cls(_get(doc, "max_files", (int,), path, None),
                   _get(doc, "max_bytes", (int,), path, None))


@dataclass
class RunRequest:
    """What the model asks to run (docs/protocol.md, "run_request"): `runtime` + `source`, or
    a registered `tool` with `stdin` (text) or `stdin_blob` (a blob id).

    Unset fields (None) take the protocol's defaults: `timeout_ms` 2000 ms (clamped to the
    ticket's and host's ceiling), `memory_limit_bytes` 256 MiB, no network, no inputs,
    `files_out` 16 files / 8 MiB, empty `env`. `secrets` names host-held secrets a network
    run uses: the program sees only `SANDBOX_SECRET_<NAME>`, a per-run placeholder.
    """

    runtime: str | None = None
    source: str | None = None
    timeout_ms: int | None = None
    network: bool | None = None
    egress: list[str] | None = None
    secrets: list[str] | None = None
    files_in: list[InputFile] | None = None
    files_out: FilesOut | None = None
    memory_limit_bytes: int | None = None
    env: dict[str, str] | None = None
    runtime_digest: str | None = None
    tool: str | None = None
    stdin: str | None = None
    stdin_blob: str | None = None
    v: int = 1

    def to_json(self) -> dict[str, Any]:
        """The run_request document; fields left None are absent."""
        return _sparse(self)

    @classmethod
    def from_json(cls, doc: Mapping[str, Any], path: str = "") -> RunRequest:
        """Decodes a run request; raises ProtocolError on a mistyped or unknown field."""
        doc = _object(doc, path)
        _strict(doc, cls, path)
        files_out = _get(doc, "files_out", (dict,), path, None)
        env = _get(doc, "env", (dict,), path, None)
        return cls(
            runtime=_get(doc, "runtime", (str,), path, None),
            source=_get(doc, "source", (str,), path, None),
            timeout_ms=_get(doc, "timeout_ms", (int,), path, None),
            network=_get(doc, "network", (bool,), path, None),
            egress=_strings(doc, "egress", path),
            secrets=_strings(doc, "secrets", path),
            files_in=(_list(doc, "files_in", path, InputFile.from_json)
                      if "files_in" in doc else None),
            files_out=(None if files_out is None
                       else FilesOut.from_json(files_out, f"{path}files_out.")),
            memory_limit_bytes=_get(doc, "memory_limit_bytes", (int,), path, None),
            env=None if env is None else dict(env),
            runtime_digest=_get(doc, "runtime_digest", (str,), path, None),
            tool=_get(doc, "tool", (str,), path, None),
            stdin=_get(doc, "stdin", (str,), path, None),
            stdin_blob=_get(doc, "stdin_blob", (str,), path, None),
            v=_get(doc, "v", (int,), path, 1))


@dataclass
class SessionRequest:
    """A session of a registered server (docs/protocol.md, "Sessions over the daemon"): the
    registry entry `tool`, and optionally `max_lifetime_ms` and `idle_timeout_ms` (ms, > 0,
    clamped to the host's ceilings and the ticket's `max_timeout_ms`)."""

    tool: str
    max_lifetime_ms: int | None = None
    idle_timeout_ms: int | None = None

    def to_json(self) -> dict[str, Any]:
        """The session_request document; fields left None are absent."""
        return _sparse(self)

    @classmethod
    def from_json(cls, doc: Mapping[str, Any], path: str = "") -> SessionRequest:
        """Decodes a session request; raises ProtocolError on a bad or unknown field."""
        doc = _object(doc, path)
        known = {"v", "tool", "max_lifetime_ms", "idle_timeout_ms"}
        for key in doc:
            if key not in known:
                raise ProtocolError(f"{path}unknown field {key!r}")
        return cls(_get(doc, "tool", (str,), path),
                   _get(doc, "max_lifetime_ms", (int,), path, None),
                   _get(doc, "idle_timeout_ms", (int,), path, None))


# --- answers --------------------------------------------------------------------------------

def _encode(obj: Any) -> dict[str, Any]:
    """Every field of an answer dataclass (as the daemon writes them), then its extras. An
    optional field (declared `str | None`) that is None is absent, as the daemon leaves it."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(obj):
        if f.name == "extra":
            continue
        value = getattr(obj, f.name)
        if value is None and f.type == "str | None":
            continue
        if isinstance(value, list):
            value = [v.to_json() if hasattr(v, "to_json") else v for v in value]
        elif hasattr(value, "to_json"):
            value = value.to_json()
        out[f.name] = value
    out.update(obj.extra)
    return out


_FIELD_TYPES = {"str": (str,), "int": (int,), "bool": (bool,), "str | None": (str,)}


class _FlatAnswer:
    """An answer object whose fields are all strings, integers or booleans: `from_json`
    decodes each field as its dataclass declaration says (its type; its default, or required
    when it has none), so the declaration is the one place that says what a field is.
    Unknown fields go to `extra`; `to_json` writes every field, then the extras."""

    def to_json(self) -> dict[str, Any]:
        """The object as the daemon writes it, extras included."""
        return _encode(self)

    @classmethod
    def from_json(cls, doc: Mapping[str, Any], path: str = "") -> Self:
        """Decodes the object; ProtocolError names a missing required or mistyped field."""
        doc = _object(doc, path)
        values = {}
        for f in dataclasses.fields(cls):  # type: ignore[arg-type]
            if f.name == "extra":
                continue
            default = _REQUIRED if f.default is dataclasses.MISSING else f.default
            values[f.name] = _get(doc, f.name, _FIELD_TYPES[f.type], path, default)
        return cls(**values, extra=_extra(doc, cls))


@dataclass
class StreamSummary(_FlatAnswer):
    """A captured stream (`stdout`, `stderr`): `summary` (head and tail, at most 4 KiB, valid
    UTF-8), `blob` (blob id of the first `bytes` bytes, byte-exact; empty when nothing was
    stored), `bytes` (stored), `total_bytes` (written by the program), `truncated`."""

    summary: str = ""
    blob: str = ""
    bytes: int = 0
    total_bytes: int = 0
    truncated: bool = False
    extra: dict[str, Any] = field(default_factory=dict)



@dataclass
class OutputFile(_FlatAnswer):
    """A returned output file: its `name`, the `blob` id of its content, its size in
    `bytes`. Fetch the content with Client.get_blob."""

    name: str
    blob: str
    bytes: int
    extra: dict[str, Any] = field(default_factory=dict)



@dataclass
class DroppedFile(_FlatAnswer):
    """An output file not returned: `name_display` (escaped when not plain UTF-8) and the
    `reason`: `count_limit`, `bytes_limit`, `not_regular_file`, `bad_name`,
    `quota_exceeded`, `store_error`."""

    name_display: str
    reason: str
    extra: dict[str, Any] = field(default_factory=dict)



@dataclass
class Usage(_FlatAnswer):
    """What a run used: `setup_ms`, `wall_ms`, `cpu_ms` (ms) and `peak_memory_bytes`."""

    setup_ms: int = 0
    wall_ms: int = 0
    cpu_ms: int = 0
    peak_memory_bytes: int = 0
    extra: dict[str, Any] = field(default_factory=dict)



@dataclass
class RuntimeInfo(_FlatAnswer):
    """The runtime (or tool) that ran and its image's manifest `digest` (`sha256:...`)."""

    name: str = ""
    digest: str = ""
    extra: dict[str, Any] = field(default_factory=dict)



@dataclass
class EgressAttempt(_FlatAnswer):
    """A network attempt of the run: `protocol` (`tcp`, `udp`, `dns`, `unix`, `other`,
    `https`, `http`), `host`, `address`, `port`, whether it was `allowed` and why not
    (`reason`: `rule_refused`, `budget_exhausted`, `unsafe_path`, `secret_misuse`, ...), and
    `bytes_up` / `bytes_down` relayed through the egress proxy. For a request an L7 egress
    rule judged (docs/security.md, "L7 rules"): its `method` and `path` as sent (escaped, at
    most 256 bytes, without the query) and the `rule` that admitted or refused it (the host's
    rules, comma-separated, when none matched); None for every other attempt."""

    protocol: str = ""
    host: str = ""
    address: str = ""
    port: int = 0
    allowed: bool = False
    reason: str = ""
    bytes_up: int = 0
    bytes_down: int = 0
    method: str | None = None
    path: str | None = None
    rule: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)



@dataclass
class QueueInfo(_FlatAnswer):
    """For `capacity` and `queue_timeout`: the run's `position` among its tenant's queued
    runs (1-based), the host's queue `length`, and `retry_after_ms` (ms, a hint)."""

    position: int = 0
    length: int = 0
    retry_after_ms: int = 0
    extra: dict[str, Any] = field(default_factory=dict)



@dataclass
class RunResult:
    """How a run ended (docs/protocol.md, "run_result"). Every outcome is a result, never an
    exception: check `code` (a Code string: `ok`, `timeout`, `oom`, `action_denied`, ...)
    and `message`; `exit_code` / `signal` say how the main process ended (None when it did
    not). Times in ms, sizes in bytes. `approval` (for `approval_required`) and `receipt`
    (with `serve --receipt-key`) are kept as dicts.
    """

    code: str
    v: int = 1
    message: str = ""
    exit_code: int | None = None
    signal: int | None = None
    stdout: StreamSummary = field(default_factory=StreamSummary)
    stderr: StreamSummary = field(default_factory=StreamSummary)
    files_out: list[OutputFile] = field(default_factory=list)
    files_dropped: list[DroppedFile] = field(default_factory=list)
    usage: Usage = field(default_factory=Usage)
    oom_kills: int = 0
    timeout_clamped: bool = False
    memory_clamped: bool = False
    timeout_ms: int = 0
    memory_limit_bytes: int = 0
    isolation: str = "process"
    runtime: RuntimeInfo = field(default_factory=RuntimeInfo)
    egress_attempts: list[EgressAttempt] = field(default_factory=list)
    egress_attempts_dropped: int = 0
    violation: str | None = None
    run_id: str = ""
    backend: str = ""
    queue: QueueInfo | None = None
    queue_wait_ms: int = 0
    approval: dict[str, Any] | None = None
    receipt: dict[str, Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """True when `code` is `ok` (the exit code may still be non-zero)."""
        return self.code == Code.OK

    def to_json(self) -> dict[str, Any]:
        """The run_result document: every field (as the daemon writes it; `receipt` only
        when present), then the extras."""
        out = _encode(self)
        if self.receipt is None:
            del out["receipt"]
        return out

    @classmethod
    def from_json(cls, doc: Mapping[str, Any], path: str = "") -> RunResult:
        """Decodes a run_result; only `code` is required, unknown fields go to `extra`."""
        doc = _object(doc, path)
        p = path

        def nested(key: str, kind: Any) -> Any:
            value = _get(doc, key, (dict,), p, None)
            return kind() if value is None else kind.from_json(value, f"{p}{key}.")

        queue = _get(doc, "queue", (dict, type(None)), p, None)
        return cls(
            code=_get(doc, "code", (str,), p), v=_get(doc, "v", (int,), p, 1),
            message=_get(doc, "message", (str,), p, ""),
            exit_code=_get(doc, "exit_code", (int, type(None)), p, None),
            signal=_get(doc, "signal", (int, type(None)), p, None),
            stdout=nested("stdout", StreamSummary), stderr=nested("stderr", StreamSummary),
            files_out=_list(doc, "files_out", p, OutputFile.from_json),
            files_dropped=_list(doc, "files_dropped", p, DroppedFile.from_json),
            usage=nested("usage", Usage), oom_kills=_get(doc, "oom_kills", (int,), p, 0),
            timeout_clamped=_get(doc, "timeout_clamped", (bool,), p, False),
            memory_clamped=_get(doc, "memory_clamped", (bool,), p, False),
            timeout_ms=_get(doc, "timeout_ms", (int,), p, 0),
            memory_limit_bytes=_get(doc, "memory_limit_bytes", (int,), p, 0),
            isolation=_get(doc, "isolation", (str,), p, "process"),
            runtime=nested("runtime", RuntimeInfo),
            egress_attempts=_list(doc, "egress_attempts", p, EgressAttempt.from_json),
            egress_attempts_dropped=_get(doc, "egress_attempts_dropped", (int,), p, 0),
            violation=_get(doc, "violation", (str, type(None)), p, None),
            run_id=_get(doc, "run_id", (str,), p, ""),
            backend=_get(doc, "backend", (str,), p, ""),
            queue=None if queue is None else QueueInfo.from_json(queue, f"{p}queue."),
            queue_wait_ms=_get(doc, "queue_wait_ms", (int,), p, 0),
            approval=_get(doc, "approval", (dict, type(None)), p, None),
            receipt=_get(doc, "receipt", (dict,), p, None),
            extra=_extra(doc, cls))


@dataclass
class SessionResult:
    """How a session ended (docs/protocol.md, "session_result"): `end` (`closed`,
    `server_exited`, `idle_timeout`, `max_lifetime`, `ticket_expired`, `oom`,
    `seccomp_violation`, `killed`, `failed`), the RunResult of its life (`result.usage.wall_ms`
    is its lifetime in ms; stdout is never stored), and the bytes the server read from its
    stdin (`bytes_to_server`) and the daemon read from its stdout (`bytes_from_server`)."""

    end: str
    result: RunResult
    bytes_to_server: int
    bytes_from_server: int
    v: int = 1
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """The session_result document, extras included."""
        return _encode(self)

    @classmethod
    def from_json(cls, doc: Mapping[str, Any], path: str = "") -> SessionResult:
        """Decodes a session_result; `end`, `result` and both byte counts are required."""
        doc = _object(doc, path)
        return cls(_get(doc, "end", (str,), path),
                   RunResult.from_json(_get(doc, "result", (dict,), path), f"{path}result."),
                   _get(doc, "bytes_to_server", (int,), path),
                   _get(doc, "bytes_from_server", (int,), path),
                   _get(doc, "v", (int,), path, 1), _extra(doc, cls))


@dataclass
class PoolStats(_FlatAnswer):
    """One warm pool class of the daemon (docs/protocol.md, `service_stats`): the
    `isolation` level that keeps it, the `runtime` it serves and its `memory_limit_bytes`,
    its configured `size`, instances `ready` and `starting`, and since the start
    `handed_out` to runs and `failed`. `error` is None while the class works; else why it
    stopped preparing for good (a pre-started class whose `preload` import raised): its runs
    are served cold."""

    isolation: str = ""
    runtime: str = ""
    memory_limit_bytes: int = 0
    size: int = 0
    ready: int = 0
    starting: int = 0
    handed_out: int = 0
    failed: int = 0
    error: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class ServiceStats:
    """The daemon's counters: `sessions` open or opening (every client), bytes read from
    every session's stdout since the start (`session_stdout_bytes`), write data waiting in
    the daemon (`session_write_bytes`), answers not yet written to clients
    (`unwritten_bytes`), and its warm pools (`pools`, one PoolStats per class; empty with
    none, and from a daemon older than the member)."""

    sessions: int = 0
    session_stdout_bytes: int = 0
    session_write_bytes: int = 0
    unwritten_bytes: int = 0
    pools: list[PoolStats] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """The service_stats object, extras included."""
        return _encode(self)

    @classmethod
    def from_json(cls, doc: Mapping[str, Any], path: str = "") -> ServiceStats:
        """Decodes the counters; every member is optional, unknown ones go to `extra`."""
        doc = _object(doc, path)
        p = path
        return cls(
            sessions=_get(doc, "sessions", (int,), p, 0),
            session_stdout_bytes=_get(doc, "session_stdout_bytes", (int,), p, 0),
            session_write_bytes=_get(doc, "session_write_bytes", (int,), p, 0),
            unwritten_bytes=_get(doc, "unwritten_bytes", (int,), p, 0),
            pools=_list(doc, "pools", p, PoolStats.from_json),
            extra=_extra(doc, cls))



@dataclass
class RichOutput(_FlatAnswer):
    """A rich output of a cell: its `mime_type` (`image/png` for a figure), the `blob` id of
    its bytes and their size in `bytes`. Fetch the bytes with Client.get_blob."""

    mime_type: str
    blob: str
    bytes: int
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class CellResult:
    """What one interpreter cell gave (docs/protocol.md, "Interpreters over the daemon").
    `code` (`ok`, `error`, `timeout`, ...), `state` (`kept` or `lost`, from the host's
    evidence), `session_ended`, `value` (repr of the last expression), `error` (the
    exception's summary), the streams, files and rich outputs as blobs, and the cell's
    usage from the host's evidence: `wall_ms`, `cpu_ms` (the session's CPU during the cell)
    and `peak_memory_bytes`."""

    code: str
    state: str
    session_ended: bool
    message: str
    error: str
    value: str
    value_truncated: bool
    stdout: StreamSummary
    stderr: StreamSummary
    files_out: list[OutputFile]
    outputs: list[RichOutput]
    outputs_truncated: bool
    frames_dropped: int
    exit_code: int | None
    signal: int | None
    wall_ms: int
    cpu_ms: int
    peak_memory_bytes: int
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """True when `code` is `ok`."""
        return self.code == Code.OK

    def to_json(self) -> dict[str, Any]:
        """The cell_result object, extras included."""
        return _encode(self)

    @classmethod
    def from_json(cls, doc: Mapping[str, Any], path: str = "") -> CellResult:
        """Decodes a cell_result; every member is required, unknown ones go to `extra`."""
        doc = _object(doc, path)
        p = path
        return cls(
            code=_get(doc, "code", (str,), p), state=_get(doc, "state", (str,), p),
            session_ended=_get(doc, "session_ended", (bool,), p),
            message=_get(doc, "message", (str,), p), error=_get(doc, "error", (str,), p),
            value=_get(doc, "value", (str,), p),
            value_truncated=_get(doc, "value_truncated", (bool,), p),
            stdout=StreamSummary.from_json(_get(doc, "stdout", (dict,), p), f"{p}stdout."),
            stderr=StreamSummary.from_json(_get(doc, "stderr", (dict,), p), f"{p}stderr."),
            files_out=[OutputFile.from_json(_object(v, f"{p}files_out[{i}]."),
                                            f"{p}files_out[{i}].")
                       for i, v in enumerate(_get(doc, "files_out", (list,), p))],
            outputs=[RichOutput.from_json(_object(v, f"{p}outputs[{i}]."), f"{p}outputs[{i}].")
                     for i, v in enumerate(_get(doc, "outputs", (list,), p))],
            outputs_truncated=_get(doc, "outputs_truncated", (bool,), p),
            frames_dropped=_get(doc, "frames_dropped", (int,), p),
            exit_code=_get(doc, "exit_code", (int, type(None)), p),
            signal=_get(doc, "signal", (int, type(None)), p),
            wall_ms=_get(doc, "wall_ms", (int,), p),
            cpu_ms=_get(doc, "cpu_ms", (int,), p),
            peak_memory_bytes=_get(doc, "peak_memory_bytes", (int,), p),
            extra=_extra(doc, cls))
