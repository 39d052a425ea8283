"""The documents' JSON forms, without a daemon."""

import pytest

from agent_sandbox import (Code, EgressRule, FilesOut, InputFile, PoolStats, ProtocolError,
                           RunRequest, RunResult, ServiceStats, SessionResult, Ticket)


def test_request_writes_only_what_is_set():
    request = RunRequest(runtime="python3", source="print(1)", timeout_ms=500,
                         files_in=[InputFile("a.txt", "sha256:" + "0" * 64)],
                         files_out=FilesOut(max_files=1))
    doc = request.to_json()
    assert doc == {"v": 1, "runtime": "python3", "source": "print(1)", "timeout_ms": 500,
                   "files_in": [{"name": "a.txt", "blob": "sha256:" + "0" * 64}],
                   "files_out": {"max_files": 1}}
    assert RunRequest.from_json(doc) == request


def test_ticket_round_trip_and_unknown_field_refused():
    t = Ticket(id="t", tenant="acme", actions=["tool.run"], tools=["cat"],
               isolation="process", max_timeout_ms=1000, max_memory_bytes=1 << 28)
    assert Ticket.from_json(t.to_json()) == t
    with pytest.raises(ProtocolError, match="unknown field 'bogus'"):
        Ticket.from_json({**t.to_json(), "bogus": 1})


def test_secrets_by_name_in_requests_and_tickets():
    request = RunRequest(runtime="python3", source="print(1)", network=True,
                         egress=["api.rates.example"], secrets=["rates-api"])
    assert request.to_json()["secrets"] == ["rates-api"]
    assert RunRequest.from_json(request.to_json()) == request
    t = Ticket(id="t", tenant="acme", actions=["code.execute"], isolation="process",
               max_timeout_ms=1000, max_memory_bytes=1 << 28, secrets=["rates-api"])
    assert Ticket.from_json(t.to_json()) == t
    with pytest.raises(ProtocolError):
        RunRequest.from_json({**request.to_json(), "secrets": "rates-api"})


def test_tickets_carry_l7_rules_and_attempts_name_them():
    rule = EgressRule(name="rates-read", host="api.rates.example", methods=["GET"],
                      paths=["/v1/rates/"], max_requests=10)
    t = Ticket(id="t", tenant="acme", actions=["code.execute", "code.network"],
               isolation="container", max_timeout_ms=1000, max_memory_bytes=1 << 28,
               egress=["api.rates.example"], egress_rules=[rule])
    doc = t.to_json()
    assert doc["egress_rules"] == [{"name": "rates-read", "host": "api.rates.example",
                                    "methods": ["GET"], "paths": ["/v1/rates/"],
                                    "max_requests": 10}]
    assert Ticket.from_json(doc) == t
    bare = Ticket.from_json({k: v for k, v in doc.items() if k != "egress_rules"})
    assert bare.egress_rules is None and "egress_rules" not in bare.to_json()
    assert "max_bytes" not in doc["egress_rules"][0]
    for bad, field in [({"methods": "GET"}, "methods"), ({"max_bytes": True}, "max_bytes"),
                       ({"verbs": ["GET"]}, "verbs")]:
        with pytest.raises(ProtocolError, match=field):
            Ticket.from_json({**doc, "egress_rules": [{**doc["egress_rules"][0], **bad}]})
    # An attempt an L7 rule judged names its method, path and rule; others have none, and
    # encode as the daemon writes them (without those members).
    judged = {"protocol": "https", "host": "api.rates.example", "port": 443,
              "allowed": False, "reason": "rule_refused", "method": "POST",
              "path": "/v1/rates/eu", "rule": "rates-read"}
    plain = {"protocol": "tcp", "host": "", "address": "10.0.0.1", "port": 22,
             "allowed": False, "reason": "direct connect"}
    r = RunResult.from_json({"code": "ok", "egress_attempts": [judged, plain]})
    a, b = r.egress_attempts
    assert (a.method, a.path, a.rule, a.extra) == ("POST", "/v1/rates/eu", "rates-read", {})
    assert (b.method, b.path, b.rule) == (None, None, None)
    assert "method" not in b.to_json() and a.to_json()["rule"] == "rates-read"
    assert RunResult.from_json(r.to_json()) == r
    with pytest.raises(ProtocolError, match="method"):
        RunResult.from_json({"code": "ok", "egress_attempts": [{**judged, "method": 1}]})


def test_result_keeps_unknown_fields_and_defaults_omitted_ones():
    doc = {"code": "pids_limit", "stdout": {"summary": "x", "new_stream_field": 3},
           "future_field": [1, 2]}
    r = RunResult.from_json(doc)
    assert r.code == Code.PIDS_LIMIT and not r.ok
    assert r.stdout.summary == "x" and r.stdout.extra == {"new_stream_field": 3}
    assert r.extra == {"future_field": [1, 2]} and r.exit_code is None and r.usage.wall_ms == 0
    again = r.to_json()
    assert again["future_field"] == [1, 2] and again["stdout"]["new_stream_field"] == 3
    assert RunResult.from_json(again) == r


@pytest.mark.parametrize("doc, message", [
    ({}, "code: required field is missing"),
    ({"code": "ok", "exit_code": "0"}, "exit_code: expected an integer or null"),
    ({"code": "ok", "usage": {"wall_ms": True}}, "usage.wall_ms: expected an integer"),
    ({"code": "ok", "files_out": [{"name": "a", "blob": "b"}]},
     r"files_out\[0\].bytes: required field is missing"),
])
def test_result_refuses_missing_or_mistyped_fields(doc, message):
    with pytest.raises(ProtocolError, match=message):
        RunResult.from_json(doc)


def test_session_result_requires_its_fields():
    with pytest.raises(ProtocolError, match="bytes_from_server: required"):
        SessionResult.from_json({"end": "closed", "result": {"code": "ok"},
                                 "bytes_to_server": 1})


def test_service_stats_decode_pools_and_tolerate_their_absence():
    working = {"isolation": "process", "runtime": "python3", "memory_limit_bytes": 268435456,
               "size": 2, "ready": 1, "starting": 1, "handed_out": 7, "failed": 0}
    stopped = {"isolation": "process", "runtime": "python3", "memory_limit_bytes": 134217728,
               "size": 1, "ready": 0, "starting": 0, "handed_out": 0, "failed": 1,
               "error": "importing preload module 'os.nope' raised 'ModuleNotFoundError'",
               "new_pool_field": True}
    doc = {"sessions": 1, "session_stdout_bytes": 2, "session_write_bytes": 3,
           "unwritten_bytes": 4, "pools": [working, stopped]}
    s = ServiceStats.from_json(doc)
    assert (s.sessions, s.session_stdout_bytes, s.unwritten_bytes) == (1, 2, 4)
    a, b = s.pools
    assert a == PoolStats("process", "python3", 268435456, 2, 1, 1, 7, 0)
    assert a.error is None and "error" not in a.to_json()
    assert (b.memory_limit_bytes, b.failed, b.extra) == (134217728, 1, {"new_pool_field": True})
    assert b.error is not None and "os.nope" in b.error
    # Written back as the daemon wrote it: members in order, extras after.
    assert s.to_json() == doc and list(s.to_json()["pools"][1]) == list(stopped)
    assert ServiceStats.from_json(s.to_json()) == s
    # A daemon older than `pools`: no pools.
    old = ServiceStats.from_json({"sessions": 0, "session_stdout_bytes": 0,
                                  "session_write_bytes": 0, "unwritten_bytes": 0})
    assert old.pools == [] and old.to_json()["pools"] == []
    with pytest.raises(ProtocolError, match=r"service_stats.pools\[0\].ready: expected an integer"):
        ServiceStats.from_json({"pools": [{**working, "ready": "1"}]}, "service_stats.")
    with pytest.raises(ProtocolError, match="service_stats.pools: expected an array"):
        ServiceStats.from_json({"pools": {}}, "service_stats.")


def test_connecting_where_no_daemon_listens_is_a_daemon_connection_error(tmp_path):
    """No socket, or a socket nobody listens on: DaemonConnectionError (an OSError with the
    cause's errno), naming the path; the same from the asyncio client."""
    import asyncio
    import errno
    import socket

    from agent_sandbox import Client, DaemonConnectionError
    from agent_sandbox.aio import AsyncClient

    missing = tmp_path / "no-such.sock"
    with pytest.raises(DaemonConnectionError) as e:
        Client(missing, connect_timeout=1)
    assert isinstance(e.value, OSError) and e.value.errno == errno.ENOENT
    assert str(missing) in str(e.value)
    dead = tmp_path / "dead.sock"
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(str(dead))  # bound, never listening: refused
    try:
        with pytest.raises(DaemonConnectionError) as e:
            Client(dead, connect_timeout=1)
        assert e.value.errno == errno.ECONNREFUSED

        async def connect():
            return await AsyncClient.connect(missing)

        with pytest.raises(DaemonConnectionError) as e:
            asyncio.run(connect())
        assert e.value.errno == errno.ENOENT
    finally:
        s.close()
