#include "service_harness.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <system_error>
#include <thread>

#include "cli/cli_harness.hpp"

namespace svctest {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

std::string env_or_empty(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? std::string() : std::string(v);
}

[[noreturn]] void throw_errno(const char* what) {
  throw std::system_error(errno, std::generic_category(), what);
}

std::string read_text(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::vector<std::string> list_dir(const fs::path& dir) {
  std::vector<std::string> names;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    names.push_back(it->path().filename().string());
  }
  return names;
}

// A small fixed environment (plus what sanitizer builds need).
std::vector<std::string> child_env() {
  // No __pycache__ in the source tree from the Python clients.
  std::vector<std::string> env{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "LANG=C.UTF-8",
                               "PYTHONDONTWRITEBYTECODE=1"};
  for (const char* keep : {"ASAN_OPTIONS", "UBSAN_OPTIONS", "TSAN_OPTIONS", "LSAN_OPTIONS"}) {
    if (const char* v = std::getenv(keep)) env.push_back(std::string(keep) + "=" + v);
  }
  return env;
}

pid_t spawn_with(const std::vector<std::string>& args, const fs::path& out, const fs::path& err) {
  std::vector<std::string> argv_s = args;
  std::vector<char*> argv;
  for (auto& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);
  auto env_s = child_env();
  std::vector<char*> envp;
  for (auto& e : env_s) envp.push_back(e.data());
  envp.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&fa, 1, out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_addopen(&fa, 2, err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  pid_t pid = -1;
  int rc = ::posix_spawn(&pid, argv[0], &fa, nullptr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) {
    errno = rc;
    throw_errno("posix_spawn");
  }
  return pid;
}

// waitpid with a deadline: -1 when still running after `limit`.
int wait_status(pid_t pid, std::chrono::milliseconds limit) {
  const auto end = std::chrono::steady_clock::now() + limit;
  for (;;) {
    int status = 0;
    pid_t r = ::waitpid(pid, &status, WNOHANG);
    if (r == pid) return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    if (r < 0 && errno != EINTR) throw_errno("waitpid");
    if (std::chrono::steady_clock::now() > end) return -1;
    sleep_ms(10);
  }
}

std::atomic<int> daemon_counter{0};

// True when something accepts connections on `path`.
bool accepts(const fs::path& path) {
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof addr.sun_path - 1);
  bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
  ::close(fd);
  return ok;
}

}  // namespace

void sleep_ms(int ms) { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); }

json ticket(const std::string& tenant) {
  return {{"v", 1},
          {"id", "svc-test"},
          {"tenant", tenant},
          {"actions", {"code.execute"}},
          {"isolation", "process"},
          {"max_timeout_ms", 8000},
          {"max_memory_bytes", 536870912}};
}

json python(const std::string& source, int timeout_ms) {
  return {{"runtime", "python3"}, {"source", source}, {"timeout_ms", timeout_ms}};
}

std::string run_line(const std::string& id, const json& request) {
  return json{{"id", id}, {"ticket", ticket()}, {"request", request}}.dump() + "\n";
}

std::vector<std::string> store_flags(const fs::path& state_dir) {
  std::vector<std::string> f{"--state-dir", state_dir.string(), "--blob-dir",
                             (clitest::scratch() / "blobs").string()};
  if (auto d = env_or_empty("SANDBOX_IMAGE_DIR"); !d.empty()) f.insert(f.end(), {"--image-dir", d});
  if (auto p = env_or_empty("SANDBOX_CGROUP_PARENT"); !p.empty()) {
    f.insert(f.end(), {"--cgroup-parent", p});
  }
  return f;
}

// --- daemon --------------------------------------------------------------------------------

daemon::daemon(const std::vector<std::string>& extra, fs::path socket) {
  const int n = ++daemon_counter;
  socket_ = socket.empty() ? clitest::scratch() / ("s" + std::to_string(n) + ".sock") : socket;
  state_ = clitest::scratch() / ("state-" + std::to_string(n));
  log_ = clitest::scratch() / ("daemon-" + std::to_string(n) + ".log");
  std::vector<std::string> args{SANDBOXCTL_PATH, "serve", "--socket", socket_.string(), "-v"};
  auto flags = store_flags(state_);
  args.insert(args.end(), flags.begin(), flags.end());
  args.insert(args.end(), extra.begin(), extra.end());
  pid_ = spawn_with(args, "/dev/null", log_);
  const bool up = eventually(
      [&] {
        if (accepts(socket_)) return true;
        int status = 0;
        if (::waitpid(pid_, &status, WNOHANG) == pid_) {
          pid_ = -1;
          return true;
        }
        return false;
      },
      60s);
  if (pid_ < 0 || !up) FAIL("the daemon did not start:\n" << log());
}

daemon::~daemon() {
  if (pid_ > 0) {
    ::kill(pid_, SIGKILL);
    int status = 0;
    ::waitpid(pid_, &status, 0);
  }
}

int daemon::signal_and_wait(int sig, std::chrono::milliseconds limit) {
  if (pid_ <= 0) return -1;
  ::kill(pid_, sig);
  int status = wait_status(pid_, limit);
  if (status >= 0) pid_ = -1;
  return status;
}

std::string daemon::log() const { return read_text(log_); }

std::vector<std::string> daemon::instances() const {
  std::vector<std::string> ids;
  for (auto& name : list_dir(state_ / "instances")) {
    if (name.size() > 5 && name.substr(name.size() - 5) == ".lock") {
      ids.push_back(name.substr(0, name.size() - 5));
    }
  }
  return ids;
}

std::uint64_t daemon::rss_bytes() const {
  std::ifstream in("/proc/" + std::to_string(pid_) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoull(line.substr(6)) * 1024;
  }
  return 0;
}

// --- client --------------------------------------------------------------------------------

client::client(const fs::path& socket) {
  fd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd_ < 0) throw_errno("socket");
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, socket.c_str(), sizeof addr.sun_path - 1);
  if (::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    ::close(fd_);
    fd_ = -1;
    throw_errno("connect");
  }
}

client::~client() { close(); }

void client::send(std::string_view bytes) {
  while (!bytes.empty()) {
    ssize_t n = ::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw_errno("send");
    bytes.remove_prefix(static_cast<std::size_t>(n));
  }
}

std::size_t client::send_nonblocking(std::string_view bytes) {
  std::size_t sent = 0;
  while (sent < bytes.size()) {
    ssize_t n = ::send(fd_, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    sent += static_cast<std::size_t>(n);
  }
  return sent;
}

void client::send_oob(char byte) {
  for (;;) {
    ssize_t n = ::send(fd_, &byte, 1, MSG_OOB | MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw_errno("send(MSG_OOB)");
    return;
  }
}

std::optional<std::string> client::read_line(std::chrono::milliseconds limit) {
  const auto end = std::chrono::steady_clock::now() + limit;
  for (;;) {
    auto nl = buf_.find('\n');
    if (nl != std::string::npos) {
      std::string line = buf_.substr(0, nl);
      buf_.erase(0, nl + 1);
      return line;
    }
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        end - std::chrono::steady_clock::now());
    if (left.count() <= 0 || fd_ < 0) return std::nullopt;
    pollfd p{fd_, POLLIN, 0};
    int n = ::poll(&p, 1, static_cast<int>(left.count()));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return std::nullopt;
    char chunk[65536];
    ssize_t r = ::read(fd_, chunk, sizeof chunk);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return std::nullopt;
    buf_.append(chunk, static_cast<std::size_t>(r));
  }
}

json client::answer(std::chrono::milliseconds limit) {
  auto line = read_line(limit);
  if (!line) FAIL("no answer from the daemon");
  json j = json::parse(*line, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) FAIL("answer is not a JSON object: " << *line);
  return j;
}

bool client::closed_by_peer(std::chrono::milliseconds limit) {
  const auto end = std::chrono::steady_clock::now() + limit;
  for (;;) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        end - std::chrono::steady_clock::now());
    if (left.count() <= 0) return false;
    pollfd p{fd_, POLLIN, 0};
    int n = ::poll(&p, 1, static_cast<int>(left.count()));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    char chunk[65536];
    ssize_t r = ::read(fd_, chunk, sizeof chunk);
    if (r == 0 || (r < 0 && errno == ECONNRESET)) return true;
    if (r < 0 && errno != EINTR) return false;
  }
}

void client::shutdown_write() { ::shutdown(fd_, SHUT_WR); }

void client::close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

// --- processes -----------------------------------------------------------------------------

process spawn(const std::vector<std::string>& argv) {
  static std::atomic<int> counter{0};
  const int n = ++counter;
  process p;
  p.out = clitest::scratch() / ("proc-" + std::to_string(n) + ".out");
  p.err = clitest::scratch() / ("proc-" + std::to_string(n) + ".err");
  p.pid = spawn_with(argv, p.out, p.err);
  return p;
}

outcome wait(const process& p, std::chrono::milliseconds limit) {
  outcome o;
  o.status = wait_status(p.pid, limit);
  if (o.status < 0) {
    ::kill(p.pid, SIGKILL);
    o.status = wait_status(p.pid, 10s);
  }
  o.out = read_text(p.out);
  o.err = read_text(p.err);
  return o;
}

// --- what runs leave behind --------------------------------------------------------------------

std::vector<std::string> run_cgroups(const std::vector<std::string>& instances) {
  std::string parent = env_or_empty("SANDBOX_CGROUP_PARENT");
  if (parent.empty()) parent = "/agent-sandbox";
  std::vector<std::string> found;
  for (const char* h : {"/sys/fs/cgroup/pids", "/sys/fs/cgroup/memory", "/sys/fs/cgroup/unified",
                        "/sys/fs/cgroup"}) {
    fs::path dir = fs::path(h) / parent.substr(1);
    for (const auto& name : list_dir(dir)) {
      for (const auto& inst : instances) {
        if (name.rfind("r-" + inst + "-", 0) == 0) found.push_back((dir / name).string());
      }
    }
  }
  return found;
}

std::vector<int> run_processes(const std::vector<std::string>& instances) {
  std::vector<int> pids;
  for (const auto& p : list_dir("/proc")) {
    if (p.empty() || p.find_first_not_of("0123456789") != std::string::npos) continue;
    std::string cg = read_text(fs::path("/proc") / p / "cgroup");
    for (const auto& inst : instances) {
      if (cg.find("/r-" + inst + "-") != std::string::npos) {
        pids.push_back(std::stoi(p));
        break;
      }
    }
  }
  return pids;
}

std::string base64(std::string_view in) {
  static constexpr char a[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  std::size_t i = 0;
  auto b = [&](std::size_t k) { return static_cast<unsigned>(static_cast<unsigned char>(in[k])); };
  for (; i + 3 <= in.size(); i += 3) {
    unsigned v = (b(i) << 16) | (b(i + 1) << 8) | b(i + 2);
    out += {a[v >> 18], a[(v >> 12) & 63], a[(v >> 6) & 63], a[v & 63]};
  }
  if (in.size() - i == 1) {
    unsigned v = b(i) << 16;
    out += {a[v >> 18], a[(v >> 12) & 63], '=', '='};
  } else if (in.size() - i == 2) {
    unsigned v = (b(i) << 16) | (b(i + 1) << 8);
    out += {a[v >> 18], a[(v >> 12) & 63], a[(v >> 6) & 63], '='};
  }
  return out;
}

}  // namespace svctest
