// Span sinks and the stderr log sink (sandbox/span.hpp).
#include "sandbox/span.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <mutex>
#include <nlohmann/json.hpp>

#include "protocol/json_strict.hpp"
#include "sandbox/protocol.hpp"
#include "sys/io.hpp"

namespace sandbox {
namespace {

using detail::write_all;

class jsonl_sink final : public span_sink {
 public:
  jsonl_sink(int fd, bool owned) : fd_(fd), owned_(owned) {}
  jsonl_sink(const jsonl_sink&) = delete;
  jsonl_sink& operator=(const jsonl_sink&) = delete;
  ~jsonl_sink() override {
    if (owned_) ::close(fd_);
  }

  void record(const span& s) noexcept override {
    try {
      std::string line = to_json_line(s);
      line += '\n';
      const std::lock_guard lock(mutex_);
      write_all(fd_, line.data(),
                line.size());  // with O_APPEND one write takes the line  // a failed write loses
                               // the span; record must not throw
    } catch (...) {
      // Out of memory while formatting: drop the span.
    }
  }

 private:
  std::mutex mutex_;
  int fd_;
  bool owned_;
};

std::int64_t unix_nanos(std::chrono::system_clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
}

std::string_view level_name(log_level level) {
  switch (level) {
    case log_level::debug:
      return "debug";
    case log_level::info:
      return "info";
    case log_level::warning:
      return "warning";
    case log_level::error:
      return "error";
  }
  return "unknown";
}

}  // namespace

std::shared_ptr<span_sink> make_jsonl_span_sink(const std::string& path) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | O_NOCTTY, 0600);
  if (fd < 0) return nullptr;
  try {
    return std::make_shared<jsonl_sink>(fd, true);
  } catch (...) {
    ::close(fd);
    return nullptr;
  }
}

std::shared_ptr<span_sink> make_jsonl_span_sink(int fd) {
  if (fd < 0) return nullptr;
  return std::make_shared<jsonl_sink>(fd, false);
}

std::string to_json_line(const span& s) {
  nlohmann::ordered_json j;
  j["name"] = s.name;
  j["start_time_unix_nano"] = unix_nanos(s.start);
  j["end_time_unix_nano"] = unix_nanos(s.end);
  j["attributes"] = nlohmann::ordered_json::object();
  for (const auto& [key, value] : s.attributes) {
    std::visit([&, &key = key](const auto& v) { j["attributes"][key] = v; }, value);
  }
  return detail::dump_compact(j);
}

log_sink make_stderr_log_sink(log_level min) {
  return [min](log_level level, std::string_view line) {
    if (level < min) return;
    try {
      // One write per line; control characters (a newline inside `line`) are escaped so a
      // log line can never pose as two.
      std::string out = "agent-sandbox: ";
      out += level_name(level);
      out += ": ";
      out += escape_for_display(line);
      out += '\n';
      write_all(STDERR_FILENO, out.data(), out.size());
    } catch (...) {
      // Out of memory: the line is lost; a log sink must not throw.
    }
  };
}

}  // namespace sandbox
