// Replays fuzz inputs through LLVMFuzzerTestOneInput without libFuzzer, so the corpus runs as
// an ordinary test under g++ (the pattern of fmt's test/fuzzing/main.cc).
//
//   sandbox_fuzz_protocol <file-or-directory>...
//
// Directories are walked recursively; files run in sorted order. Exits 1 when an argument
// cannot be read or when no input at all was found (so an empty or missing corpus fails the
// test instead of passing silently). A failing input aborts inside the fuzz target.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <system_error>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size);

namespace fs = std::filesystem;

namespace {

bool run_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    std::fprintf(stderr, "cannot read %s\n", path.c_str());
    return false;
  }
  const std::vector<char> bytes((std::istreambuf_iterator<char>(in)),
                                std::istreambuf_iterator<char>());
  LLVMFuzzerTestOneInput(reinterpret_cast<const std::uint8_t*>(bytes.data()), bytes.size());
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s <file-or-directory>...\n", argv[0]);
    return 1;
  }
  std::size_t ran = 0;
  bool ok = true;
  for (int i = 1; i < argc; ++i) {
    const fs::path arg = argv[i];
    std::error_code ec;
    if (fs::is_directory(arg, ec)) {
      std::vector<fs::path> files;
      for (auto it = fs::recursive_directory_iterator(arg, ec);
           !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
        if (it->is_regular_file(ec)) files.push_back(it->path());
      }
      if (ec) {
        std::fprintf(stderr, "cannot list %s: %s\n", arg.c_str(), ec.message().c_str());
        ok = false;
      }
      std::sort(files.begin(), files.end());
      for (const auto& f : files) {
        if (run_file(f)) {
          ++ran;
        } else {
          ok = false;
        }
      }
    } else if (fs::is_regular_file(arg, ec)) {
      if (run_file(arg)) {
        ++ran;
      } else {
        ok = false;
      }
    } else {
      std::fprintf(stderr, "no such file or directory: %s\n", arg.c_str());
      ok = false;
    }
  }
  std::printf("ran %zu inputs\n", ran);
  if (ran == 0) {
    std::fprintf(stderr, "no inputs found\n");
    return 1;
  }
  return ok ? 0 : 1;
}
