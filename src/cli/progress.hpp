// One progress line on a terminal, for long CLI operations (`sandboxctl image build`).
#pragma once

#include <chrono>
#include <mutex>
#include <string>
#include <string_view>

#include "sandbox/span.hpp"

namespace sandboxctl {

/**
 * A status line redrawn in place on stderr (carriage return, erase to end of line), cut to
 * the terminal's width. Inactive (every call a no-op) when stderr is not a terminal, so
 * piped and logged output stays quiet. Thread-safe.
 */
class tty_progress {
 public:
  tty_progress();
  ~tty_progress();
  tty_progress(const tty_progress&) = delete;
  tty_progress& operator=(const tty_progress&) = delete;

  /// True when stderr is a terminal.
  bool active() const noexcept { return active_; }

  /// Shows `line` (redrawn at most every 100 ms, the latest line wins).
  void show(std::string_view line);

  /// Erases the line (before other output, and at the end).
  void clear();

  /// A log sink that erases the line before `inner` writes, so log lines and the status line
  /// never mix.
  sandbox::log_sink wrap(sandbox::log_sink inner);

 private:
  void clear_locked();
  bool active_ = false;
  std::mutex mu_;
  bool shown_ = false;
  std::chrono::steady_clock::time_point last_{};
};

}  // namespace sandboxctl
