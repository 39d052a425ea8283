#include "cli_harness.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <system_error>

namespace clitest {

namespace fs = std::filesystem;

namespace {

std::string env_or_empty(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? std::string() : std::string(v);
}

struct scratch_dir {
  fs::path path;
  scratch_dir() {
    std::string base = env_or_empty("TMPDIR");
    std::string tmpl = (base.empty() ? std::string("/tmp") : base) + "/sandboxctl-test-XXXXXX";
    if (::mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    ::chmod(tmpl.c_str(), 0755);
    path = tmpl;
  }
  ~scratch_dir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

void throw_errno(const char* what) {
  throw std::system_error(errno, std::generic_category(), what);
}

}  // namespace

const fs::path& scratch() {
  static scratch_dir dir;
  return dir.path;
}

outcome sandboxctl(const std::vector<std::string>& args, const std::string& input,
                   std::chrono::seconds limit) {
  return run_program(SANDBOXCTL_PATH, args, input, limit);
}

outcome run_program(const std::string& program, const std::vector<std::string>& args,
                    const std::string& input, std::chrono::seconds limit) {
  std::vector<std::string> argv_s{program};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);

  // Nothing of the caller's environment but what a sanitizer build needs.
  std::vector<std::string> env_s{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "LANG=C.UTF-8"};
  for (const char* keep : {"ASAN_OPTIONS", "UBSAN_OPTIONS", "TSAN_OPTIONS", "LSAN_OPTIONS"}) {
    if (const char* v = std::getenv(keep)) env_s.push_back(std::string(keep) + "=" + v);
  }
  std::vector<char*> envp;
  for (auto& e : env_s) envp.push_back(e.data());
  envp.push_back(nullptr);

  std::array<int, 2> in{}, out{}, err{};
  if (::pipe2(in.data(), O_CLOEXEC) != 0 || ::pipe2(out.data(), O_CLOEXEC) != 0 ||
      ::pipe2(err.data(), O_CLOEXEC) != 0) {
    throw_errno("pipe2");
  }
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, in[0], 0);
  posix_spawn_file_actions_adddup2(&fa, out[1], 1);
  posix_spawn_file_actions_adddup2(&fa, err[1], 2);
  pid_t pid = -1;
  int rc = ::posix_spawn(&pid, argv[0], &fa, nullptr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&fa);
  ::close(in[0]);
  ::close(out[1]);
  ::close(err[1]);
  if (rc != 0) {
    ::close(in[1]);
    ::close(out[0]);
    ::close(err[0]);
    errno = rc;
    throw_errno("posix_spawn");
  }

  outcome o;
  std::size_t written = 0;
  int in_fd = in[1];
  if (input.empty()) {
    ::close(in_fd);
    in_fd = -1;
  } else {
    ::fcntl(in_fd, F_SETFL, O_NONBLOCK);
  }
  const auto deadline = std::chrono::steady_clock::now() + limit;
  bool out_open = true, err_open = true, killed = false;
  while (out_open || err_open) {
    std::array<pollfd, 3> fds{pollfd{out_open ? out[0] : -1, POLLIN, 0},
                              pollfd{err_open ? err[0] : -1, POLLIN, 0}, pollfd{in_fd, POLLOUT, 0}};
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      ::kill(pid, SIGKILL);
      killed = true;
      break;
    }
    int n = ::poll(fds.data(), fds.size(), static_cast<int>(left.count()));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw_errno("poll");
    std::array<char, 65536> buf{};
    for (int i = 0; i < 2; ++i) {
      if ((fds[i].revents & (POLLIN | POLLHUP | POLLERR)) == 0) continue;
      ssize_t r = ::read(fds[i].fd, buf.data(), buf.size());
      if (r > 0) {
        (i == 0 ? o.out : o.err).append(buf.data(), static_cast<std::size_t>(r));
      } else if (r == 0 || errno != EINTR) {
        (i == 0 ? out_open : err_open) = false;
      }
    }
    if (in_fd >= 0 && (fds[2].revents & (POLLOUT | POLLERR | POLLHUP)) != 0) {
      ssize_t w = ::write(in_fd, input.data() + written, input.size() - written);
      if (w > 0) written += static_cast<std::size_t>(w);
      if ((w < 0 && errno != EAGAIN && errno != EINTR) || written == input.size()) {
        ::close(in_fd);
        in_fd = -1;
      }
    }
  }
  if (in_fd >= 0) ::close(in_fd);
  ::close(out[0]);
  ::close(err[0]);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) throw_errno("waitpid");
  }
  if (killed) throw std::runtime_error("sandboxctl did not finish in time");
  o.status = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return o;
}

std::vector<std::string> private_store_flags() {
  return {"--state-dir", (scratch() / "state").string(),
          "--blob-dir",  (scratch() / "blobs").string(),
          "--image-dir", (scratch() / "images").string()};
}

std::vector<std::string> backend_store_flags() {
  std::vector<std::string> f{"--state-dir", (scratch() / "run-state").string(), "--blob-dir",
                             (scratch() / "run-blobs").string()};
  if (auto d = env_or_empty("SANDBOX_IMAGE_DIR"); !d.empty()) {
    f.insert(f.end(), {"--image-dir", d});
  }
  if (auto p = env_or_empty("SANDBOX_CGROUP_PARENT"); !p.empty()) {
    f.insert(f.end(), {"--cgroup-parent", p});
  }
  return f;
}

bool must_work() {
  return env_or_empty("CI") == "true" || env_or_empty("SANDBOX_MUST_WORK") == "1";
}

std::string backend_unavailable_reason() {
  auto flags = backend_store_flags();
  std::vector<std::string> doctor{"doctor"};
  doctor.insert(doctor.end(), flags.begin(), flags.end());
  auto d = sandboxctl(doctor);
  if (d.status != 0) return "no backend registers (sandboxctl doctor):\n" + d.out + d.err;
  std::vector<std::string> current{"image", "current", "python3"};
  current.insert(current.end(), flags.begin(), flags.end());
  auto c = sandboxctl(current);
  if (c.status != 0) return "the python3 image is not installed:\n" + c.err;
  return {};
}

fs::path write_scratch(const std::string& name, const std::string& content) {
  fs::path p = scratch() / name;
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f << content;
  if (!f) throw std::runtime_error("cannot write " + p.string());
  return p;
}

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::vector<std::string> host_paths() {
  return {scratch().string(),   SANDBOX_SOURCE_DIR, SANDBOX_BINARY_DIR, "/var/lib/agent-sandbox",
          "/run/agent-sandbox", "/sys/fs/cgroup",   "/proc/self",       "/tmp/agent-sandbox"};
}

}  // namespace clitest
