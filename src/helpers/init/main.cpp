// sandbox-init: PID 1 of every process-level run. See init.hpp and docs/architecture.md.
//
// Order of events (each step's reason beside it):
//  1. Reset signal state: nothing inherited from the host's thread survives.
//  2. Wait for the configuration. The host sends it only after moving us into the run's
//     cgroup (and writing uid/gid maps), so nothing below runs outside the limits. Then
//     become non-dumpable: the sandboxed user cannot open /proc/1/{mem,fd,exe}.
//  3. New cgroup namespace, rooted at the run's cgroup.
//  4. Build the filesystem and network (mounts.cpp), pivot into it, report `ready`.
//  5. Start the user program (child.cpp), report `started` with the seccomp listener.
//  6. Drop our own capabilities, then reap every process until the host ends the run. If the
//     control channel closes (the host died), exit at once: as PID 1, our exit kills every
//     process in the namespace.
#include <errno.h>
#include <fcntl.h>
#include <linux/capability.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <charconv>
#include <span>

#include "helpers/init/init.hpp"
#include "sys/io.hpp"
#include "wire/dns_sink.hpp"

namespace sandbox::init {
namespace {

namespace ip = detail::init_protocol;
using detail::write_all;

// Stream mode (see init_protocol.hpp): set from argv before anything is read or sent.
bool g_stream = false;
// Stream mode, a session: the write end of the program's stdin pipe (non-blocking), fed from
// the control stream's `stdin_data`; -1 when there is none or it was closed.
int g_stdin_w = -1;

bool read_all(int fd, void* p, std::size_t n) {
  char* c = static_cast<char*>(p);
  while (n > 0) {
    ssize_t r = recv(fd, c, n, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    c += r;
    n -= static_cast<std::size_t>(r);
  }
  return true;
}

bool send_msg(ip::msg type, std::uint32_t a, std::int64_t b, std::string_view payload,
              const int* fds, int nfds) {
  ip::init_header h{type, a, b};
  if (g_stream) {  // length-prefixed, no descriptors (the caller keeps them)
    std::uint32_t len = static_cast<std::uint32_t>(sizeof h + payload.size());
    return write_all(ip::control_fd, &len, sizeof len) && write_all(ip::control_fd, &h, sizeof h) &&
           write_all(ip::control_fd, payload.data(), payload.size());
  }
  iovec iov[2] = {{&h, sizeof h}, {const_cast<char*>(payload.data()), payload.size()}};
  msghdr m{};
  m.msg_iov = iov;
  m.msg_iovlen = payload.empty() ? 1 : 2;
  alignas(cmsghdr) char cbuf[CMSG_SPACE(sizeof(int) * 4)];
  if (nfds > 0) {
    m.msg_control = cbuf;
    m.msg_controllen = CMSG_SPACE(sizeof(int) * nfds);
    cmsghdr* c = CMSG_FIRSTHDR(&m);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * nfds);
    memcpy(CMSG_DATA(c), fds, sizeof(int) * nfds);
  }
  for (;;) {
    ssize_t n = sendmsg(ip::control_fd, &m, MSG_NOSIGNAL);
    if (n >= 0) return true;
    if (errno != EINTR) return false;
  }
}

// A TCP socket listening on 127.0.0.1:`port`; -errno on failure.
int open_listener(std::uint16_t port) {
  int s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (s < 0) return -errno;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a) < 0 || listen(s, 64) < 0) {
    int e = errno;
    close(s);
    return -e;
  }
  return s;
}

[[noreturn]] void fail(const failure& f) {
  static const char* names[] = {"",
                                "config",
                                "cgroup_namespace",
                                "mount_private",
                                "root_tmpfs",
                                "rootfs_bind",
                                "proc",
                                "dev",
                                "tmpfs",
                                "inputs",
                                "outputs",
                                "source",
                                "etc_files",
                                "hostname",
                                "loopback",
                                "dns_socket",
                                "pivot_root",
                                "remount_readonly",
                                "fork",
                                "rlimits",
                                "drop_privileges",
                                "no_new_privs",
                                "seccomp",
                                "exec",
                                "drop_init_privileges",
                                "egress_proxy",
                                "run_ca",
                                "prestart"};
  auto idx = static_cast<std::uint32_t>(f.where);
  const char* name = idx < sizeof names / sizeof names[0] ? names[idx] : "?";
  // The step's name, then (if any) a NUL and the detail (init_protocol.hpp, `failed`).
  std::string payload = name;
  if (f.detail != nullptr) {
    payload.push_back('\0');
    payload.append(f.detail);
  }
  send_msg(ip::msg::failed, idx, f.err, payload, nullptr, 0);
  _exit(1);
}

// Monotonic time in µs (the host's clock too: no time namespace), for the setup breakdown
// the host logs at debug level.
std::uint64_t now_us() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::uint64_t>(ts.tv_sec) * 1000000 +
         static_cast<std::uint64_t>(ts.tv_nsec) / 1000;
}

std::uint64_t to_u64(std::string_view v) {
  std::uint64_t out = 0;
  std::from_chars(v.data(), v.data() + v.size(), out);
  return out;
}

// Receives one message of type `want` (blocking); false on EOF, error or another type.
// Descriptors that came with it (at most 2) land in `fds` (-1 where none).
bool read_message(ip::msg want, std::string* buf, std::string_view* payload, int fds[2] = nullptr,
                  std::uint32_t* a = nullptr) {
  if (g_stream) {
    std::uint32_t len = 0;
    if (fds != nullptr) fds[0] = fds[1] = -1;
    if (!read_all(ip::control_fd, &len, sizeof len)) return false;
    if (len < sizeof(ip::init_header) || len > ip::max_packet) return false;
    buf->assign(len, '\0');
    if (!read_all(ip::control_fd, buf->data(), len)) return false;
    ip::init_header h;
    memcpy(&h, buf->data(), sizeof h);
    if (h.type != want) return false;
    if (a != nullptr) *a = h.a;
    *payload = std::string_view(buf->data() + sizeof h, len - sizeof h);
    return true;
  }
  buf->assign(ip::max_packet, '\0');
  iovec iov{buf->data(), buf->size()};
  alignas(cmsghdr) char cbuf[CMSG_SPACE(sizeof(int) * 2)];
  msghdr m{};
  m.msg_iov = &iov;
  m.msg_iovlen = 1;
  m.msg_control = cbuf;
  m.msg_controllen = sizeof cbuf;
  ssize_t n;
  do {
    n = recvmsg(ip::control_fd, &m, MSG_CMSG_CLOEXEC);
  } while (n < 0 && errno == EINTR);
  int got[2] = {-1, -1};
  int count = 0;
  for (cmsghdr* c = n >= 0 ? CMSG_FIRSTHDR(&m) : nullptr; c != nullptr; c = CMSG_NXTHDR(&m, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    std::size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (std::size_t i = 0; i < k; ++i) {
      int fd;
      memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
      if (count < 2 && fds != nullptr)
        got[count++] = fd;
      else
        close(fd);
    }
  }
  if (fds != nullptr) {
    fds[0] = got[0];
    fds[1] = got[1];
  }
  if (n < static_cast<ssize_t>(sizeof(ip::init_header))) return false;
  ip::init_header h;
  memcpy(&h, buf->data(), sizeof h);
  if (h.type != want) return false;
  if (a != nullptr) *a = h.a;
  *payload = std::string_view(buf->data() + sizeof h, static_cast<std::size_t>(n) - sizeof h);
  return true;
}

// The program's argv and env (the "go" message).
bool read_go(config* cfg) {
  std::string buf;
  std::string_view payload;
  int fds[2] = {-1, -1};
  std::uint32_t a = 0;
  if (!read_message(ip::msg::go, &buf, &payload, fds, &a)) return false;
  // a = 1: a session's live stdin (the read end of the host's pipe) came with the program;
  // the program gets it as fd 0 (start_child). Anything else that came along is closed.
  if (fds[1] >= 0) close(fds[1]);
  if (a == 1 && g_stream) {
    // Stream mode: no descriptor can come, so the pipe is made here; its bytes arrive as
    // `stdin_data` (supervise). Both ends close-on-exec: the read end becomes the program's
    // fd 0 (dup2 clears the flag), the write end stays ours alone.
    int p[2];
    if (pipe2(p, O_CLOEXEC) < 0) return false;
    fcntl(p[1], F_SETFL, O_NONBLOCK);
    cfg->stdin_fd = p[0];
    g_stdin_w = p[1];
  } else if (a == 1) {
    if (fds[0] < 0) return false;
    cfg->stdin_fd = fds[0];
  } else if (fds[0] >= 0) {
    close(fds[0]);
  }
  for (auto [k, v] : ip::parse_config(payload)) {
    if (k == "argv")
      cfg->argv.emplace_back(v);
    else if (k == "env")
      cfg->env.emplace_back(v);
    else if (k == "egress_proxy")
      cfg->egress_proxy_port = static_cast<std::uint16_t>(to_u64(v));
    else if (k == "stdin")
      cfg->stdin_path = std::string(v);
    else if (k == "run_ca_pem")
      cfg->run_ca_pem = std::string(v);
    else if (k == "node_proxy_preload")
      cfg->node_proxy_preload = std::string(v);
  }
  return !cfg->argv.empty();
}

// Writes `content` to a new file `path` (root's, mode 0444; never through a link, never over
// an existing file) before the program starts. 0 or the errno.
int write_root_file(const char* path, std::string_view content) {
  int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0444);
  if (fd < 0) return errno;
  const char* p = content.data();
  std::size_t left = content.size();
  while (left > 0) {
    ssize_t n = write(fd, p, left);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int e = n < 0 ? errno : EIO;
      close(fd);
      return e;
    }
    p += n;
    left -= static_cast<std::size_t>(n);
  }
  const int e = fchmod(fd, 0444) < 0 ? errno : 0;
  close(fd);
  return e;
}

bool read_config(config* cfg) {
  std::string buf;
  std::string_view payload;
  int fds[2] = {-1, -1};
  std::uint32_t a = 0;
  if (!read_message(ip::msg::config, &buf, &payload, fds, &a)) return false;
  // a = 1: the program's stdout and stderr came with the configuration (an OCI runtime holds
  // our own 1 and 2 until it exits); they replace ours, so only the program holds them.
  if (a == 1) {
    if (fds[0] < 0 || fds[1] < 0) return false;
    if (dup2(fds[0], 1) < 0 || dup2(fds[1], 2) < 0) return false;
    close(fds[0]);
    close(fds[1]);
  } else {
    if (fds[0] >= 0) close(fds[0]);
    if (fds[1] >= 0) close(fds[1]);
  }
  for (auto [k, v] : ip::parse_config(payload)) {
    if (k == "mode")
      cfg->mode = v;
    else if (k == "rootfs")
      cfg->rootfs = v;
    else if (k == "staging")
      cfg->staging = v;
    else if (k == "inputs")
      cfg->inputs = v;
    else if (k == "input_name")
      cfg->input_name = v;
    else if (k == "source")
      cfg->source = v;
    else if (k == "source_name")
      cfg->source_name = v;
    else if (k == "uid")
      cfg->uid = static_cast<uid_t>(to_u64(v));
    else if (k == "gid")
      cfg->gid = static_cast<gid_t>(to_u64(v));
    else if (k == "userns")
      cfg->userns = v == "1";
    else if (k == "launch")
      cfg->oci = v == "oci";
    else if (k == "notify")
      cfg->notify = v != "0";
    else if (k == "tmp_bytes")
      cfg->tmp_bytes = to_u64(v);
    else if (k == "home_bytes")
      cfg->home_bytes = to_u64(v);
    else if (k == "shm_bytes")
      cfg->shm_bytes = to_u64(v);
    else if (k == "out_bytes")
      cfg->out_bytes = to_u64(v);
    else if (k == "tmpfs_inodes")
      cfg->tmpfs_inodes = to_u64(v);
    else if (k == "out_inodes")
      cfg->out_inodes = to_u64(v);
    else if (k == "nofile")
      cfg->nofile = to_u64(v);
    else if (k == "fsize_bytes")
      cfg->fsize_bytes = to_u64(v);
    else if (k == "nproc")
      cfg->nproc = to_u64(v);
    else if (k == "prestart")
      cfg->prestart = v;
    else if (k == "prestart_env")
      cfg->prestart_env.emplace_back(v);
    else if (k == "preload")
      cfg->preload.emplace_back(v);
    else if (k == "prestart_kind")
      cfg->prestart_kind = v;
  }
  // Pre-starting is for a run (never the self-test), of an interpreter it has a loader for;
  // in a launch that sandbox-init set up or in an OCI runtime's container (the same steps
  // from 4b on: the loader's socket pair is made here, inside, after the runtime's start).
  if (!cfg->prestart.empty() &&
      (cfg->mode != "run" || cfg->prestart[0] != '/' ||
       (cfg->prestart_kind != "python" && cfg->prestart_kind != "node"))) {
    return false;
  }
  return cfg->oci || (!cfg->rootfs.empty() && !cfg->staging.empty());
}

void reset_signals() {
  sigset_t all;
  sigemptyset(&all);
  sigprocmask(SIG_SETMASK, &all, nullptr);
  struct sigaction sa {};
  sa.sa_handler = SIG_DFL;
  for (int s = 1; s < NSIG; ++s) sigaction(s, &sa, nullptr);  // fails harmlessly for KILL/STOP
}

// Drops every capability of this process and sets no_new_privs. sandbox-init needs none of
// them once the user program runs: it only reaps and reports.
bool drop_own_privileges() {
  for (int cap = 0; cap <= 63; ++cap) {
    if (prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) < 0 && errno == EINVAL) break;
  }
  prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0);
  __user_cap_header_struct hdr{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct data[2]{};
  if (syscall(SYS_capset, &hdr, data) < 0) return false;
  return prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0;
}

// Stream mode, a session: the program's stdin, fed from the control stream. Holds at most
// `stdin_window` bytes (the host's credit); each write into the pipe is acknowledged with
// `stdin_ack`, so the host sends more only as the program reads. A host that sends more than
// the window, an oversized or unknown packet: a protocol fault, sandbox-init exits (its exit
// ends the run).
struct stdin_feed {
  std::string in;       // control bytes not yet a whole packet (< 4 + max_packet)
  std::string pending;  // stdin bytes received, not yet in the pipe (≤ stdin_window)
  bool close_requested = false;

  void on_control(const char* p, std::size_t n) {
    in.append(p, n);
    while (in.size() >= sizeof(std::uint32_t)) {
      std::uint32_t len = 0;
      memcpy(&len, in.data(), sizeof len);
      if (len < sizeof(ip::init_header) || len > sizeof(ip::init_header) + ip::stdin_chunk) {
        _exit(2);
      }
      if (in.size() < sizeof len + len) return;
      ip::init_header h;
      memcpy(&h, in.data() + sizeof len, sizeof h);
      const std::size_t body = len - sizeof h;
      if (h.type == ip::msg::stdin_data) {
        if (close_requested || pending.size() + body > ip::stdin_window) _exit(2);
        // After the program closed its stdin (stdin_closed sent), bytes still in flight
        // are dropped: nothing can read them.
        if (g_stdin_w >= 0) pending.append(in, sizeof len + sizeof h, body);
      } else if (h.type == ip::msg::stdin_close) {
        close_requested = true;
      } else {
        _exit(2);
      }
      in.erase(0, sizeof len + len);
    }
    write_some();
  }

  // Writes what the pipe takes now; acknowledges it; closes the pipe once asked and empty.
  // SIGPIPE is blocked in sandbox-init (main): a reader gone is EPIPE here.
  void write_some() {
    if (g_stdin_w < 0) return;
    while (!pending.empty()) {
      ssize_t w = write(g_stdin_w, pending.data(), pending.size());
      if (w < 0 && errno == EINTR) continue;
      if (w < 0 && errno == EAGAIN) break;
      if (w <= 0) {  // EPIPE: the program (and everything it started) closed its stdin
        close(g_stdin_w);
        g_stdin_w = -1;
        pending.clear();
        pending.shrink_to_fit();
        if (!send_msg(ip::msg::stdin_closed, 0, 0, {}, nullptr, 0)) _exit(1);
        return;
      }
      pending.erase(0, static_cast<std::size_t>(w));
      if (!send_msg(ip::msg::stdin_ack, static_cast<std::uint32_t>(w), 0, {}, nullptr, 0)) {
        _exit(1);
      }
    }
    if (pending.empty() && close_requested) {
      close(g_stdin_w);  // EOF for the program
      g_stdin_w = -1;
    }
  }
};

// Reaps until the host ends the run; reports the main process's exit once.
// `dns_fd` >= 0 (stream mode): the DNS sink's socket, served here — each query's name is
// reported as `dns` and answered REFUSED, the run's own names answered locally (the host
// does this itself when it holds the socket).
[[noreturn]] void supervise(pid_t main_pid, int dns_fd) {
  sigset_t chld;
  sigemptyset(&chld);
  sigaddset(&chld, SIGCHLD);
  int sfd = signalfd(-1, &chld, SFD_CLOEXEC | SFD_NONBLOCK);
  bool main_reported = false, quiet_reported = false;
  auto reap = [&] {
    for (;;) {
      int status = 0;
      pid_t p = waitpid(-1, &status, WNOHANG | __WALL);
      if (p < 0 && errno == ECHILD && main_reported && !quiet_reported) {
        quiet_reported = true;  // nothing of the run is left
        send_msg(ip::msg::quiet, 0, 0, {}, nullptr, 0);
      }
      if (p <= 0) return;
      if (p == main_pid && !main_reported) {
        main_reported = true;
        send_msg(ip::msg::exited, static_cast<std::uint32_t>(status), 0, {}, nullptr, 0);
      }
    }
  };
  reap();                // the child may already have exited
  int dns_budget = 256;  // queries reported per second at most; the rest only answered
  time_t dns_window = 0;
  stdin_feed feed;
  for (;;) {
    pollfd fds[4] = {{ip::control_fd, POLLIN, 0},
                     {sfd, POLLIN, 0},
                     {dns_fd, POLLIN, 0},
                     {feed.pending.empty() ? -1 : g_stdin_w, POLLOUT, 0}};
    // (A negative descriptor is skipped by poll: the DNS socket and the stdin pipe are there
    // only in stream mode, the pipe only while bytes wait for it — a pipe whose reader is
    // gone reports POLLERR whatever is asked.)
    int n = poll(fds, 4, sfd >= 0 ? -1 : 50);
    if (g_stdin_w >= 0 && (fds[3].revents & (POLLOUT | POLLERR | POLLHUP))) feed.write_some();
    if (dns_fd >= 0 && (fds[2].revents & POLLIN)) {
      for (int i = 0; i < 64; ++i) {
        unsigned char pkt[1500];
        sockaddr_storage from{};
        socklen_t fl = sizeof from;
        ssize_t got = recvfrom(dns_fd, pkt, sizeof pkt, MSG_DONTWAIT,
                               reinterpret_cast<sockaddr*>(&from), &fl);
        if (got <= 0) break;
        std::span<const std::uint8_t> q(pkt, static_cast<std::size_t>(got));
        auto answer = detail::dns_local_response(q);
        if (answer.empty()) {
          if (auto name = detail::dns_query_name(q)) {
            time_t now = time(nullptr);
            if (now != dns_window) {
              dns_window = now;
              dns_budget = 256;
            }
            if (dns_budget > 0) {
              --dns_budget;
              send_msg(ip::msg::dns, 0, 0, *name, nullptr, 0);
            }
          }
          answer = detail::dns_refused_response(q);
        }
        if (!answer.empty()) {
          sendto(dns_fd, answer.data(), answer.size(), MSG_DONTWAIT,
                 reinterpret_cast<sockaddr*>(&from), fl);
        }
      }
    }
    if (n < 0 && errno != EINTR) _exit(2);
    if (fds[0].revents & (POLLIN | POLLHUP | POLLERR)) {
      char b[16384];
      ssize_t r = recv(ip::control_fd, b, g_stream ? sizeof b : 64, MSG_DONTWAIT);
      if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR)) _exit(0);  // host gone
      // Stream mode: the host's packets after `go` (a session's stdin); a packet mode host
      // sends nothing after `go`, and what came is dropped.
      if (r > 0 && g_stream) feed.on_control(b, static_cast<std::size_t>(r));
    }
    if (sfd >= 0 && (fds[1].revents & POLLIN)) {
      signalfd_siginfo si;
      while (read(sfd, &si, sizeof si) == sizeof si) {
      }
    }
    reap();
  }
}

}  // namespace
}  // namespace sandbox::init

int main(int argc, char** argv) {
  using namespace sandbox::init;
  namespace ip = sandbox::detail::init_protocol;
  if (argc >= 2 && strcmp(argv[1], "--probe") == 0) return run_probe(argc, argv);
  // Stream mode: the control channel is our stdin (see init_protocol.hpp).
  if (argc >= 2 && strcmp(argv[1], ip::control_stdin_arg) == 0) {
    g_stream = true;
    if (dup2(0, ip::control_fd) < 0) _exit(1);
    int devnull = open("/dev/null", O_RDONLY);
    if (devnull < 0 || dup2(devnull, 0) < 0) _exit(1);
    if (devnull != 0) close(devnull);
  }
  ip::config_writer times;  // phase timestamps (µs, CLOCK_MONOTONIC), sent with "started"
  times.add("init_exec", now_us());

  // 1. Hygiene: default signals, die with the host, own session (no controlling terminal).
  reset_signals();
  prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
  setsid();
  fcntl(ip::control_fd, F_SETFD, FD_CLOEXEC);
  fcntl(ip::self_exec_fd, F_SETFD, FD_CLOEXEC);  // EBADF outside self-test mode: harmless
  // Nothing else is inherited: an OCI runtime passes exactly 0-3 (--preserve-fds 1), and a
  // descriptor it leaked by mistake must not reach the program (runc CVE-2024-21626).
  syscall(SYS_close_range, ip::self_exec_fd + 1, ~0U, 0);

  // 2. Configuration (arrives once the host has placed us in the run's cgroup).
  config cfg;
  if (!read_config(&cfg)) fail({step::config, EINVAL});
  times.add("config_received", now_us());
  // Not dumpable from here on: the sandboxed user cannot open /proc/1/{mem,fd,exe,environ}.
  // (Not earlier: an unprivileged host writes our uid/gid maps before sending the config,
  // and /proc/<pid>/uid_map of a non-dumpable process belongs to root.)
  prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);

  // 3. A cgroup namespace rooted at the run's cgroup.
  //    (An OCI runtime made it already, from config.json.)
  if (!cfg.oci && unshare(CLONE_NEWCGROUP) < 0) fail({step::cgroup_namespace, errno});

  // PID 1 must not be the OOM killer's choice (root only; unprivileged cannot lower it).
  if (!cfg.userns) {
    int fd = open("/proc/self/oom_score_adj", O_WRONLY | O_CLOEXEC);
    if (fd >= 0) {
      (void)!write(fd, "-1000", 5);
      close(fd);
    }
  }

  // 4. Filesystem and network, then `ready` with the output dir and DNS sink socket.
  int out_fd = -1, dns_fd = -1;
  failure f{};
  if (!(cfg.oci ? setup_oci_sandbox(cfg, &out_fd, &dns_fd, &f)
                : setup_sandbox(cfg, &out_fd, &dns_fd, &f))) {
    fail(f);
  }
  times.add("filesystem_ready", now_us());
  // SIGCHLD is blocked before any child exists so no exit is lost before supervise(); SIGPIPE
  // too: writing a session's stdin pipe (stream mode) or a pre-started loader's socket after
  // the reader is gone must be EPIPE, not our death. (The child empties its mask.)
  sigset_t chld;
  sigemptyset(&chld);
  sigaddset(&chld, SIGCHLD);
  sigaddset(&chld, SIGPIPE);
  sigprocmask(SIG_BLOCK, &chld, nullptr);
  // 4b. A pre-started instance: the interpreter starts now, fully sandboxed, imports its
  //     preload list and waits on `loader_sock`; `ready` means it waits.
  pid_t child = -1;
  int listener = -1, loader_sock = -1;
  if (!cfg.prestart.empty()) {
    if (!start_prestarted(cfg, &child, &listener, &loader_sock, &f)) fail(f);
    times.add("prestarted", now_us());
  }
  int ready_fds[2] = {out_fd, dns_fd};
  if (!send_msg(ip::msg::ready, 0, 0, {}, ready_fds, 2)) _exit(1);
  close(out_fd);
  if (!g_stream) {
    close(dns_fd);  // the host serves it
    dns_fd = -1;
  }

  // 5a. Wait for the program (a warm-pool instance waits here until it is handed out; its
  //     inputs and source appear in the already-bound workspace files meanwhile). EOF: the
  //     host is gone or destroyed the instance. A pre-started interpreter that dies
  //     meanwhile ends the instance (the host never hands it out: docs/architecture.md).
  if (loader_sock >= 0 && !wait_go_or_death(loader_sock)) fail({step::prestart, ECHILD});
  if (!read_go(&cfg)) _exit(0);
  times.add("go_received", now_us());
  // (Not in a container: its root and /dev are the runtime's mounts, and sandbox-init has no
  // CAP_SYS_ADMIN to make them writable for the moment it takes.)
  if (!cfg.oci && !refresh_times(&f)) fail(f);

  // 5a'. A network run's egress proxy: a socket listening on the run's loopback (its own
  //      network namespace: nothing else listens there), handed to the host, which serves
  //      it. Made before the program starts, so its first connection is queued, not refused.
  if (cfg.egress_proxy_port > 0) {
    int l = open_listener(cfg.egress_proxy_port);
    if (l < 0) fail({step::egress_proxy, -l});
    if (!send_msg(ip::msg::egress_proxy, 0, 0, {}, &l, 1)) _exit(1);
    close(l);
  }

  // 5a''. A run with secrets: its CA certificate, where the trust-store variables point. The
  //       program has not started, so nothing of its can be there; root's and read-only, in
  //       the sticky /tmp, so the program can neither change nor replace it.
  //       The Node proxy preload likewise, where the launcher has no file of it (microvm).
  if (!cfg.run_ca_pem.empty()) {
    if (int e = write_root_file(ip::run_ca_path, cfg.run_ca_pem); e != 0) fail({step::run_ca, e});
  }
  if (!cfg.node_proxy_preload.empty()) {
    if (int e = write_root_file(ip::node_proxy_path, cfg.node_proxy_preload); e != 0) {
      fail({step::node_proxy, e});
    }
  }

  // 5. The user program (signals blocked at 4b). A pre-started interpreter gets the run's
  //    argv and environment; it can take neither a stdin nor a network (the host sends
  //    such runs cold).
  if (loader_sock >= 0) {
    if (cfg.stdin_fd >= 0 || !cfg.stdin_path.empty() || cfg.egress_proxy_port > 0 ||
        !prestart_can_run(cfg)) {
      fail({step::prestart, EINVAL});
    }
    if (!hand_over(loader_sock, cfg)) fail({step::prestart, ECHILD});
  } else if (!start_child(cfg, &child, &listener, &f)) {
    fail(f);
  }
  times.add("program_execed", now_us());
  // Release the stdout/stderr pipes: only the user program holds them now, so the host sees
  // EOF when it (and its descendants) close them.
  int devnull = open("/dev/null", O_RDWR | O_CLOEXEC);
  if (devnull >= 0) {
    dup2(devnull, 0);  // a session's stdin pipe: only the program holds it now
    dup2(devnull, 1);
    dup2(devnull, 2);
    close(devnull);
  }
  if (!send_msg(ip::msg::started, static_cast<std::uint32_t>(child), 0, times.bytes(), &listener,
                listener >= 0 ? 1 : 0)) {
    _exit(1);
  }
  if (listener >= 0) close(listener);

  // 6. Nothing privileged is left to do.
  if (!drop_own_privileges()) fail({step::drop_init_privileges, errno});
  supervise(child, dns_fd);
}
