// Harness of the service-mode tests: starts `sandboxctl serve` as a subprocess (posix_spawn,
// argv only, a fixed small environment), talks to it over its unix socket, spawns other
// client processes, and looks for what a run leaves behind (its cgroups, its processes).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace svctest {

using namespace std::chrono_literals;

/// The ticket every test uses unless it says otherwise (tenant "acme", code.execute only).
nlohmann::json ticket(const std::string& tenant = "acme");

/// A run request for python3 `source`.
nlohmann::json python(const std::string& source, int timeout_ms = 8000);

/// `{"id": id, "ticket": ticket(), "request": request}` as one line with its newline.
std::string run_line(const std::string& id, const nlohmann::json& request);

/// A running `sandboxctl serve`. The destructor kills it (SIGKILL) if it still runs.
class daemon {
 public:
  /// Starts `serve --socket <socket, default scratch()/sN.sock>` with a private state dir, the
  /// shared blob dir and `extra` arguments, and waits (up to 60 s) until the socket exists; FAILs
  /// the test if the daemon exits first (with its stderr).
  explicit daemon(const std::vector<std::string>& extra = {}, std::filesystem::path socket = {});
  daemon(const daemon&) = delete;
  daemon& operator=(const daemon&) = delete;
  ~daemon();

  const std::filesystem::path& socket() const { return socket_; }
  pid_t pid() const { return pid_; }
  /// Sends `sig` and waits up to `limit` for the exit; returns the exit status (128+N when
  /// killed by signal N), or -1 if it did not exit in time.
  int signal_and_wait(int sig, std::chrono::milliseconds limit = 30s);
  /// Everything the daemon wrote to stderr so far.
  std::string log() const;
  /// Ids of the backend instances this daemon holds (its state dir's instance locks);
  /// run cgroups are named `r-<instance>-<run>`.
  std::vector<std::string> instances() const;
  /// Resident memory of the daemon in bytes (VmRSS).
  std::uint64_t rss_bytes() const;

 private:
  std::filesystem::path socket_;
  std::filesystem::path state_;
  std::filesystem::path log_;
  pid_t pid_ = -1;
};

/// Arguments every daemon gets: --state-dir (private), --blob-dir, and --image-dir /
/// --cgroup-parent from $SANDBOX_IMAGE_DIR / $SANDBOX_CGROUP_PARENT when set.
std::vector<std::string> store_flags(const std::filesystem::path& state_dir);

/// A connection to a daemon's socket.
class client {
 public:
  explicit client(const std::filesystem::path& socket);
  client(const client&) = delete;
  client& operator=(const client&) = delete;
  ~client();

  /// Sends all of `bytes` (blocking).
  void send(std::string_view bytes);
  /// Sends what it can of `bytes` without blocking; returns the count sent.
  std::size_t send_nonblocking(std::string_view bytes);
  /// Sends one out-of-band byte (MSG_OOB), which raises POLLPRI on the daemon's side.
  void send_oob(char byte);
  /// The next line (without its newline), or nullopt at EOF or after `limit`.
  std::optional<std::string> read_line(std::chrono::milliseconds limit = 60s);
  /// The next line parsed as JSON; FAILs the test on EOF, timeout or bad JSON.
  nlohmann::json answer(std::chrono::milliseconds limit = 60s);
  /// True when the daemon closed the connection (EOF) within `limit`.
  bool closed_by_peer(std::chrono::milliseconds limit = 10s);
  void shutdown_write();
  void close();

 private:
  int fd_ = -1;
  std::string buf_;
};

/// What a finished subprocess did.
struct outcome {
  int status = -1;  ///< exit status; 128 + N when killed by signal N
  std::string out;
  std::string err;
};

/// A subprocess started by `spawn`; `wait` collects it.
struct process {
  pid_t pid = -1;
  std::filesystem::path out, err;
};

/// Starts `argv` (argv[0] is a path) with stdin from /dev/null and stdout/stderr to files.
process spawn(const std::vector<std::string>& argv);
/// Waits up to `limit` (then SIGKILL) and returns what it did.
outcome wait(const process& p, std::chrono::milliseconds limit = 120s);

/// Run cgroups (paths) of `instances` under the runs' parent cgroup, in every hierarchy.
std::vector<std::string> run_cgroups(const std::vector<std::string>& instances);
/// Pids of processes that live in a run cgroup of `instances`.
std::vector<int> run_processes(const std::vector<std::string>& instances);

void sleep_ms(int ms);

/// Polls `pred` every 20 ms until it is true or `limit` passed; returns its last value.
template <class Pred>
bool eventually(Pred pred, std::chrono::milliseconds limit = 10s) {
  const auto end = std::chrono::steady_clock::now() + limit;
  for (;;) {
    if (pred()) return true;
    if (std::chrono::steady_clock::now() > end) return false;
    sleep_ms(20);
  }
}

/// Standard base64 (padded).
std::string base64(std::string_view bytes);

}  // namespace svctest
