#!/usr/bin/python3
"""Writes the seed corpus of the protocol fuzz target into tests/fuzz/corpus/protocol/.

    /usr/bin/python3 tests/fuzz/corpus/gen_protocol_corpus.py

Each seed is one document: valid requests, results and tickets, and the malformed and hostile
inputs the decoders and admission must refuse cleanly. Kept small (well under 1 MB in all).
"""
import json
import os

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "protocol")
BLOB = "sha256:" + "a" * 64
DIGEST = "sha256:" + "a" * 64  # the fuzz catalog's python3 digest


def req(**extra):
    r = {"runtime": "python3", "source": "print(1)"}
    r.update(extra)
    return json.dumps(r, ensure_ascii=False).encode()


def files(*names, blob=BLOB):
    return [{"name": n, "blob": blob} for n in names]


APPROVAL = {
    "ticket_id": "t-1", "tenant": "acme", "domains": ["api.example.com"], "timeout_ms": 2000,
    "memory_limit_bytes": 268435456,
    "files_in": [{"name": "data.csv", "sha256": "c" * 64, "bytes": 12}],
    "source_sha256": "e" * 64, "source_bytes": 9, "isolation": "container",
    "runtime": {"name": "python3", "digest": DIGEST}}


SEEDS = {
    # --- valid documents
    "request_minimal": req(),
    "request_full": json.dumps({
        "v": 1, "runtime": "python3", "source": "import os\nprint(os.listdir('.'))\n",
        "timeout_ms": 8001, "network": True, "files_in": files("data.csv", "h\u00e9.txt"),
        "files_out": {"max_files": 300, "max_bytes": 1 << 40},
        "memory_limit_bytes": 1 << 31, "env": {"MY_VAR": "1", "A": "x"},
        "runtime_digest": DIGEST}, ensure_ascii=False).encode(),
    "request_node_no_image": req(runtime="node"),
    "request_digest_mismatch": req(runtime_digest="sha256:" + "b" * 64),
    "result_ok": json.dumps({
        "v": 1, "code": "ok", "message": "", "exit_code": 0, "signal": None,
        "stdout": {"summary": "1\n", "blob": BLOB, "bytes": 2, "total_bytes": 2,
                   "truncated": False},
        "stderr": {"summary": "", "blob": BLOB, "bytes": 0, "total_bytes": 0,
                   "truncated": False},
        "files_out": [{"name": "out.txt", "blob": BLOB, "bytes": 3}],
        "files_dropped": [{"name_display": "a\\x0a", "reason": "bad_name"}],
        "usage": {"setup_ms": 5, "wall_ms": 20, "cpu_ms": 10, "peak_memory_bytes": 1 << 20},
        "oom_kills": 0, "timeout_clamped": False, "memory_clamped": False, "timeout_ms": 2000,
        "memory_limit_bytes": 1 << 28, "isolation": "process",
        "runtime": {"name": "python3", "digest": DIGEST},
        "egress_attempts": [{"protocol": "dns", "host": "example.com", "address": "",
                             "port": 53, "allowed": False, "reason": "network disabled"}],
        "egress_attempts_dropped": 0, "violation": None, "run_id": "r1"}).encode(),
    "result_minimal": b'{"code":"timeout"}',
    "ticket_valid": b'{"v":1,"id":"t-1","tenant":"acme","actions":["code.execute","code.network"],'
                    b'"isolation":"container","max_timeout_ms":8000,"max_memory_bytes":536870912,'
                    b'"egress":["api.example.com","*.cdn.example"],"expires_at":"2026-11-30T12:00:00Z"}',
    "ticket_derived": json.dumps({
        "v": 1, "id": "d-1", "tenant": "acme", "actions": ["code.execute", "code.network"],
        "isolation": "container", "max_timeout_ms": 2000, "max_memory_bytes": 268435456,
        "runtime_digest": DIGEST, "egress": ["api.example.com"],
        "expires_at": "2026-11-30T12:10:00Z", "derived_from": ["t-1"],
        "approval": APPROVAL}).encode(),
    "ticket_network_no_egress": b'{"id":"t","tenant":"a","actions":["code.network"],'
                                b'"isolation":"process","max_timeout_ms":1,"max_memory_bytes":1}',
    "ticket_bad_expiry": b'{"id":"t","tenant":"a","actions":[],"isolation":"process",'
                         b'"max_timeout_ms":1,"max_memory_bytes":1,"expires_at":"2026-02-30T00:00:00Z"}',
    "approval_valid": json.dumps(dict(APPROVAL, v=1)).encode(),
    "approval_process": json.dumps(dict(APPROVAL, isolation="process")).encode(),
    "signed_ticket": json.dumps({
        "v": 1, "ticket": {"v": 1, "id": "t-1", "tenant": "acme", "actions": ["code.execute"],
                           "isolation": "process", "max_timeout_ms": 8000,
                           "max_memory_bytes": 536870912},
        "kid": "k1", "sig": "A" * 86}).encode(),
    "signed_ticket_chain": json.dumps({
        "v": 1, "ticket": {"v": 1, "id": "d-1", "tenant": "acme",
                           "actions": ["code.execute", "code.network"], "isolation": "container",
                           "max_timeout_ms": 2000, "max_memory_bytes": 268435456,
                           "runtime_digest": DIGEST, "egress": ["api.example.com"],
                           "expires_at": "2026-11-30T12:10:00Z", "derived_from": ["t-1"],
                           "approval": APPROVAL},
        "parent": {"v": 1, "ticket": {"id": "t-1", "tenant": "acme", "actions": ["code.execute"],
                                      "isolation": "process", "max_timeout_ms": 8000,
                                      "max_memory_bytes": 536870912},
                   "kid": "k1", "sig": "B" * 86},
        "kid": "k2", "sig": "C" * 86}).encode(),
    "request_network": req(network=True, egress=["API.example.com.", "*.cdn.example", "x.example.org"]),
    "request_network_bad_egress": req(network=True, egress=["10.0.0.1", "a b"]),
    "request_egress_without_network": req(egress=["api.example.com"]),
    "request_secrets": req(network=True, egress=["api.example.org"], secrets=["rates-api"]),
    "request_secrets_hostile": req(network=True, egress=["api.example.org"],
                                   secrets=["rates-api", "rates-api", "undefined-here", "Bad_Name",
                                            "", "x" * 65]),
    "request_secrets_no_network": req(secrets=["rates-api"]),
    "ticket_secrets": b'{"v":1,"id":"t-1","tenant":"acme","actions":["code.execute"],'
                      b'"isolation":"process","max_timeout_ms":8000,"max_memory_bytes":536870912,'
                      b'"secrets":["rates-api","mail"]}',
    "ticket_egress_rules": b'{"v":1,"id":"t-1","tenant":"acme",'
                           b'"actions":["code.execute","code.network"],"isolation":"container",'
                           b'"max_timeout_ms":8000,"max_memory_bytes":536870912,'
                           b'"egress":["api.example.com","*.cdn.example"],"egress_rules":['
                           b'{"name":"rates-read","host":"api.example.com","methods":["GET","HEAD"],'
                           b'"paths":["/v1/rates/","/v1/lanes"],"max_requests":10,"max_bytes":1048576},'
                           b'{"name":"cdn","host":"*.cdn.example","methods":["GET"],"paths":["/"]}]}',
    "ticket_egress_rules_hostile": b'{"v":1,"id":"t-1","tenant":"acme",'
                                   b'"actions":["code.execute","code.network"],"isolation":"container",'
                                   b'"max_timeout_ms":8000,"max_memory_bytes":536870912,'
                                   b'"egress":["api.example.com"],"egress_rules":['
                                   b'{"name":"Rates","host":"api.example.com:443","methods":["get","GET"],'
                                   b'"paths":["/v1/%2e%2e/","v1","/a/../b"],"max_requests":0,"x":1}]}',
    "approval_secrets": json.dumps(dict(APPROVAL, v=1, secrets=[
        {"name": "rates-api", "domains": ["api.example.com"], "header": "Authorization"}])).encode(),
    "approval_secrets_hostile": json.dumps(dict(APPROVAL, v=1, secrets=[
        {"name": "rates-api", "domains": ["API.example.com"], "header": "X: y", "value": "v"}])).encode(),
    "ticket_runtime_digest": b'{"v":1,"id":"t-1","tenant":"acme","actions":["code.execute"],'
                             b'"isolation":"process","max_timeout_ms":8000,'
                             b'"max_memory_bytes":536870912,"runtime_digest":"'
                             + DIGEST.encode() + b'"}',
    # --- syntax
    "empty": b"",
    "nul_only": b"\0",
    "nul_trailing": req() + b"\0" + b'{"evil":1}',
    "bom": b"\xef\xbb\xbf" + req(),
    "trailing_garbage": req() + b"x",
    "two_documents": req() + req(),
    "comment": b"/*c*/" + req(),
    "single_quotes": b"{'runtime':'python3','source':'x'}",
    "truncated": req()[:-1],
    "nan": b'{"runtime":"python3","source":"x","timeout_ms":NaN}',
    "number_overflow": b'{"runtime":"python3","source":"x","timeout_ms":1e400}',
    "uint64_overflow": b'{"runtime":"python3","source":"x","memory_limit_bytes":18446744073709551616}',
    "negative_zero": b'{"runtime":"python3","source":"x","memory_limit_bytes":-0}',
    "deep_arrays": b"[" * 200 + b"]" * 200,
    "deep_objects": b'{"a":' * 200 + b"1" + b"}" * 200,
    "deep_in_field": b'{"runtime":"python3","source":"x","env":' + b"[" * 40 + b"]" * 40 + b"}",
    # --- encoding
    "utf8_invalid_byte": b'{"runtime":"python3","source":"\xff"}',
    "utf8_overlong_slash": b'{"runtime":"python3","source":"x","files_in":[{"name":"..\xc0\xafetc","blob":"' + BLOB.encode() + b'"}]}',
    "utf8_surrogate_raw": b'{"runtime":"python3","source":"\xed\xa0\x80"}',
    "utf8_surrogate_escape": b'{"runtime":"python3","source":"\\ud800"}',
    "utf8_truncated": b'{"runtime":"python3","source":"\xe2\x82"}',
    "utf8_above_max": b'{"runtime":"python3","source":"\xf4\x90\x80\x80"}',
    # --- duplicates
    "dup_runtime": b'{"runtime":"python3","runtime":"node","source":"x"}',
    "dup_escaped": b'{"runtime":"python3","\\u0072untime":"node","source":"x"}',
    "dup_nested": b'{"runtime":"python3","source":"x","files_out":{"max_files":1,"max_files":9}}',
    "dup_ticket_actions": b'{"id":"t","tenant":"a","actions":["code.execute"],"actions":["code.network"],'
                          b'"isolation":"process","max_timeout_ms":1,"max_memory_bytes":1}',
    "ticket_dup_action": b'{"id":"t","tenant":"a","actions":["code.execute","code.execute"],'
                         b'"isolation":"process","max_timeout_ms":1,"max_memory_bytes":1}',
    "ticket_unknown_action": b'{"id":"t","tenant":"a","actions":["code.root"],'
                             b'"isolation":"process","max_timeout_ms":1,"max_memory_bytes":1}',
    "ticket_bad_tenant": b'{"id":"t","tenant":"../x","actions":[],'
                         b'"isolation":"process","max_timeout_ms":1,"max_memory_bytes":1}',
    "ticket_runtime_digest_upper": b'{"id":"t","tenant":"a","actions":["code.execute"],'
                                   b'"isolation":"process","max_timeout_ms":1,"max_memory_bytes":1,'
                                   b'"runtime_digest":"sha256:' + b"A" * 64 + b'"}',
    # --- fields
    "unknown_field": req(foo=1),
    "version_2": req(v=2),
    "version_string": req(v="1"),
    "timeout_zero": req(timeout_ms=0),
    "timeout_negative": req(timeout_ms=-1),
    "timeout_float": req(timeout_ms=1.5),
    "timeout_string": req(timeout_ms="100"),
    "memory_below_min": req(memory_limit_bytes=1),
    "files_out_negative": req(files_out={"max_files": -1}),
    "network_string": req(network="true"),
    "env_reserved": req(env={"PATH": "/", "LD_PRELOAD": "/x.so"}),
    "env_nul_value": req(env={"MY_VAR": "a\u0000b"}),
    "env_bad_name": req(env={"1A": "x"}),
    "source_32768": req(source="s" * 32768),
    "source_32769": req(source="s" * 32769),
    # --- files_in
    "name_traversal": req(files_in=files("../../etc/passwd")),
    "name_dot": req(files_in=files(".")),
    "name_dotdot": req(files_in=files("..")),
    "name_nul": req(files_in=files("a\u0000b")),
    "name_newline": req(files_in=files("a\nb")),
    "name_c1": req(files_in=files("a\u0085b")),
    "name_rlo": req(files_in=files("\u202efdp.exe")),
    "name_255": req(files_in=files("n" * 255)),
    "name_256": req(files_in=files("n" * 256)),
    "name_4k": req(files_in=files("n" * 4096)),
    "name_nfd_duplicate": req(files_in=files("caf\u00e9", "cafe\u0301")),
    "name_angstrom": req(files_in=files("\u00c5", "\u212b")),
    "name_duplicate": req(files_in=files("a", "a")),
    "name_unassigned": req(files_in=files("\u0378")),
    "files_16": req(files_in=files(*["f%d" % i for i in range(16)])),
    "files_17": req(files_in=files(*["f%d" % i for i in range(17)])),
    "files_1000": req(files_in=files(*["f%d" % i for i in range(1000)])),
    "blob_uppercase": req(files_in=files("a", blob="sha256:" + "A" * 64)),
    "blob_short": req(files_in=files("a", blob="sha256:" + "a" * 63)),
    "blob_long": req(files_in=files("a", blob="sha256:" + "a" * 65)),
    "blob_percent": req(files_in=files("a", blob="sha256%3a" + "a" * 64)),
    "blob_percent_digit": req(files_in=files("a", blob="sha256:" + "a" * 62 + "%61")),
    "blob_relative": req(files_in=files("a", blob="../blobs/" + BLOB)),
    "blob_not_string": b'{"runtime":"python3","source":"x","files_in":[{"name":"a","blob":1}]}',
    # --- request-level attacks (conformance kind 13, tests/conformance/cases/requests_test.cpp)
    "name_escaped_traversal": b'{"runtime":"python3","source":"x","files_in":[{"name":'
                              b'"\\u002e\\u002e\\u002fetc\\u002fpasswd","blob":"' + BLOB.encode() + b'"}]}',
    "name_escaped_nul": b'{"runtime":"python3","source":"x","files_in":[{"name":"a\\u0000b","blob":"'
                        + BLOB.encode() + b'"}]}',
    "name_raw_invalid_byte": b'{"runtime":"python3","source":"x","files_in":[{"name":"ok","blob":"'
                             + BLOB.encode() + b'"},{"name":"a\xff","blob":"' + BLOB.encode() + b'"}]}',
    "name_raw_nul": b'{"runtime":"python3","source":"x","files_in":[{"name":"a\0b","blob":"'
                    + BLOB.encode() + b'"}]}',
    "name_raw_newline": b'{"runtime":"python3","source":"x","files_in":[{"name":"a\nb","blob":"'
                        + BLOB.encode() + b'"}]}',
    "name_lone_surrogate": b'{"runtime":"python3","source":"x","files_in":[{"name":"\\ud800","blob":"'
                           + BLOB.encode() + b'"}]}',
    "name_bad_escape": b'{"runtime":"python3","source":"x","files_in":[{"name":"\\x2e","blob":"'
                       + BLOB.encode() + b'"}]}',
    "name_raw_key_invalid": b'{"runtime":"python3","source":"x","files_in":[{"na\xffme":"x","blob":"'
                            + BLOB.encode() + b'"}]}',
    "name_escape_terminal": req(files_in=files("\u001b[2J", "\u007f")),
    "name_absolute": req(files_in=files("/etc/passwd")),
    "name_backslashes": req(files_in=files("..\\..\\evil")),
    "name_percent_traversal": req(files_in=files("%2e%2e%2fetc%2fpasswd")),
    "name_dash_tilde": req(files_in=files("-rf", "~", "...")),
    "name_case_pair": req(files_in=files("A", "a")),
    "name_nfkc_pair": req(files_in=files("\ufb01le", "file")),
    "name_hangul_jamo": req(files_in=files("\uac00", "\u1100\u1161")),
    "name_ohm_sign": req(files_in=files("\u2126")),
    "name_marks_reordered": req(files_in=files("x\u0316\u0483", "x\u0483\u0316")),
    "name_not_string": b'{"runtime":"python3","source":"x","files_in":[{"name":["..","etc"],"blob":"'
                       + BLOB.encode() + b'"}]}',
    "entry_extra_path": req(files_in=[{"name": "x", "blob": BLOB, "path": "/etc/passwd"}]),
    "entry_dup_name": b'{"runtime":"python3","source":"x","files_in":[{"name":"x","name":"../x","blob":"'
                      + BLOB.encode() + b'"}]}',
    "files_in_string": req(files_in="/etc/passwd"),
    "files_in_object": req(files_in={"name": "x", "blob": BLOB}),
    "blob_sha256_upper_prefix": req(files_in=files("a", blob="SHA256:" + "a" * 64)),
    "blob_absolute_path": req(files_in=files("a", blob="/var/lib/agent-sandbox/blobs/" + "a" * 64)),
    "blob_file_url": req(files_in=files("a", blob="file:///etc/passwd")),
    "blob_trailing_newline": req(files_in=files("a", blob=BLOB + "\n")),
    "blob_escaped_nul": req(files_in=files("a", blob=BLOB + "\u0000")),
    "blob_fullwidth_digit": req(files_in=files("a", blob="sha256:\uff11" + "a" * 63)),
    "blob_escaped_slashes": b'{"runtime":"python3","source":"x","files_in":[{"name":"a","blob":'
                            b'"..\\/blobs\\/' + BLOB.encode() + b'"}]}',
    # 100,000 entries: the shortest well-formed ones (~2.2 MB would be too big a seed) are
    # bare objects, which still make the decoder hold a 100,000-element array.
    "files_100000_empty": b'{"runtime":"python3","source":"x","files_in":['
                          + b",".join([b"{}"] * 100000) + b']}',
    # --- results
    "result_unknown_code": b'{"code":"boom"}',
    "result_bad_reason": b'{"code":"ok","files_dropped":[{"name_display":"a","reason":"x"}]}',
    "result_port_overflow": b'{"code":"ok","egress_attempts":[{"port":65536}]}',
    "result_exit_overflow": b'{"code":"ok","exit_code":2147483648}',
    "result_negative_usage": b'{"code":"ok","usage":{"wall_ms":-1}}',
}


def main():
    os.makedirs(OUT, exist_ok=True)
    for name in os.listdir(OUT):
        os.remove(os.path.join(OUT, name))
    total = 0
    for name, data in sorted(SEEDS.items()):
        with open(os.path.join(OUT, name + ".json"), "wb") as f:
            f.write(data)
        total += len(data)
    print("%d seeds, %d bytes" % (len(SEEDS), total))


if __name__ == "__main__":
    main()
