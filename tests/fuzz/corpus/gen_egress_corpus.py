#!/usr/bin/python3
"""Writes the seed corpus of the egress parser fuzz target into tests/fuzz/corpus/egress/.

    /usr/bin/python3 tests/fuzz/corpus/gen_egress_corpus.py

Seeds: TLS ClientHellos (with and without SNI, split across records, malformed) and HTTP request
heads (CONNECT, absolute-form, smuggling forms), the inputs the proxy's parsers must decide on.
"""
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "egress")


def ext(kind, data):
    return struct.pack(">HH", kind, len(data)) + data


def sni(name):
    entry = b"\x00" + struct.pack(">H", len(name)) + name
    return ext(0, struct.pack(">H", len(entry)) + entry)


def hello_message(extensions=None):
    body = b"\x03\x03" + b"\x11" * 32 + b"\x20" + b"\x22" * 32
    body += struct.pack(">H", 4) + b"\x13\x01\x13\x02" + b"\x01\x00"
    if extensions is not None:
        block = b"".join(extensions)
        body += struct.pack(">H", len(block)) + block
    return b"\x01" + struct.pack(">I", len(body))[1:] + body


def records(msg, cuts=()):
    out, start = b"", 0
    for end in list(cuts) + [len(msg)]:
        out += b"\x16\x03\x01" + struct.pack(">H", end - start) + msg[start:end]
        start = end
    return out


VERSIONS = ext(43, b"\x02\x03\x04")
SEEDS = {
    "tls_sni": records(hello_message([VERSIONS, sni(b"api.example.com")])),
    "tls_no_sni": records(hello_message([VERSIONS])),
    "tls_no_extensions": records(hello_message()),
    "tls_split_records": records(hello_message([sni(b"a.example.org"), VERSIONS]), cuts=(3, 50)),
    "tls_dup_extension": records(hello_message([VERSIONS, sni(b"a.example.com"), VERSIONS])),
    "tls_two_names": records(hello_message([ext(0, b"\x00\x0a\x00\x00\x03a.b\x00\x00\x01c")])),
    "tls_truncated": records(hello_message([VERSIONS, sni(b"api.example.com")]))[:60],
    "tls_then_data": records(hello_message([sni(b"x.example.com")])) + b"\x17\x03\x03\x00\x02hi",
    "http_connect": b"CONNECT api.example.com:443 HTTP/1.1\r\nHost: api.example.com:443\r\n\r\n",
    "http_get_absolute": b"GET http://api.example.com/a?b=1 HTTP/1.1\r\nHost: api.example.com\r\n"
                         b"Proxy-Authorization: Basic eA==\r\nConnection: keep-alive, X-Hop\r\n"
                         b"X-Hop: 1\r\nUser-Agent: t\r\n\r\n",
    "http_post_body": b"POST http://api.example.com/ HTTP/1.1\r\nHost: api.example.com\r\n"
                      b"Content-Length: 5\r\n\r\nhello",
    "http_dup_content_length": b"POST http://a.example/ HTTP/1.1\r\nHost: a.example\r\n"
                               b"Content-Length: 5\r\nContent-Length: 6\r\n\r\nhello",
    "http_te_and_cl": b"POST http://a.example/ HTTP/1.1\r\nHost: a.example\r\n"
                      b"Transfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n0\r\n\r\n",
    "http_bare_lf": b"GET http://a.example/ HTTP/1.1\nHost: a.example\n\n",
    "http_obs_fold": b"GET http://a.example/ HTTP/1.1\r\nHost: a.example\r\nX: a\r\n b\r\n\r\n",
    "http_huge_field": b"GET http://a.example/ HTTP/1.1\r\nX: " + b"a" * 17000 + b"\r\n\r\n",
    "empty": b"",
    # L7 rules: a ruled host's requests, inside a terminated tunnel and as plain HTTP, plain
    # and with the path forms that are refused.
    "rules_get": b"GET /v1/rates/eu?from=NLRTM HTTP/1.1\r\nHost: api.example.com\r\n\r\n",
    "rules_pipelined": b"GET /v1/rates/eu HTTP/1.1\r\nHost: api.example.com\r\n\r\n"
                       b"POST /v1/quote HTTP/1.1\r\nHost: api.example.com\r\n"
                       b"Content-Length: 2\r\n\r\n{}"
                       b"GET /v1/rates/%2e%2E/admin HTTP/1.1\r\nHost: api.example.com\r\n\r\n",
    "rules_dot_segments": b"GET /v1/rates/..;/admin HTTP/1.1\r\nHost: api.example.com\r\n\r\n",
    "rules_chunked": b"PUT /v1/rates/x HTTP/1.1\r\nHost: api.example.com\r\n"
                     b"Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
    "rules_absolute": b"GET http://api.example.com/v1/rates/%5c..%5cadmin HTTP/1.1\r\n"
                      b"Host: api.example.com\r\n\r\n",
}


def main():
    os.makedirs(OUT, exist_ok=True)
    for name, data in SEEDS.items():
        with open(os.path.join(OUT, name), "wb") as f:
            f.write(data)


if __name__ == "__main__":
    main()
