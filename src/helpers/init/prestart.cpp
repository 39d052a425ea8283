// Pre-started interpreters (warm_pool_class::prestart): the program's interpreter started in
// the fully prepared instance, waiting for its run. See init.hpp and docs/security.md.
// Python and Node each have a loader (below); the protocol on the socket is the same.
//
// The interpreter is started exactly as a cold run's program (start_child: same rlimits,
// uid, capabilities, no_new_privs, seccomp filter, working directory) but with the loader
// below as its program and the environment the host knew ahead. It holds one end of a
// socket pair (its only descriptor besides 0-2): it writes "r" once the preload list is
// imported, reads the run's argv and environment until EOF, closes the socket and runs the
// source file as `__main__`. A preload module whose import raises is reported instead:
// "e<module>\0<exception summary>", and the interpreter exits.
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <string>

#include "helpers/init/init.hpp"
#include "sys/io.hpp"

namespace sandbox::init {
namespace {

namespace ip = detail::init_protocol;

// The loader, run with `python3 -I -c LOADER <fd> <module>...`. An import that raises
// (anything, SystemExit included) is reported as the exception's last traceback line
// ("ModuleNotFoundError: No module named 'x'"), cut to 480 bytes, and the loader exits 1.
// Everything it binds is local to its function, which it removes from `__main__` before the program
// runs: the program's
// `__main__` is a cold run's (`__loader__` a SourceFileLoader, `__file__`, `__cached__`
// None, `__spec__` None); `sys.argv` and `sys.orig_argv` are the run's; `os.environ` (and
// the C environment under it) is the run's, first of equal names winning as at exec. A
// traceback leaves out the loader's frame and is printed by `sys.excepthook` after
// `sys.last_*` are set, as the interpreter's own top level does; the exit status is 1.
constexpr const char* loader = R"PY(def _sandbox_prestart():
    import sys, os
    fd = int(sys.argv[1])
    for name in sys.argv[2:]:
        try:
            __import__(name)
        except BaseException as e:
            t = type(e)
            what = t.__qualname__ if t.__module__ == "builtins" else t.__module__ + "." + t.__qualname__
            try:
                text = str(e)
            except BaseException:
                text = ""
            line = (what + ": " + text if text else what).splitlines() or [what]
            os.write(fd, b"e" + name.encode() + b"\0" + line[0].encode("utf-8", "replace")[:480])
            os._exit(1)
    os.write(fd, b"r")
    data = b""
    while True:
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        data += chunk
    os.close(fd)
    argv, seen = [], set()
    os.environ.clear()
    for item in data.split(b"\0"):
        key, _, value = item.partition(b"=")
        if key == b"argv":
            argv.append(os.fsdecode(value))
        elif key == b"env":
            name, _, val = value.partition(b"=")
            if name not in seen:
                seen.add(name)
                os.environ[os.fsdecode(name)] = os.fsdecode(val)
    del data, chunk, item, key, value, seen
    sys.orig_argv[:] = argv
    sys.argv[:] = argv[2:]
    path = argv[2]
    g = sys.modules["__main__"].__dict__
    del g["_sandbox_prestart"]
    g["__loader__"] = sys.modules["_frozen_importlib_external"].SourceFileLoader("__main__", path)
    g["__file__"] = path
    g["__cached__"] = None
    failed = None
    try:
        with open(path, "rb") as f:
            code = compile(f.read(), path, "exec", dont_inherit=True)
    except SyntaxError as e:
        failed, code = e, None
    del argv, fd
    if code is not None:
        try:
            exec(code, g)
        except SystemExit:
            raise
        except BaseException as e:
            failed = e
    if failed is not None:
        tb = failed.__traceback__.tb_next if failed.__traceback__ else None
        failed.__traceback__ = tb
        sys.last_type, sys.last_value, sys.last_traceback = type(failed), failed, tb
        sys.excepthook(type(failed), failed, tb)
        raise SystemExit(1)
_sandbox_prestart()
)PY";

// How the interpreter `pid` ended before it was ready (its socket reached EOF: it is
// exiting), for the host's log: "exit status N" or "killed by signal N"; a fixed text if it
// has not ended within about a second (it closed its end and lives on).
const char* died_before_ready(pid_t pid) {
  static char text[96];
  int status = 0;
  for (int i = 0; i < 100; ++i) {
    pid_t w = waitpid(pid, &status, WNOHANG);
    if (w < 0 && errno == EINTR) continue;
    if (w == pid) {
      if (WIFSIGNALED(status)) {
        snprintf(text, sizeof text, "the interpreter was killed by signal %d before it was ready",
                 WTERMSIG(status));
      } else {
        snprintf(text, sizeof text,
                 "the interpreter exited with status %d before it was ready (no report)",
                 WIFEXITED(status) ? WEXITSTATUS(status) : -1);
      }
      return text;
    }
    if (w < 0) break;
    usleep(10000);
  }
  return "the interpreter closed its socket before it was ready";
}

// The Node loader, a file sandbox-init writes (node_loader_path, removed once the interpreter
// is ready or gone), run as `node --require <it> <source path> <fd> <module>...`: Node starts
// as a cold run of `node <source path>` would and runs this before the main module. It
// imports the preload list as the main module's own `require` would (from the image: the
// workspace holds nothing of a run yet), writes "r" (or "e<module>\0<summary>" and exits 1),
// reads the run's argv and environment until EOF and returns: Node then runs the source as
// the main module, exactly as at a cold start (`require.main === module`, `__filename`, the
// same stack frames below it). It leaves no trace of its own: not in `require.cache`,
// `process.execArgv` is emptied, `process.argv` and `process.env` (and the C environment
// under it) are the run's.
constexpr const char* node_loader = R"JS('use strict';
(() => {
  const fs = require('fs');
  const path = require('path');
  const { createRequire } = require('module');
  delete require.cache[__filename];
  const fd = Number(process.argv[2]);
  const want = createRequire(path.resolve(process.argv[1]));
  for (const name of process.argv.slice(3)) {
    try {
      want(name);
    } catch (e) {
      let text = 'an exception';
      try {
        text = e instanceof Error ? `${e.name}: ${e.message}` : `a non-Error value: ${String(e)}`;
      } catch {}
      const line = Buffer.from(text.split('\n')[0]).subarray(0, 480);
      fs.writeSync(fd, Buffer.concat([Buffer.from('e' + name + '\0'), line]));
      process.exit(1);
    }
  }
  fs.writeSync(fd, 'r');
  const chunks = [];
  const buf = Buffer.alloc(65536);
  for (;;) {
    let n;
    try {
      n = fs.readSync(fd, buf, 0, buf.length, null);
    } catch (e) {
      if (e.code === 'EAGAIN' || e.code === 'EINTR') continue;
      throw e;
    }
    if (n === 0) break;
    chunks.push(Buffer.from(buf.subarray(0, n)));
  }
  fs.closeSync(fd);
  const argv = [];
  const env = new Map();
  for (const item of Buffer.concat(chunks).toString('utf8').split('\0')) {
    const eq = item.indexOf('=');
    if (eq < 0) continue;
    const key = item.slice(0, eq);
    const value = item.slice(eq + 1);
    if (key === 'argv') {
      argv.push(value);
    } else if (key === 'env') {
      const e2 = value.indexOf('=');
      const name = e2 < 0 ? value : value.slice(0, e2);
      if (!env.has(name)) env.set(name, e2 < 0 ? '' : value.slice(e2 + 1));
    }
  }
  for (const k of Object.keys(process.env)) delete process.env[k];
  for (const [k, v] of env) process.env[k] = v;
  process.argv.splice(0, process.argv.length, process.execPath, path.resolve(argv[1]),
                      ...argv.slice(2));
  process.execArgv.splice(0, process.execArgv.length);
})();
)JS";

// Where sandbox-init writes the Node loader: the run's own /tmp (a fresh tmpfs), removed
// before the instance is ready; /tmp's times are reset at hand-out as for every pooled run.
constexpr const char* node_loader_path = "/tmp/.sandbox-prestart.js";

// Writes the Node loader file (root's, read-only); false with errno set.
bool write_node_loader() {
  int fd = open(node_loader_path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0444);
  if (fd < 0) return false;
  const bool ok = detail::write_all(fd, node_loader, strlen(node_loader));
  const int e = errno;
  close(fd);
  errno = e;
  return ok;
}

}  // namespace

bool start_prestarted(const config& cfg, pid_t* pid, int* listener_fd, int* sock, failure* f) {
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0) {
    *f = {step::prestart, errno};
    return false;
  }
  // The child's end survives its exec (the table is shared until then: ours is closed after).
  if (fcntl(sv[1], F_SETFD, 0) < 0) {
    *f = {step::prestart, errno};
    close(sv[0]);
    close(sv[1]);
    return false;
  }
  const bool node = cfg.prestart_kind == "node";
  if (node && !write_node_loader()) {
    *f = {step::prestart, errno};
    close(sv[0]);
    close(sv[1]);
    return false;
  }
  config c = cfg;
  if (node) {
    c.argv = {cfg.prestart, "--require", node_loader_path, "/sandbox/" + cfg.source_name,
              std::to_string(sv[1])};
  } else {
    c.argv = {cfg.prestart, "-I", "-c", loader, std::to_string(sv[1])};
  }
  for (const auto& m : cfg.preload) c.argv.push_back(m);
  c.env = cfg.prestart_env;
  c.stdin_fd = -1;
  c.stdin_path.clear();
  const bool ok = start_child(c, pid, listener_fd, f);
  close(sv[1]);
  if (!ok) {
    if (node) unlink(node_loader_path);
    close(sv[0]);
    return false;
  }
  // Ready once the preload list is imported: one byte "r"; or "e" and the module and the
  // exception's summary (the loader exits); or EOF if the interpreter died.
  char r = 0;
  ssize_t n;
  do {
    n = read(sv[0], &r, 1);
  } while (n < 0 && errno == EINTR);
  const int read_errno = errno;
  // The Node loader was read when the interpreter started: nothing of it stays for the run.
  if (node) unlink(node_loader_path);
  if (n == 1 && r == 'r') {
    *sock = sv[0];
    return true;
  }
  if (n == 1 && r == 'e') {
    // The loader's report, up to EOF (it exits after writing it), bounded.
    static char report[600];
    std::size_t got = 0;
    while (got < sizeof report - 1) {
      ssize_t m = read(sv[0], report + got, sizeof report - 1 - got);
      if (m < 0 && errno == EINTR) continue;
      if (m <= 0) break;
      got += static_cast<std::size_t>(m);
    }
    report[got] = '\0';
    // "<module>\0<summary>": the NUL becomes the separator the host reads.
    for (std::size_t i = 0; i < got; ++i) {
      if (report[i] == '\0') report[i] = '\n';
    }
    *f = {step::prestart, 0, report};
  } else if (n == 0) {
    *f = {step::prestart, ECHILD, died_before_ready(*pid)};
  } else {
    *f = {step::prestart, n < 0 ? read_errno : EPROTO};
  }
  close(sv[0]);
  if (*listener_fd >= 0) close(*listener_fd);
  *listener_fd = -1;
  return false;
}

bool wait_go_or_death(int sock) {
  for (;;) {
    pollfd fds[2] = {{ip::control_fd, POLLIN, 0}, {sock, POLLIN, 0}};
    int n = poll(fds, 2, -1);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return false;
    // Anything from the interpreter before its run (it writes nothing more): it died.
    if (fds[1].revents != 0) return false;
    if (fds[0].revents != 0) return true;
  }
}

bool prestart_can_run(const config& cfg) {
  // Node already has its main module's path: the run's argv must be `<node> <that path>`
  // (the host pre-starts only runtimes whose argv is that: supports_prestart).
  if (cfg.prestart_kind == "node") {
    return cfg.argv.size() == 2 && cfg.argv[0] == cfg.prestart &&
           cfg.argv[1] == "/sandbox/" + cfg.source_name;
  }
  return cfg.argv.size() >= 3;  // <python> -I <source> [args]: the loader runs argv[2]
}

bool hand_over(int sock, const config& cfg) {
  ip::config_writer w;
  for (const auto& a : cfg.argv) w.add("argv", a);
  for (const auto& e : cfg.env) w.add("env", e);
  const bool ok = detail::write_all(sock, w.bytes().data(), w.bytes().size());
  close(sock);  // EOF: the loader runs the program
  return ok;
}

}  // namespace sandbox::init
