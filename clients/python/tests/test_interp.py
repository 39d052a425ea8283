"""Interpreter sessions (interp_open / interp_execute / interp_close) against a real daemon."""

import asyncio
import time

import pytest

from agent_sandbox import (AsyncClient, CellResult, Client, Code, InputFile, ProtocolError,
                           SandboxError)

WAIT = 60


def test_interpreter_keeps_state(daemon, ticket):
    with Client(daemon.socket) as sb:
        with sb.open_interpreter(ticket, runtime="python3", timeout=WAIT) as it:
            r1 = it.execute("x = 41\nprint('hi')", timeout=WAIT)
            assert isinstance(r1, CellResult)
            assert r1.code == Code.OK and r1.state == "kept" and r1.stdout.summary == "hi\n"
            r2 = it.execute("x + 1", timeout_ms=20000, timeout=WAIT)
            assert r2.ok and r2.value == "42" and not r2.session_ended
            r3 = it.execute("1/0", timeout=WAIT)
            assert r3.code == "error" and r3.state == "kept" and "ZeroDivisionError" in r3.error
            # Another connection cannot use it.
            with Client(daemon.socket) as other:
                with pytest.raises(SandboxError) as e:
                    other._send({"interp_execute": {"session": it.id, "code": "x"}}, None,
                                lambda a: a).result(WAIT)
                assert e.value.code == "session_not_found"
        with pytest.raises(SandboxError) as e:
            it.execute("x", timeout=WAIT)
        assert e.value.code == "session_not_found"


def test_async_interpreter(daemon, ticket):
    async def main():
        async with await AsyncClient.connect(daemon.socket) as sb:
            async with await sb.open_interpreter(ticket) as it:
                await it.execute("y = 'a' * 3")
                r = await asyncio.wait_for(it.execute("y"), WAIT)
                assert r.ok and r.value == "'aaa'"
    asyncio.run(main())


def test_cell_result_is_decoded_strictly():
    with pytest.raises(ProtocolError, match="cell_result.state: required field is missing"):
        CellResult.from_json({"code": "ok"}, "cell_result.")


def test_timed_out_open_interpreter_is_closed_when_its_answer_comes(daemon, ticket):
    with Client(daemon.socket) as sb:
        with pytest.raises(TimeoutError):
            sb.open_interpreter(ticket, timeout=0.001)
        # The daemon counts it while it opens; once its late answer came, this client
        # closes it: the count goes back to 0 while the connection stays open.
        seen, deadline = False, time.monotonic() + WAIT
        while time.monotonic() < deadline:
            n = sb.stats(timeout=WAIT).sessions
            seen = seen or n > 0
            if seen and n == 0:
                break
            time.sleep(0.05)
        assert seen and n == 0


def test_async_open_interpreter_cancelled_is_closed(daemon, ticket):
    async def main():
        async with await AsyncClient.connect(daemon.socket) as sb:
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(sb.open_interpreter(ticket), 0.001)
            seen, deadline = False, time.monotonic() + WAIT
            while time.monotonic() < deadline:
                n = (await sb.stats()).sessions
                seen = seen or n > 0
                if seen and n == 0:
                    break
                await asyncio.sleep(0.05)
            assert seen and n == 0
    asyncio.run(main())


def test_files_in_between_cells_and_usage(daemon, ticket):
    with Client(daemon.socket) as sb:
        data = sb.put_blob(ticket.tenant, b"a,b\n1,2\n", timeout=WAIT)
        with sb.open_interpreter(ticket, timeout=WAIT) as it:
            r = it.execute("import os\nopen(os.path.join(os.environ['SANDBOX_INPUT_DIR'],"
                           " 'data.csv')).read()",
                           files_in=[InputFile("data.csv", data)], timeout=WAIT)
            assert r.ok and r.value == "'a,b\\n1,2\\n'", r
            r = it.execute("import time\nt = time.process_time()\n"
                           "while time.process_time() - t < 0.2: pass", timeout=WAIT)
            assert r.ok and r.cpu_ms >= 200 and r.peak_memory_bytes > 0 and r.wall_ms > 0
            r = it.execute("1", files_in=[{"name": "x", "blob": "sha256:" + "0" * 64}],
                           timeout=WAIT)
            assert r.code == "blob_not_found" and r.state == "kept"
            assert r.message == "files_in[0].blob: blob not found"
            with pytest.raises(SandboxError) as e:
                it.execute("1", files_in=[{"name": "x"}], timeout=WAIT)
            assert e.value.code == "invalid_request"
            assert "interp_execute.files_in[0].blob: required field is missing" in str(e.value)
