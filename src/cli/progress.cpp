#include "cli/progress.hpp"

#include <sys/ioctl.h>
#include <unistd.h>

#include <string>

namespace sandboxctl {
namespace {

// The terminal's width in columns (80 when unknown).
std::size_t terminal_columns() {
  winsize ws{};
  if (::ioctl(STDERR_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0) return ws.ws_col;
  return 80;
}

void write_all(std::string_view s) {
  while (!s.empty()) {
    ssize_t n = ::write(STDERR_FILENO, s.data(), s.size());
    if (n <= 0) return;  // display only: a broken terminal loses the line
    s.remove_prefix(static_cast<std::size_t>(n));
  }
}

}  // namespace

tty_progress::tty_progress() : active_(::isatty(STDERR_FILENO) == 1) {}

tty_progress::~tty_progress() { clear(); }

void tty_progress::show(std::string_view line) {
  if (!active_) return;
  std::lock_guard lock(mu_);
  const auto now = std::chrono::steady_clock::now();
  if (shown_ && now - last_ < std::chrono::milliseconds(100)) return;
  last_ = now;
  // Cut to one line narrower than the terminal (no wrap), at a UTF-8 character boundary;
  // control characters from tool output are shown as '?'.
  const std::size_t width = terminal_columns() - 1;
  std::string out = "\r\033[K";
  std::size_t cols = 0;
  for (std::size_t i = 0; i < line.size() && cols < width; ++i) {
    unsigned char c = static_cast<unsigned char>(line[i]);
    if ((c & 0xC0) == 0x80) {  // continuation byte: no column of its own
      out.push_back(static_cast<char>(c));
      continue;
    }
    out.push_back(c < 0x20 || c == 0x7F ? '?' : static_cast<char>(c));
    ++cols;
  }
  write_all(out);
  shown_ = true;
}

void tty_progress::clear() {
  if (!active_) return;
  std::lock_guard lock(mu_);
  clear_locked();
}

void tty_progress::clear_locked() {
  if (!shown_) return;
  write_all("\r\033[K");
  shown_ = false;
}

sandbox::log_sink tty_progress::wrap(sandbox::log_sink inner) {
  return [this, inner = std::move(inner)](sandbox::log_level level, std::string_view line) {
    if (active_) {
      std::lock_guard lock(mu_);
      clear_locked();
      if (inner) inner(level, line);
      return;
    }
    if (inner) inner(level, line);
  };
}

}  // namespace sandboxctl
