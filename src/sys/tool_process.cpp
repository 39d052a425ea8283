#include "sys/tool_process.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <memory>
#include <optional>

#include "sys/pidfd.hpp"

namespace sandbox::detail {

child_process::~child_process() { kill_and_reap(); }

child_process::child_process(child_process&& o) noexcept : pid_(std::exchange(o.pid_, -1)) {}

child_process& child_process::operator=(child_process&& o) noexcept {
  if (this != &o) {
    kill_and_reap();
    pid_ = std::exchange(o.pid_, -1);
  }
  return *this;
}

result<child_process> child_process::spawn(const spawn_spec& spec) noexcept {
  try {
    if (spec.argv.empty() || spec.argv[0].empty() || spec.argv[0][0] != '/') {
      return sys_error(EINVAL);
    }
    std::vector<char*> argv;
    for (const auto& a : spec.argv) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    std::vector<char*> envp;
    for (const auto& e : spec.env) envp.push_back(const_cast<char*>(e.c_str()));
    envp.push_back(nullptr);

    posix_spawn_file_actions_t fa;
    if (int e = ::posix_spawn_file_actions_init(&fa); e != 0) return sys_error(e);
    std::unique_ptr<posix_spawn_file_actions_t, int (*)(posix_spawn_file_actions_t*)> fa_guard(
        &fa, ::posix_spawn_file_actions_destroy);
    posix_spawnattr_t attr;
    if (int e = ::posix_spawnattr_init(&attr); e != 0) return sys_error(e);
    std::unique_ptr<posix_spawnattr_t, int (*)(posix_spawnattr_t*)> attr_guard(
        &attr, ::posix_spawnattr_destroy);

    int e = 0;
    auto wire = [&](int fd, int target, int null_flags) {
      if (e != 0) return;
      e = fd >= 0 ? ::posix_spawn_file_actions_adddup2(&fa, fd, target)
                  : ::posix_spawn_file_actions_addopen(&fa, target, "/dev/null", null_flags, 0);
    };
    wire(spec.stdin_fd, 0, O_RDONLY);
    wire(spec.stdout_fd, 1, O_WRONLY);
    wire(spec.stderr_fd, 2, O_WRONLY);
    // Nothing of ours leaks into the tool, even descriptors another thread opened without
    // O_CLOEXEC.
    if (e == 0) e = ::posix_spawn_file_actions_addclosefrom_np(&fa, 3);
    // Tools start in "/" (absolute paths only): the host's working directory is not theirs.
    if (e == 0) e = ::posix_spawn_file_actions_addchdir_np(&fa, "/");
    if (e != 0) return sys_error(e);

    sigset_t empty, all;
    sigemptyset(&empty);
    sigfillset(&all);
    e = ::posix_spawnattr_setflags(
        &attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETPGROUP);
    if (e == 0) e = ::posix_spawnattr_setsigmask(&attr, &empty);
    if (e == 0) e = ::posix_spawnattr_setsigdefault(&attr, &all);
    if (e == 0) e = ::posix_spawnattr_setpgroup(&attr, 0);  // its own group: we can kill it all
    if (e != 0) return sys_error(e);

    pid_t pid = -1;
    e = ::posix_spawn(&pid, argv[0], &fa, &attr, argv.data(), envp.data());
    if (e != 0) return sys_error(e);
    child_process child;
    child.pid_ = pid;
    return child;
  } catch (...) {
    return sys_error(ENOMEM);
  }
}

result<int> child_process::wait(std::chrono::milliseconds timeout,
                                const std::function<void()>& tick,
                                std::chrono::milliseconds tick_every) noexcept {
  if (pid_ <= 0) return sys_error(ECHILD);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  auto next_tick = std::chrono::steady_clock::now() + tick_every;
  // Calls `tick` when it is due; false when it threw (then no more ticks: waiting goes on).
  bool ticking = static_cast<bool>(tick);
  auto maybe_tick = [&] {
    if (!ticking || std::chrono::steady_clock::now() < next_tick) return;
    next_tick = std::chrono::steady_clock::now() + tick_every;
    try {
      tick();
    } catch (...) {
      ticking = false;
    }
  };
  // Raw syscall: glibc 2.36's <sys/pidfd.h> lacks extern "C" and does not link from C++.
  int pidfd = pidfd_open(pid_);
  bool exited = false;
  if (pidfd >= 0) {
    unique_fd guard(pidfd);
    for (;;) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) break;
      if (ticking) left = std::min(left, tick_every);
      pollfd p{pidfd, POLLIN, 0};
      int r = ::poll(&p, 1, static_cast<int>(std::min<long long>(left.count(), 1 << 30)));
      if (r > 0) {
        exited = true;
        break;
      }
      if (r < 0 && errno != EINTR) break;
      maybe_tick();
    }
  } else {
    // No pidfd (old kernel): look every 10 ms without reaping.
    for (;;) {
      siginfo_t info{};
      if (::waitid(P_PID, static_cast<id_t>(pid_), &info, WEXITED | WNOHANG | WNOWAIT) == 0 &&
          info.si_pid == pid_) {
        exited = true;
        break;
      }
      if (std::chrono::steady_clock::now() >= deadline) break;
      timespec ts{0, 10 * 1000 * 1000};
      ::nanosleep(&ts, nullptr);
      maybe_tick();
    }
  }
  if (!exited) {
    kill_and_reap();
    return sys_error(ETIMEDOUT);
  }
  // The tool is a zombie now, so its pid (and group id) cannot be reused yet: kill whatever
  // it left running in its group before reaping it.
  (void)::kill(-pid_, SIGKILL);
  int status = 0;
  pid_t r;
  do {
    r = ::waitpid(pid_, &status, 0);
  } while (r < 0 && errno == EINTR);
  pid_ = -1;
  if (r < 0) return sys_error(errno);  // ECHILD: the host ignores SIGCHLD or reaped it
  return status;
}

void child_process::kill_and_reap() noexcept {
  if (pid_ <= 0) return;
  (void)::kill(-pid_, SIGKILL);
  (void)::kill(pid_, SIGKILL);
  pid_t r;
  do {
    r = ::waitpid(pid_, nullptr, 0);
  } while (r < 0 && errno == EINTR);
  pid_ = -1;
}

bool tool_result::ok() const noexcept { return WIFEXITED(status) && WEXITSTATUS(status) == 0; }

std::string tool_result::describe() const {
  if (WIFEXITED(status)) return "exit status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return "killed by signal " + std::to_string(WTERMSIG(status));
  return "wait status " + std::to_string(status);
}

std::string read_tail(int fd, std::size_t max) {
  struct stat st {};
  if (::fstat(fd, &st) != 0 || st.st_size <= 0) return {};
  const auto size = static_cast<std::uint64_t>(st.st_size);
  const std::uint64_t start = size > max ? size - max : 0;
  std::string out(static_cast<std::size_t>(size - start), '\0');
  std::size_t got = 0;
  while (got < out.size()) {
    ssize_t r = ::pread(fd, out.data() + got, out.size() - got, static_cast<off_t>(start + got));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    got += static_cast<std::size_t>(r);
  }
  out.resize(got);
  return out;
}

namespace {

// Splits what a tool appended to its output file into lines for a tool_line_sink.
class line_follower {
 public:
  line_follower(int fd, const tool_line_sink& sink) : fd_(fd), sink_(sink) {}

  // Reads what was written since the last call and hands on each complete line; `last`
  // also hands on an unterminated rest.
  void poll(bool last) {
    char buf[16 * 1024];
    for (;;) {
      ssize_t n = ::pread(fd_, buf, sizeof buf, offset_);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      offset_ += n;
      for (ssize_t i = 0; i < n; ++i) {
        if (buf[i] == '\n') {
          emit();
        } else if (line_.size() < max_line) {
          line_.push_back(buf[i]);
        }
      }
    }
    if (last && !line_.empty()) emit();
  }

 private:
  static constexpr std::size_t max_line = 4096;
  // Hands on the line; a sink that throws is not called again (the tool runs on).
  void emit() {
    if (!line_.empty() && line_.back() == '\r') line_.pop_back();
    if (!broken_) {
      try {
        sink_(line_);
      } catch (...) {
        broken_ = true;
      }
    }
    line_.clear();
  }
  int fd_;
  const tool_line_sink& sink_;
  off_t offset_ = 0;
  std::string line_;
  bool broken_ = false;
};

}  // namespace

result<tool_result> run_tool(const std::vector<std::string>& argv,
                             const std::vector<std::string>& env, std::chrono::milliseconds timeout,
                             int stdout_fd, std::size_t max_output,
                             const tool_line_sink& on_line) noexcept {
  try {
    int mfd = ::memfd_create("agent-sandbox-tool-output", MFD_CLOEXEC);
    if (mfd < 0) return sys_error(errno);
    unique_fd output(mfd);
    spawn_spec spec{.argv = argv,
                    .env = env,
                    .stdin_fd = -1,
                    .stdout_fd = stdout_fd >= 0 ? stdout_fd : mfd,
                    .stderr_fd = mfd};
    auto child = child_process::spawn(spec);
    if (!child) return child.error();
    std::optional<line_follower> lines;
    if (on_line) lines.emplace(mfd, on_line);
    std::function<void()> tick;
    if (lines) tick = [&] { lines->poll(false); };
    auto status = child->wait(timeout, tick);
    if (!status) return status.error();
    if (lines) lines->poll(true);
    tool_result res;
    res.status = *status;
    res.output = read_tail(mfd, max_output);
    return res;
  } catch (...) {
    return sys_error(ENOMEM);
  }
}

std::vector<std::string> minimal_tool_env() {
  return {"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL=C.UTF-8"};
}

std::string find_program(const std::vector<std::string>& candidates) {
  for (const auto& c : candidates) {
    struct stat st {};
    if (::stat(c.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(c.c_str(), X_OK) == 0) {
      return c;
    }
  }
  return {};
}

}  // namespace sandbox::detail
