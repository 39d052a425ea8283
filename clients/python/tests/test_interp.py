"""Interpreter sessions (interp_open / interp_execute / interp_close) against a real daemon."""

import asyncio

import pytest

from agent_sandbox import AsyncClient, CellResult, Client, Code, ProtocolError, SandboxError

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
