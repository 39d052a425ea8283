// The image store's gzip layers (store/gunzip.hpp): decompressed by the host's gzip in a
// process of its own; garbage input is `corrupt`.
#include "store/gunzip.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <string>

#include "sandbox/error.hpp"
#include "unit/store/store_test_util.hpp"

using store_test::temp_dir;

TEST_CASE("gunzip: gunzip source", "[gunzip][tool_process]") {
  temp_dir tmp;
  const std::string text(100000, 'z');
  store_test::write_file(tmp / "good.gz", store_test::gzip(text, tmp.path()));
  store_test::write_file(tmp / "bad.gz", "this is not gzip");
  auto read_all = [](const std::filesystem::path& p) -> sandbox::result<std::string> {
    int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
    sandbox::detail::unique_fd owned(fd);
    auto src = sandbox::detail::gunzip_source::start(fd);
    if (!src) return src.error();
    std::string out;
    char buf[4096];
    for (;;) {
      auto n = (*src)->read(buf, sizeof buf);
      if (!n) return n.error();
      if (*n == 0) return out;
      out.append(buf, *n);
    }
  };
  auto good = read_all(tmp / "good.gz");
  REQUIRE(good);
  CHECK(*good == text);
  auto bad = read_all(tmp / "bad.gz");
  REQUIRE_FALSE(bad.has_value());
  CHECK(bad.error() == sandbox::make_error_code(sandbox::errc::corrupt));
}
