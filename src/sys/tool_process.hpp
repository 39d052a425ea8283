// Running host tools (gzip, tar, debootstrap) from the multithreaded library (private to src/).
//
// Never fork(): glibc's posix_spawn uses clone(CLONE_VM|CLONE_VFORK), so no code of ours
// runs in the child. The child gets an argv vector (never a shell), only the environment we
// pass, stdin from /dev/null unless told otherwise, "/" as working directory, every
// descriptor above 2 closed, default signal dispositions, an empty signal mask, and its own
// process group so a timeout can kill the tool together with everything it started.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "sandbox/error.hpp"
#include "sys/sys_error.hpp"
#include "sys/unique_fd.hpp"

namespace sandbox::detail {

/// How to start a tool.
struct spawn_spec {
  std::vector<std::string> argv;  ///< argv[0] is the absolute path of the program
  std::vector<std::string> env;   ///< "KEY=value" entries; nothing else is inherited
  int stdin_fd = -1;              ///< -1: /dev/null
  int stdout_fd = -1;             ///< -1: /dev/null
  int stderr_fd = -1;             ///< -1: /dev/null
};

/// A started tool. Destroying one that has not been waited for kills its process group and
/// reaps it. Move-only.
class child_process {
 public:
  child_process() = default;
  ~child_process();
  child_process(child_process&& o) noexcept;
  child_process& operator=(child_process&& o) noexcept;
  child_process(const child_process&) = delete;
  child_process& operator=(const child_process&) = delete;

  /// Starts `spec.argv[0]` with posix_spawn. Errors: system codes (ENOENT: no such program).
  static result<child_process> spawn(const spawn_spec& spec) noexcept;

  /// Waits up to `timeout` for the tool to exit and returns its wait status. On timeout the
  /// whole process group is killed (SIGKILL), reaped, and ETIMEDOUT returned. A non-empty
  /// `tick` is called about every `tick_every` while the tool runs (from this thread).
  result<int> wait(std::chrono::milliseconds timeout, const std::function<void()>& tick = {},
                   std::chrono::milliseconds tick_every = std::chrono::milliseconds(200)) noexcept;

  /// Kills the process group (SIGKILL) and reaps the tool; no-op once reaped.
  void kill_and_reap() noexcept;

  pid_t pid() const noexcept { return pid_; }

 private:
  pid_t pid_ = -1;
};

/// What a finished tool did.
struct tool_result {
  int status = 0;      ///< wait status (see WIFEXITED / WEXITSTATUS)
  std::string output;  ///< its stdout and stderr together, the last `max_output` bytes
  /// True when it exited normally with status 0.
  bool ok() const noexcept;
  /// "exit status 2" / "killed by signal 9".
  std::string describe() const;
};

/// Receives each line a tool writes (without its newline; a last unterminated line too), in
/// order, while the tool runs. Lines longer than 4 KiB are cut there.
using tool_line_sink = std::function<void(std::string_view line)>;

/**
 * Runs a tool to completion: stdin from /dev/null, stdout and stderr captured together in
 * a memfd (no pipe a chatty tool could fill and block on), keeping the last `max_output`
 * bytes. `stdout_fd` ≥ 0 sends stdout there instead. A non-empty `on_line` sees the
 * captured output line by line as it is written (read back about every 200 ms; progress
 * reporting). Errors: system codes from spawning, ETIMEDOUT when `timeout` passed (the tool
 * and its group are killed).
 */
result<tool_result> run_tool(const std::vector<std::string>& argv,
                             const std::vector<std::string>& env, std::chrono::milliseconds timeout,
                             int stdout_fd = -1, std::size_t max_output = 64 * 1024,
                             const tool_line_sink& on_line = {}) noexcept;

/// The minimal environment tools get: PATH=/usr/sbin:/usr/bin:/sbin:/bin, LC_ALL=C.UTF-8.
std::vector<std::string> minimal_tool_env();

/// The first of `candidates` that is an executable regular file, or "".
std::string find_program(const std::vector<std::string>& candidates);

/// The last `max` bytes of the file open at `fd` (read with pread; its offset is unchanged);
/// empty when it is empty or unreadable.
std::string read_tail(int fd, std::size_t max);

}  // namespace sandbox::detail
