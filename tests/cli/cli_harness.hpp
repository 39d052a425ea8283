// Harness of the sandboxctl tests: spawns the real CLI (posix_spawn, argv only, a fixed small
// environment), captures its exit status, stdout and stderr, and gives every test a private
// scratch directory and store flags so that nothing of the host's stores is touched.
#pragma once

#include <chrono>
#include <filesystem>
#include <string>
#include <vector>

namespace clitest {

/// What one sandboxctl invocation did.
struct outcome {
  int status = -1;  ///< exit status; 128 + signal when killed by one
  std::string out;  ///< everything written to stdout
  std::string err;  ///< everything written to stderr
};

/// Runs the executable `program` (an absolute path) with `args`, feeding `input` on stdin;
/// killed after `limit`.
outcome run_program(const std::string& program, const std::vector<std::string>& args,
                    const std::string& input = {},
                    std::chrono::seconds limit = std::chrono::seconds(120));

/// Runs sandboxctl with `args`, feeding `input` on stdin; killed after `limit`.
outcome sandboxctl(const std::vector<std::string>& args, const std::string& input = {},
                   std::chrono::seconds limit = std::chrono::seconds(120));

/// The scratch directory of this test process (created on first use, mode 0755 so run uids
/// can traverse it; removed at exit).
const std::filesystem::path& scratch();

/// Store flags for tests that need no backend: state, blobs and images all under scratch().
std::vector<std::string> private_store_flags();

/// Store flags for tests that run code: state and blobs under scratch(); the image store from
/// $SANDBOX_IMAGE_DIR, else the library's default; `--cgroup-parent $SANDBOX_CGROUP_PARENT`
/// when that is set (unprivileged hosts).
std::vector<std::string> backend_store_flags();

/// True when CI=true or SANDBOX_MUST_WORK=1: a test that cannot run fails instead of skipping.
bool must_work();

/// Empty when sandboxctl can run python3 here (a backend registers and the image is
/// installed); else why not.
std::string backend_unavailable_reason();

/// Writes `content` to scratch()/name and returns the path.
std::filesystem::path write_scratch(const std::string& name, const std::string& content);

/// Reads a whole file.
std::string read_file(const std::filesystem::path& p);

/// Strings that must never appear in a result: the scratch directory, this checkout and its
/// build tree, and the library's host directories.
std::vector<std::string> host_paths();

}  // namespace clitest
