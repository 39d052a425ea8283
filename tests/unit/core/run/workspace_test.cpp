// The host-side run workspace (core/run/workspace.hpp): a failure names the OS's own error
// (so the host log says "No space left on device" for a full state disk, not a generic I/O
// error) and leaves nothing behind.
#include "core/run/workspace.hpp"

#include <errno.h>
#include <sys/stat.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <string>

#include "unit/test_files.hpp"

using sandbox::detail::create_workspace;
using sandbox::detail::stage_workspace;
namespace fs = std::filesystem;

TEST_CASE("workspace: creating one names the OS error and leaves nothing behind", "[workspace]") {
  sandbox::test::temp_dir tmp;
  SECTION("the runs dir is under a regular file: ENOTDIR") {
    sandbox::test::write_text(tmp.path / "file", "x");
    auto ws = create_workspace(tmp.path / "file" / "runs", "r1", "main.py");
    REQUIRE_FALSE(ws.has_value());
    CHECK(ws.error().value() == ENOTDIR);
    CHECK(ws.error().category() == boost::system::system_category());
  }
  SECTION("the run's directory exists already: EEXIST, and it is left as it was") {
    fs::create_directories(tmp.path / "runs" / "r1");
    sandbox::test::write_text(tmp.path / "runs" / "r1" / "keep", "mine");
    auto ws = create_workspace(tmp.path / "runs", "r1", "main.py");
    REQUIRE_FALSE(ws.has_value());
    CHECK(ws.error().value() == EEXIST);
    CHECK(sandbox::test::read_text(tmp.path / "runs" / "r1" / "keep") == "mine");
  }
  SECTION("a good one has its skeleton; a second run id is independent") {
    auto ws = create_workspace(tmp.path / "runs", "r2", "main.py");
    REQUIRE(ws.has_value());
    CHECK(fs::is_directory(ws->inputs));
    CHECK(fs::is_directory(ws->staging));
    CHECK(fs::is_regular_file(ws->source));
    CHECK(fs::file_size(ws->source) == 0);
    auto other = create_workspace(tmp.path / "runs", "r3", "main.py");
    CHECK(other.has_value());
  }
}

TEST_CASE("workspace: staging names the OS error when the source file is gone", "[workspace]") {
  sandbox::test::temp_dir tmp;
  auto ws = create_workspace(tmp.path / "runs", "r1", "main.py");
  REQUIRE(ws.has_value());
  fs::remove(ws->source);
  auto blobs = sandbox::make_memory_blob_store();
  auto staged = stage_workspace(*ws, "print(1)", {}, *blobs, "t", nullptr);
  REQUIRE_FALSE(staged.has_value());
  CHECK(staged.error().value() == ENOENT);
  CHECK(staged.error().message().find(tmp.path.string()) == std::string::npos);
}
