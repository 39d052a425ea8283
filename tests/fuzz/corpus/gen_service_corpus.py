#!/usr/bin/python3
"""Writes the seed corpus of the daemon line-protocol fuzz target into
tests/fuzz/corpus/service/ (tests/fuzz/service_fuzz.cpp).

    /usr/bin/python3 tests/fuzz/corpus/gen_service_corpus.py

A seed is a mode byte (bit 7: a small line limit; bit 6: the stream arrives in chunks of
1 + bits 0-3 bytes) and then a client's byte stream: request lines of every operation, valid
and refused, lines cut mid-way, over-long lines with and without a leading id, blank lines,
half lines at the end of input.
"""
import base64
import json
import os

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "service")

TICKET = {"v": 1, "id": "t-1", "tenant": "acme", "actions": ["code.execute"],
          "isolation": "process", "max_timeout_ms": 8000, "max_memory_bytes": 536870912}
TOOL_TICKET = dict(TICKET, id="t-2", actions=["tool.run"], tools=["mcp-everything"])
REQUEST = {"v": 1, "runtime": "python3", "source": "print(1)"}
BLOB = "sha256:" + "a" * 64
RECORD = {"v": 1, "request": REQUEST, "ticket_id": "t-1"}


def line(obj):
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)


LINES = {
    "run": line({"id": "r1", "ticket": TICKET, "request": REQUEST}),
    "run_record": line({"id": "r2", "ticket": TICKET, "request": REQUEST, "record": True}),
    "run_bad_request": line({"id": "r3", "ticket": TICKET, "request": {"runtime": 7}}),
    "run_unsigned_ticket_fields": line({"id": "r4", "ticket": {"v": 1}, "request": REQUEST}),
    "blob_put": line({"id": "b1", "blob_put": {"tenant": "acme",
                                                "data_b64": base64.b64encode(b"hello").decode()}}),
    "blob_put_bad_b64": line({"id": "b2", "blob_put": {"tenant": "acme", "data_b64": "aGVsbG9="}}),
    "blob_put_bad_tenant": line({"id": "b3", "blob_put": {"tenant": "../x", "data_b64": ""}}),
    "blob_get": line({"id": "g1", "blob_get": {"tenant": "acme", "blob": BLOB}}),
    "blob_get_bad_id": line({"id": "g2", "blob_get": {"tenant": "acme", "blob": "sha256:ZZ"}}),
    "replay": line({"id": "p1", "replay": {"ticket": TICKET, "record": RECORD}}),
    "session_open": line({"id": "o1", "session_open": {"ticket": TOOL_TICKET,
                                                       "request": {"tool": "mcp-everything"}}}),
    "session_write_text": line({"id": "w1", "session_write": {"session": "s-1", "text": "hi\n"}}),
    "session_write_b64": line({"id": "w2", "session_write": {
        "session": "s-1", "data_b64": base64.b64encode(b"\x00\xff\n").decode()}}),
    "session_write_both": line({"id": "w3", "session_write": {"session": "s", "text": "a",
                                                              "data_b64": "YQ=="}}),
    "session_close_stdin": line({"id": "c1", "session_close_stdin": {"session": "s-1"}}),
    "session_close": line({"id": "c2", "session_close": {"session": "s-1"}}),
    "stats": line({"id": "s1", "service_stats": {}}),
    "stats_extra": line({"id": "s2", "service_stats": {"x": 1}}),
    "in_flight_id": line({"id": "busy", "service_stats": {}}),
    "two_ops": line({"id": "t", "blob_get": {}, "service_stats": {}}),
    "dup_key": '{"id":"a","id":"b","service_stats":{}}',
    "id_number": '{"id":7,"service_stats":{}}',
    "id_long": line({"id": "x" * 129, "service_stats": {}}),
    "id_escaped": '{"id":"\\u0041\\n","service_stats":{}}',
    "not_object": '["id","x"]',
    "truncated": '{"id":"tr","ticket":{"v":1,',
    "deep": '{"id":"d","request":' + "[" * 300 + "]" * 300 + "}",
    "invalid_utf8": b'{"id":"u\xff","service_stats":{}}',
    "nul": b'{"id":"n\x00","service_stats":{}}',
    "blank": "  \t\r",
    "crlf": line({"id": "cr", "service_stats": {}}) + "\r",
}


def encode(v):
    return v if isinstance(v, bytes) else v.encode()


def write(name, mode, stream):
    with open(os.path.join(OUT, name), "wb") as f:
        f.write(bytes([mode]) + stream)


def main():
    os.makedirs(OUT, exist_ok=True)
    for f in os.listdir(OUT):
        os.remove(os.path.join(OUT, f))
    for name, text in LINES.items():
        write(f"line_{name}", 0x00, encode(text) + b"\n")
    everything = b"\n".join(encode(t) for t in LINES.values()) + b"\n"
    write("stream_all_whole", 0x00, everything)
    write("stream_all_chunks_1", 0x40, everything)
    write("stream_all_chunks_7", 0x46, everything)
    # Over-long lines under a small limit (64 + low bits): with and without a leading id,
    # one whose id ends past the limit, and one that never ends.
    long_run = line({"id": "long", "ticket": TICKET, "request": REQUEST})
    write("small_limit_whole", 0x80, encode(long_run) + b"\n" + encode(LINES["stats"]) + b"\n")
    write("small_limit_chunks", 0xC3, encode(long_run) + b"\n" + encode(LINES["stats"]) + b"\n")
    write("small_limit_no_id", 0x85, b'{"ticket":' + b"1" * 200 + b"}\n" + encode(LINES["stats"]))
    write("small_limit_id_past_limit", 0xC0,
          encode(line({"id": "i" * 100, "service_stats": {}})) + b"\n")
    write("small_limit_unended", 0xC9, b'{"id":"open","x":"' + b"y" * 500)
    write("half_line_at_end", 0x42, encode(LINES["stats"]) + b"\n" + b'{"id":"half","serv')
    write("only_newlines", 0x00, b"\n\n\n")
    write("base64_forms", 0x00, b"YQ==\n")


if __name__ == "__main__":
    main()
