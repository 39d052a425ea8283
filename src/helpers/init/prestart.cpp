// Pre-started interpreters (warm_pool_class::prestart): the program's interpreter started in
// the fully prepared instance, waiting for its run. See init.hpp and docs/security.md.
//
// The interpreter is started exactly as a cold run's program (start_child: same rlimits,
// uid, capabilities, no_new_privs, seccomp filter, working directory) but with the loader
// below as its program and the environment the host knew ahead. It holds one end of a
// socket pair (its only descriptor besides 0-2): it writes "r" once the preload list is
// imported, reads the run's argv and environment until EOF, closes the socket and runs the
// source file as `__main__`.
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>

#include "helpers/init/init.hpp"
#include "sys/io.hpp"

namespace sandbox::init {
namespace {

namespace ip = detail::init_protocol;

// The loader, run with `python3 -I -c LOADER <fd> <module>...`. Everything it binds is local
// to its function, which it removes from `__main__` before the program runs: the program's
// `__main__` is a cold run's (`__loader__` a SourceFileLoader, `__file__`, `__cached__`
// None, `__spec__` None); `sys.argv` and `sys.orig_argv` are the run's; `os.environ` (and
// the C environment under it) is the run's, first of equal names winning as at exec. A
// traceback leaves out the loader's frame and is printed by `sys.excepthook` after
// `sys.last_*` are set, as the interpreter's own top level does; the exit status is 1.
constexpr const char* loader = R"PY(def _sandbox_prestart():
    import sys, os
    fd = int(sys.argv[1])
    for name in sys.argv[2:]:
        __import__(name)
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
  config c = cfg;
  c.argv = {cfg.prestart, "-I", "-c", loader, std::to_string(sv[1])};
  for (const auto& m : cfg.preload) c.argv.push_back(m);
  c.env = cfg.prestart_env;
  c.stdin_fd = -1;
  c.stdin_path.clear();
  const bool ok = start_child(c, pid, listener_fd, f);
  close(sv[1]);
  if (!ok) {
    close(sv[0]);
    return false;
  }
  // Ready once the preload list is imported: one byte, or EOF if the interpreter died.
  char r = 0;
  ssize_t n;
  do {
    n = read(sv[0], &r, 1);
  } while (n < 0 && errno == EINTR);
  if (n != 1 || r != 'r') {
    *f = {step::prestart, n == 0 ? ECHILD : (n < 0 ? errno : EPROTO)};
    close(sv[0]);
    if (*listener_fd >= 0) close(*listener_fd);
    *listener_fd = -1;
    return false;
  }
  *sock = sv[0];
  return true;
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

bool hand_over(int sock, const config& cfg) {
  ip::config_writer w;
  for (const auto& a : cfg.argv) w.add("argv", a);
  for (const auto& e : cfg.env) w.add("env", e);
  const bool ok = detail::write_all(sock, w.bytes().data(), w.bytes().size());
  close(sock);  // EOF: the loader runs the program
  return ok;
}

}  // namespace sandbox::init
