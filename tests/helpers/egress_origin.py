"""Loopback origin servers for the egress proxy tests: one plain HTTP and one HTTPS server.

Run on the host (never inside a sandbox) as `/usr/bin/python3 egress_origin.py CERT KEY`.
Prints one JSON line {"http": port, "https": port} once both listen on 127.0.0.1, then
serves until stdin closes. Paths:
  /rates            a small JSON document (the freight example's "live rates")
  /bytes/N          N bytes of 'x' (at most 64 MiB)
  /echo             JSON with the request's Host header, path and the server's TLS SNI
  /auth             JSON {"authorization": the request's Authorization header}, the header
                    echoed in X-Echo too; the server's log of them is in /stats ("auth")
  /v1/...           (any method) JSON with the method and path, the connection kept alive:
                    the paths the L7 rule cases send
  /stats            JSON: requests and TCP connections each server has seen so far, and
                    "log": "METHOD path" of every request but /stats, in order
Every connection is counted when accepted, before any TLS handshake, so a test can prove
that a refused tunnel never reached the origin.
"""
import http.server
import json
import socketserver
import ssl
import sys
import threading

stats = {"http": {"connections": 0, "requests": 0, "auth": [], "log": []},
         "https": {"connections": 0, "requests": 0, "auth": [], "log": []}}
lock = threading.Lock()


def make_handler(kind):
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def send_body(self, body, ctype="application/json"):
            self.send_response(200)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(body)

        def note(self):
            if self.path != "/stats":
                with lock:
                    stats[kind]["log"].append(self.command + " " + self.path)

        def api(self):
            # Kept alive (no Connection: close), so a client can send several requests on it.
            n = int(self.headers.get("Content-Length", "0"))
            if n:
                self.rfile.read(n)
            body = json.dumps({"kind": kind, "method": self.command, "path": self.path}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):
            with lock:
                stats[kind]["requests"] += 1
            self.note()
            if self.path.startswith("/v1/"):
                self.api()
            elif self.path == "/rates":
                self.send_body(json.dumps({"currency": "EUR", "per_kg": 1.75,
                                           "source": kind}).encode())
            elif self.path.startswith("/bytes/"):
                n = min(int(self.path[len("/bytes/"):] or 0), 64 << 20)
                self.send_response(200)
                self.send_header("Content-Type", "application/octet-stream")
                self.send_header("Content-Length", str(n))
                self.send_header("Connection", "close")
                self.end_headers()
                chunk = b"x" * 65536
                try:
                    while n > 0:
                        self.wfile.write(chunk[:min(n, len(chunk))])
                        n -= min(n, len(chunk))
                except OSError:
                    pass
            elif self.path == "/echo":
                sni = getattr(self.connection, "sni", None)
                self.send_body(json.dumps({"host": self.headers.get("Host"), "path": self.path,
                                           "sni": sni, "kind": kind}).encode())
            elif self.path == "/auth":
                auth = self.headers.get("Authorization", "")
                with lock:
                    stats[kind]["auth"].append(auth)
                body = json.dumps({"authorization": auth}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("X-Echo", auth)
                self.send_header("Content-Length", str(len(body)))
                self.send_header("Connection", "close")
                self.end_headers()
                self.wfile.write(body)
            elif self.path == "/stats":
                with lock:
                    self.send_body(json.dumps(stats).encode())
            else:
                self.send_error(404)

        def do_POST(self):
            self.note()
            if self.path.startswith("/v1/"):
                with lock:
                    stats[kind]["requests"] += 1
                return self.api()
            n = int(self.headers.get("Content-Length", "0"))
            data = self.rfile.read(n)
            with lock:
                stats[kind]["requests"] += 1
            self.send_body(json.dumps({"received": len(data)}).encode())

        do_PUT = do_DELETE = do_PATCH = do_POST

    return Handler


class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, kind, ctx=None):
        self.kind = kind
        self.ctx = ctx
        super().__init__(("127.0.0.1", 0), make_handler(kind))

    def get_request(self):
        sock, addr = self.socket.accept()
        with lock:
            stats[self.kind]["connections"] += 1
        if self.ctx is not None:
            box = {}
            self.ctx.sni_callback = lambda s, name, c: box.__setitem__("sni", name)
            sock.settimeout(10)
            sock = self.ctx.wrap_socket(sock, server_side=True)
            sock.sni = box.get("sni")
        return sock, addr

    def handle_error(self, request, client_address):
        pass


def main():
    cert, key = sys.argv[1], sys.argv[2]
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(cert, key)
    servers = [Server("http"), Server("https", ctx)]
    for s in servers:
        threading.Thread(target=s.serve_forever, daemon=True).start()
    print(json.dumps({"http": servers[0].server_address[1],
                      "https": servers[1].server_address[1]}), flush=True)
    sys.stdin.read()


if __name__ == "__main__":
    main()
