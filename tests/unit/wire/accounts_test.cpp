// The run's passwd and group entries (wire/accounts.hpp): the image's lines kept except those
// that would give the run's uid, gid or name another meaning, the run's entry last; the image's
// files read only as regular files under a real /etc, never through a link, and capped.
#include "wire/accounts.hpp"

#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <string>

#include "unit/test_files.hpp"

namespace {

namespace fs = std::filesystem;
using sandbox::detail::account_file_max_bytes;
using sandbox::detail::group_with_run_account;
using sandbox::detail::passwd_with_run_account;
using sandbox::detail::read_image_etc_file;
using sandbox::test::temp_dir;
using sandbox::test::write_text;

/// `read_image_etc_file` on `root`'s etc/<name>: its return value, the content in `*out`.
int read_etc(const fs::path& root, const char* name, std::string* out) {
  int fd = ::open(root.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  REQUIRE(fd >= 0);
  int rc = read_image_etc_file(fd, name, out);
  ::close(fd);
  return rc;
}

}  // namespace

TEST_CASE("accounts: the run's passwd entry replaces the image's for its uid and name",
          "[accounts]") {
  CHECK(passwd_with_run_account("", 1000, 1000) == "sandbox:x:1000:1000::/home/sandbox:/bin/sh\n");
  // Kept: other uids (10000 is not 1000), a name that only starts like ours, comments, blank
  // and malformed lines; a missing final newline is added. Dropped: uid 1000, name sandbox.
  const std::string image =
      "root:x:0:0:root:/root:/bin/bash\n"
      "node:x:1000:1000::/home/node:/bin/bash\n"
      "big:x:10000:10000::/home/big:/bin/sh\n"
      "sandboxer:x:7:7::/:/bin/sh\n"
      "sandbox:x:4242:4242::/nowhere:/bin/false\n"
      "\n"
      "# comment\n"
      "malformed\n"
      "nobody:x:65534:65534::/nonexistent:/usr/sbin/nologin";
  CHECK(passwd_with_run_account(image, 1000, 1001) ==
        "root:x:0:0:root:/root:/bin/bash\n"
        "big:x:10000:10000::/home/big:/bin/sh\n"
        "sandboxer:x:7:7::/:/bin/sh\n"
        "\n"
        "# comment\n"
        "malformed\n"
        "nobody:x:65534:65534::/nonexistent:/usr/sbin/nologin\n"
        "sandbox:x:1000:1001::/home/sandbox:/bin/sh\n");
  // A pool uid on a root host.
  CHECK(passwd_with_run_account("root:x:0:0::/root:/bin/sh\n", 120003, 120003) ==
        "root:x:0:0::/root:/bin/sh\nsandbox:x:120003:120003::/home/sandbox:/bin/sh\n");
}

TEST_CASE("accounts: the run's group entry replaces the image's for its gid and name",
          "[accounts]") {
  CHECK(group_with_run_account("", 1000) == "sandbox:x:1000:\n");
  CHECK(group_with_run_account("root:x:0:\nnode:x:1000:\nsandbox:x:9:\nusers:x:100:a,b", 1000) ==
        "root:x:0:\nusers:x:100:a,b\nsandbox:x:1000:\n");
}

TEST_CASE("accounts: the image's file is read only as a regular file, never through a link",
          "[accounts]") {
  temp_dir image;
  temp_dir host;
  const fs::path secret = host.path / "shadow";
  write_text(secret, "root:HOST-SECRET:0:0::/root:/bin/sh\n");
  std::string out = "stale";

  SECTION("a regular file") {
    fs::create_directories(image.path / "etc");
    write_text(image.path / "etc" / "passwd", "root:x:0:0::/root:/bin/sh\n");
    CHECK(read_etc(image.path, "passwd", &out) == 0);
    CHECK(out == "root:x:0:0::/root:/bin/sh\n");
  }
  SECTION("absent") {
    fs::create_directories(image.path / "etc");
    CHECK(read_etc(image.path, "passwd", &out) == -ENOENT);
    CHECK(out.empty());
    fs::remove(image.path / "etc");
    CHECK(read_etc(image.path, "passwd", &out) == -ENOENT);
  }
  SECTION("the file a symlink to a host file") {
    fs::create_directories(image.path / "etc");
    fs::create_symlink(secret, image.path / "etc" / "passwd");
    CHECK(read_etc(image.path, "passwd", &out) == -ELOOP);
    CHECK(out.empty());
  }
  SECTION("etc a symlink to a host directory") {
    fs::create_symlink(host.path, image.path / "etc");
    write_text(host.path / "passwd", "root:HOST-SECRET:0:0::/root:/bin/sh\n");
    const int rc = read_etc(image.path, "passwd", &out);
    CHECK((rc == -ELOOP || rc == -ENOTDIR));
    CHECK(out.empty());
  }
  SECTION("a FIFO: refused at once, never waited on") {
    fs::create_directories(image.path / "etc");
    REQUIRE(::mkfifo((image.path / "etc" / "group").c_str(), 0644) == 0);
    CHECK(read_etc(image.path, "group", &out) == -EINVAL);
    CHECK(out.empty());
  }
  SECTION("a directory") {
    fs::create_directories(image.path / "etc" / "group");
    CHECK(read_etc(image.path, "group", &out) == -EINVAL);
  }
  SECTION("over the cap: the whole lines within it") {
    fs::create_directories(image.path / "etc");
    const std::string line = "user:x:1:1::/:/bin/sh\n";  // 22 bytes
    std::string big;
    while (big.size() < account_file_max_bytes + 1000) big += line;
    write_text(image.path / "etc" / "passwd", big);
    CHECK(read_etc(image.path, "passwd", &out) == 0);
    CHECK(out.size() <= account_file_max_bytes);
    CHECK(out.size() > account_file_max_bytes - line.size());
    CHECK(out.size() % line.size() == 0);
    CHECK(out.back() == '\n');
  }
}
