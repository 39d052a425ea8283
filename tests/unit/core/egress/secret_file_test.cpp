// Reading a host-held secret's value (core/egress/secret_file.hpp): the file must be one that
// only its owner (root or the host's uid) could have written or read, and the value one line
// of printable ASCII; every refusal names the reason and never quotes the content.
#include "core/egress/secret_file.hpp"

#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <string>

#include "sandbox/secrets.hpp"
#include "unit/test_files.hpp"

namespace {

using sandbox::detail::read_secret_file;
using sandbox::test::temp_dir;
using sandbox::test::write_text;

const std::string value = "sk-test-0123456789-VALUE";

std::string make_file(const temp_dir& t, const std::string& name, const std::string& text,
                      mode_t mode = 0600) {
  const auto p = (t.path / name).string();
  write_text(p, text);
  REQUIRE(::chmod(p.c_str(), mode) == 0);
  return p;
}

}  // namespace

TEST_CASE("secret file: a 0600 or 0400 file of the host's uid gives its one line",
          "[secrets][egress]") {
  temp_dir t;
  auto r = read_secret_file(make_file(t, "a", value + "\n"), ::geteuid());
  CHECK(r.problem.empty());
  CHECK(r.value == value);
  r = read_secret_file(make_file(t, "b", value + "\r\n", 0400), ::geteuid());
  CHECK(r.problem.empty());
  CHECK(r.value == value);
  r = read_secret_file(make_file(t, "c", value), ::geteuid());  // no final newline
  CHECK(r.value == value);
  // A value with inner spaces (a header value may have them) is kept as is.
  r = read_secret_file(make_file(t, "d", "abc def ghi"), ::geteuid());
  CHECK(r.value == "abc def ghi");
}

TEST_CASE("secret file: group- or world-accessible files are refused", "[secrets][egress]") {
  temp_dir t;
  for (mode_t mode : {0640, 0604, 0660, 0644, 0601, 0610}) {
    CAPTURE(mode);
    const auto r = read_secret_file(make_file(t, "m", value, mode), ::geteuid());
    CHECK(r.value.empty());
    CHECK(r.problem.find("accessible to group or others") != std::string::npos);
    CHECK(r.problem.find(value) == std::string::npos);
  }
}

TEST_CASE("secret file: a file owned by another user is refused", "[secrets][egress]") {
  temp_dir t;
  const auto p = make_file(t, "o", value);
  if (::geteuid() == 0) {
    // As root: a file of uid 65534 is neither root's nor ours.
    REQUIRE(::chown(p.c_str(), 65534, 65534) == 0);
    const auto r = read_secret_file(p, 0);
    CHECK(r.value.empty());
    CHECK(r.problem.find("owned by uid 65534") != std::string::npos);
  } else {
    // Unprivileged: our file, judged as if the host ran as another uid.
    const auto r = read_secret_file(p, ::geteuid() + 1);
    CHECK(r.value.empty());
    CHECK(r.problem.find("owned by uid") != std::string::npos);
  }
}

TEST_CASE("secret file: links, directories, FIFOs and missing files are refused",
          "[secrets][egress]") {
  temp_dir t;
  const auto target = make_file(t, "target", value);
  const auto link = (t.path / "link").string();
  REQUIRE(::symlink(target.c_str(), link.c_str()) == 0);
  auto r = read_secret_file(link, ::geteuid());
  CHECK(r.problem == "is a symbolic link");
  const auto dir = (t.path / "dir").string();
  REQUIRE(::mkdir(dir.c_str(), 0700) == 0);
  r = read_secret_file(dir, ::geteuid());
  CHECK(r.problem == "is not a regular file");
  const auto fifo = (t.path / "fifo").string();
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  r = read_secret_file(fifo, ::geteuid());  // never blocks waiting for a writer
  CHECK(r.problem == "is not a regular file");
  r = read_secret_file((t.path / "absent").string(), ::geteuid());
  CHECK(r.problem.find("cannot be opened") != std::string::npos);
  r = read_secret_file("relative/path", ::geteuid());
  CHECK(r.problem == "not an absolute path");
}

TEST_CASE("secret file: the value must be one line of printable ASCII, 8..4096 bytes",
          "[secrets][egress]") {
  temp_dir t;
  auto refused = [&](const std::string& text, const std::string& why) {
    CAPTURE(text.size());
    const auto r = read_secret_file(make_file(t, "v", text), ::geteuid());
    CHECK(r.value.empty());
    CHECK(r.problem.find(why) != std::string::npos);
  };
  refused("", "fewer than 8 bytes");
  refused("short\n", "fewer than 8 bytes");
  refused("line-one\nline-two", "not printable ASCII");  // header injection
  refused("abcdefgh\r\nX-Evil: 1", "not printable ASCII");
  refused(std::string("abcd\0efgh", 9), "not printable ASCII");
  refused("caf\xc3\xa9-value", "not printable ASCII");
  refused(" padded-value", "leading or trailing spaces");
  refused(std::string(sandbox::max_secret_value_bytes + 1, 'k'), "larger than 4096 bytes");
  refused(std::string(100000, 'k'), "larger than 4096 bytes");
  const auto r = read_secret_file(
      make_file(t, "max", std::string(sandbox::max_secret_value_bytes, 'k') + "\n"), ::geteuid());
  CHECK(r.value.size() == sandbox::max_secret_value_bytes);
}
