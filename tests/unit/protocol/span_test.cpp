// Unit tests of the span JSON form, the JSON-lines span sinks and the stderr log sink.
#include "sandbox/span.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "sandbox/protocol.hpp"

namespace fs = std::filesystem;

namespace {

/// A fresh private directory, removed at scope exit.
struct temp_dir {
  fs::path path;
  temp_dir() {
    std::string pattern = (fs::temp_directory_path() / "sandbox-span-test-XXXXXX").string();
    REQUIRE(::mkdtemp(pattern.data()) != nullptr);
    path = pattern;
  }
  ~temp_dir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

sandbox::span sample_span() {
  sandbox::span s;
  s.start = std::chrono::system_clock::time_point(std::chrono::seconds(1700000000));
  s.end = s.start + std::chrono::milliseconds(1500);
  s.attributes = {{"sandbox.run_id", std::string("run-1")},
                  {"sandbox.timeout", std::int64_t{2000}},
                  {"sandbox.timeout_clamped", false},
                  {"error_code", std::string("ok")}};
  return s;
}

std::vector<std::string> read_lines(const fs::path& p) {
  std::ifstream in(p);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

/// Reads everything available from a pipe's read end (non-blocking).
std::string drain(int fd) {
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
  std::string out;
  char buffer[4096];
  for (ssize_t n; (n = ::read(fd, buffer, sizeof buffer)) > 0;) out.append(buffer, n);
  return out;
}

}  // namespace

TEST_CASE("to_json_line writes the documented span form", "[span]") {
  CHECK(sandbox::to_json_line(sample_span()) ==
        R"({"name":"sandbox.run","start_time_unix_nano":1700000000000000000,)"
        R"("end_time_unix_nano":1700000001500000000,"attributes":{"error_code":"ok",)"
        R"("sandbox.run_id":"run-1","sandbox.timeout":2000,"sandbox.timeout_clamped":false}})");
}

TEST_CASE("to_json_line stays valid UTF-8 on one line whatever the attributes hold", "[span]") {
  auto s = sample_span();
  s.attributes["weird\n"] = std::string("bad \xff\nbyte");
  const std::string line = sandbox::to_json_line(s);
  CHECK(sandbox::is_valid_utf8(line));
  CHECK(line.find('\n') == std::string::npos);
  CHECK(nlohmann::json::parse(line)["attributes"]["weird\n"] == "bad \xef\xbf\xbd\nbyte");
}

TEST_CASE("the file sink appends one JSON line per span, mode 0600", "[span]") {
  temp_dir dir;
  const fs::path file = dir.path / "spans.jsonl";
  {
    std::ofstream existing(file);
    existing << "earlier line\n";
  }
  fs::remove(file);  // first: let the sink create it
  const mode_t old_umask = ::umask(0);
  auto sink = sandbox::make_jsonl_span_sink(file.string());
  ::umask(old_umask);
  REQUIRE(sink);
  sink->record(sample_span());
  auto second = sample_span();
  second.attributes["error_code"] = std::string("timeout");
  sink->record(second);
  struct stat st {};
  REQUIRE(::stat(file.c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0600);
  const auto lines = read_lines(file);
  REQUIRE(lines.size() == 2);
  CHECK(lines[0] == sandbox::to_json_line(sample_span()));
  CHECK(lines[1] == sandbox::to_json_line(second));

  // A second sink on the same file appends; it never truncates.
  auto again = sandbox::make_jsonl_span_sink(file.string());
  REQUIRE(again);
  again->record(sample_span());
  CHECK(read_lines(file).size() == 3);
}

TEST_CASE("the file sink's descriptor is close-on-exec and append-only", "[span]") {
  temp_dir dir;
  const fs::path file = dir.path / "spans.jsonl";
  auto sink = sandbox::make_jsonl_span_sink(file.string());
  REQUIRE(sink);
  int found = 0;
  for (const auto& entry : fs::directory_iterator("/proc/self/fd")) {
    std::error_code ec;
    const fs::path target = fs::read_symlink(entry.path(), ec);
    if (ec || target != file) continue;
    const int fd = std::stoi(entry.path().filename().string());
    CHECK((::fcntl(fd, F_GETFD) & FD_CLOEXEC) != 0);
    CHECK((::fcntl(fd, F_GETFL) & O_APPEND) != 0);
    ++found;
  }
  CHECK(found == 1);
  sink.reset();  // closes it
  found = 0;
  for (const auto& entry : fs::directory_iterator("/proc/self/fd")) {
    std::error_code ec;
    if (fs::read_symlink(entry.path(), ec) == file) ++found;
  }
  CHECK(found == 0);
}

TEST_CASE("the file sink returns nullptr when the file cannot be opened", "[span]") {
  temp_dir dir;
  CHECK(sandbox::make_jsonl_span_sink((dir.path / "missing" / "spans.jsonl").string()) == nullptr);
  CHECK(sandbox::make_jsonl_span_sink(dir.path.string()) == nullptr);  // a directory
  CHECK(sandbox::make_jsonl_span_sink(std::string()) == nullptr);
  CHECK(sandbox::make_jsonl_span_sink(-1) == nullptr);
}

TEST_CASE("concurrent records never interleave within a line", "[span]") {
  temp_dir dir;
  const fs::path file = dir.path / "spans.jsonl";
  auto sink = sandbox::make_jsonl_span_sink(file.string());
  REQUIRE(sink);
  constexpr int threads = 8;
  constexpr int per_thread = 200;
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      auto s = sample_span();
      s.attributes["sandbox.stdout"] = std::string(1000 + t * 37, static_cast<char>('a' + t));
      for (int i = 0; i < per_thread; ++i) {
        s.attributes["sandbox.i"] = std::int64_t{i};
        sink->record(s);
      }
    });
  }
  for (auto& w : workers) w.join();
  const auto lines = read_lines(file);
  REQUIRE(lines.size() == threads * per_thread);
  for (const auto& line : lines) {
    const auto j = nlohmann::json::parse(line, nullptr, false);
    REQUIRE_FALSE(j.is_discarded());
    CHECK(j["name"] == "sandbox.run");
  }
}

TEST_CASE("the descriptor sink writes to a descriptor it does not own", "[span]") {
  int fds[2];
  REQUIRE(::pipe(fds) == 0);
  {
    auto sink = sandbox::make_jsonl_span_sink(fds[1]);
    REQUIRE(sink);
    sink->record(sample_span());
  }
  // Still open after the sink is gone.
  CHECK(::fcntl(fds[1], F_GETFD) != -1);
  CHECK(drain(fds[0]) == sandbox::to_json_line(sample_span()) + "\n");
  ::close(fds[0]);
  ::close(fds[1]);
}

TEST_CASE("the stderr log sink filters by level and keeps each line one line", "[span][log]") {
  int fds[2];
  REQUIRE(::pipe(fds) == 0);
  const int saved = ::dup(STDERR_FILENO);
  REQUIRE(saved >= 0);
  REQUIRE(::dup2(fds[1], STDERR_FILENO) == STDERR_FILENO);

  auto log = sandbox::make_stderr_log_sink();  // warning and above
  log(sandbox::log_level::debug, "hidden");
  log(sandbox::log_level::info, "hidden too");
  log(sandbox::log_level::warning, "openat(\"/sys/fs/cgroup\"): EACCES");
  log(sandbox::log_level::error, "two\nlines \xff");
  auto verbose = sandbox::make_stderr_log_sink(sandbox::log_level::debug);
  verbose(sandbox::log_level::debug, "shown");

  ::dup2(saved, STDERR_FILENO);
  ::close(saved);
  ::close(fds[1]);
  CHECK(drain(fds[0]) ==
        "agent-sandbox: warning: openat(\"/sys/fs/cgroup\"): EACCES\n"
        "agent-sandbox: error: two\\x0alines \\xff\n"
        "agent-sandbox: debug: shown\n");
  ::close(fds[0]);
}
