"""The sync Client against a real daemon."""

import concurrent.futures
import signal
import time

import pytest

from agent_sandbox import (Client, Code, DaemonConnectionError, InputFile, LineTooLongError,
                           RunRequest, SandboxError, SessionRequest, Ticket)

WAIT = 60  # seconds: far above any answer's need; a hang fails instead of blocking


def python(source, **kw):
    return RunRequest(runtime="python3", source=source, **kw)


def test_run_ok(daemon, ticket):
    with Client(daemon.socket) as sb:
        r = sb.run(ticket, python("print(6 * 7)"), timeout=WAIT)
    assert r.code == Code.OK and r.exit_code == 0
    assert r.stdout.summary == "42\n" and r.stdout.bytes == 3
    assert r.runtime.name == "python3" and r.isolation == "process" and r.run_id


def test_non_ok_codes_are_results(daemon, ticket):
    denied = Ticket(id="t-none", tenant="pyclient", actions=[], isolation="process",
                    max_timeout_ms=8000, max_memory_bytes=512 << 20)
    with Client(daemon.socket) as sb:
        r = sb.run(ticket, python("import time; time.sleep(30)", timeout_ms=300), timeout=WAIT)
        assert r.code == Code.TIMEOUT and r.timeout_ms == 300
        r = sb.run(denied, python("print(1)"), timeout=WAIT)
        assert r.code == Code.ACTION_DENIED and "code.execute" in r.message


def test_input_and_output_files_via_blobs(daemon, ticket):
    src = ("import os\n"
           "data = open(os.environ['SANDBOX_INPUT_DIR'] + '/in.txt').read()\n"
           "open(os.environ['SANDBOX_OUTPUT_DIR'] + '/out.txt', 'w').write(data.upper())\n")
    with Client(daemon.socket) as sb:
        blob = sb.put_blob("pyclient", b"hello blobs\n", timeout=WAIT)
        r = sb.run(ticket, python(src, files_in=[InputFile("in.txt", blob)]), timeout=WAIT)
        assert r.code == Code.OK, r.message
        assert [(f.name, f.bytes) for f in r.files_out] == [("out.txt", 12)]
        assert sb.get_blob("pyclient", r.files_out[0].blob, timeout=WAIT) == b"HELLO BLOBS\n"


def test_blob_round_trip_and_not_found(daemon):
    data = bytes(range(256)) * 100
    with Client(daemon.socket) as sb:
        blob = sb.put_blob("pyclient", data, timeout=WAIT)
        assert blob.startswith("sha256:") and len(blob) == 71
        assert sb.get_blob("pyclient", blob, timeout=WAIT) == data
        with pytest.raises(SandboxError) as e:
            sb.get_blob("pyclient", "sha256:" + "0" * 64, timeout=WAIT)
        assert e.value.code == "blob_not_found"
        with pytest.raises(SandboxError) as e:  # another tenant's blob is absent too
            sb.get_blob("other", blob, timeout=WAIT)
        assert e.value.code == "blob_not_found"


def test_record_and_replay_on_a_new_connection(daemon, ticket):
    src = "import secrets\nprint(secrets.token_hex(8))\n"
    with Client(daemon.socket) as sb:
        first, record = sb.run_with_record(ticket, python(src), timeout=WAIT)
    assert first.code == Code.OK and record["record_id"] == first.run_id
    with Client(daemon.socket) as sb:
        again = sb.replay(ticket, record, timeout=WAIT)
    assert again == first  # the random token was not produced a second time
    other = Ticket(id="t-o", tenant="someone-else", actions=[], isolation="process",
                   max_timeout_ms=1000, max_memory_bytes=1 << 28)
    with Client(daemon.socket) as sb:
        assert sb.replay(other, record, timeout=WAIT).code == Code.ACTION_DENIED


def test_session_with_cat(daemon, ticket):
    with Client(daemon.socket) as sb:
        with sb.open_session(ticket, SessionRequest(tool="cat"), timeout=WAIT) as s:
            assert s.write(b"one\ntw", timeout=WAIT) == 6
            assert s.write("o\n", timeout=WAIT) == 2
            assert s.readline(timeout=WAIT) == b"one\n"
            assert s.readline(timeout=WAIT) == b"two\n"
            with pytest.raises(TimeoutError):
                s.read(timeout=0.3)
            s.close_stdin(timeout=WAIT)
            assert s.read(timeout=WAIT) == b""  # cat saw EOF and exited
            with pytest.raises(SandboxError) as e:
                s.write(b"late", timeout=WAIT)
            assert e.value.code == "session_ended"
            result = s.close(timeout=WAIT)
        assert result.end in ("closed", "server_exited")
        assert result.bytes_to_server == 8 and result.bytes_from_server == 8
        assert result.result.stdout.total_bytes == 8
        with pytest.raises(SandboxError) as e:
            sb.open_session(ticket, SessionRequest(tool="no-such-tool"), timeout=WAIT)
        assert e.value.code == "invalid_request"
        assert sb.stats(timeout=WAIT).sessions == 0


def test_concurrent_runs_from_threads(daemon, ticket):
    with Client(daemon.socket) as sb:
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            results = list(pool.map(
                lambda i: sb.run(ticket, python(f"print({i} * {i})"), timeout=WAIT), range(8)))
        assert not sb._pending and not sb.unmatched
    assert [r.stdout.summary for r in results] == [f"{i * i}\n" for i in range(8)]


def test_a_line_over_the_cap_is_refused_before_sending(daemon, ticket):
    with Client(daemon.socket) as sb:
        with pytest.raises(LineTooLongError, match="accepts at most 1114112"):
            sb.submit(ticket, python("#" * 2_000_000))
        with pytest.raises(LineTooLongError):
            sb.put_blob("pyclient", b"\0" * (1 << 20), timeout=WAIT)
        with pytest.raises(ValueError):  # NaN is not JSON: never sent either
            sb.submit(ticket, {"runtime": "python3", "source": "", "timeout_ms": float("nan")})
        assert not sb._pending
        assert sb.run(ticket, python("print(1)"), timeout=WAIT).code == Code.OK


def test_daemon_going_away_fails_pending_calls(own_daemon, ticket):
    sb = Client(own_daemon.socket)
    try:
        session = sb.open_session(ticket, SessionRequest(tool="cat"), timeout=WAIT)
        future = sb.submit(ticket, python("import time; time.sleep(2)", timeout_ms=3000))
        time.sleep(0.3)  # the run is in flight
        own_daemon.stop(signal.SIGKILL)
        with pytest.raises(DaemonConnectionError):
            future.result(WAIT)
        assert session.read(timeout=WAIT) == b""  # the session's output ended with it
        with pytest.raises(DaemonConnectionError):
            sb.run(ticket, python("print(1)"), timeout=WAIT)
    finally:
        sb.close()
