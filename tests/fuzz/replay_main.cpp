// Replays fuzz inputs through LLVMFuzzerTestOneInput without libFuzzer, so the corpus runs as
// an ordinary test under g++ (the pattern of fmt's test/fuzzing/main.cc), and mutates them.
//
//   sandbox_fuzz_<target> [--mutate N] [--seed S] [--crash-dir D] <file-or-directory>...
//
// Directories are walked recursively; files run in sorted order. Exits 1 when an argument
// cannot be read or when no input at all was found (so an empty or missing corpus fails the
// test instead of passing silently). A failing input aborts inside the fuzz target.
//
// --mutate N: after the corpus, N inputs made from it by random edits (bit flips, bytes that
// matter to JSON and to line framing, insertions, deletions, duplicated ranges, and splices of
// two inputs), from the seed S (default 1): the same N and S always make the same inputs. The
// input being run when the target aborts is written to D (default: the working directory) as
// `fuzz-crash-<pid>`, and replaying that file reproduces the failure.
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <system_error>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size);

namespace fs = std::filesystem;

namespace {

using bytes = std::vector<std::uint8_t>;

// The input running now and where to save it if the target aborts (read by the handler).
const bytes* current = nullptr;
char crash_path[4096] = "fuzz-crash";

extern "C" void on_abort(int sig) {
  if (current != nullptr) {
    int fd = ::open(crash_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd >= 0) {
      (void)!::write(fd, current->data(), current->size());
      ::close(fd);
      static const char note[] = "replay_main: the failing input was saved (--crash-dir)\n";
      (void)!::write(STDERR_FILENO, note, sizeof note - 1);
    }
  }
  ::signal(sig, SIG_DFL);
  ::raise(sig);
}

void run(const bytes& input) {
  current = &input;
  LLVMFuzzerTestOneInput(input.data(), input.size());
  current = nullptr;
}

bool load(const fs::path& path, std::vector<bytes>& out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    std::fprintf(stderr, "cannot read %s\n", path.c_str());
    return false;
  }
  out.emplace_back((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return true;
}

/// One random edit of `b` (`other`: a second corpus input, for splices).
void mutate_once(bytes& b, const bytes& other, std::mt19937_64& rng) {
  static const std::uint8_t special[] = {'\n', '"',  '\\', '{',  '}',  '[', ']', ':', ',', ' ', 0,
                                         0x7F, 0x80, 0xC0, 0xE2, 0xFF, '0', '9', '-', 'e', '='};
  auto pick = [&](std::size_t n) { return n == 0 ? 0 : static_cast<std::size_t>(rng() % n); };
  switch (rng() % 7) {
    case 0:  // flip a bit
      if (!b.empty()) b[pick(b.size())] ^= static_cast<std::uint8_t>(1U << (rng() % 8));
      break;
    case 1:  // a byte that matters to JSON or framing, replacing one
      if (!b.empty()) b[pick(b.size())] = special[pick(sizeof special)];
      break;
    case 2:  // ... or inserted
      b.insert(b.begin() + static_cast<std::ptrdiff_t>(pick(b.size() + 1)),
               special[pick(sizeof special)]);
      break;
    case 3: {  // delete a range
      if (b.empty()) break;
      const std::size_t at = pick(b.size());
      const std::size_t n = 1 + pick(std::min<std::size_t>(b.size() - at, 64));
      b.erase(b.begin() + static_cast<std::ptrdiff_t>(at),
              b.begin() + static_cast<std::ptrdiff_t>(at + n));
      break;
    }
    case 4: {  // duplicate a range in place
      if (b.empty() || b.size() > (1U << 20)) break;
      const std::size_t at = pick(b.size());
      const std::size_t n = 1 + pick(std::min<std::size_t>(b.size() - at, 256));
      const bytes range(b.begin() + static_cast<std::ptrdiff_t>(at),
                        b.begin() + static_cast<std::ptrdiff_t>(at + n));
      b.insert(b.begin() + static_cast<std::ptrdiff_t>(pick(b.size() + 1)), range.begin(),
               range.end());
      break;
    }
    case 5: {  // splice: a range of another input inserted
      if (other.empty()) break;
      const std::size_t at = pick(other.size());
      const std::size_t n = 1 + pick(std::min<std::size_t>(other.size() - at, 256));
      b.insert(b.begin() + static_cast<std::ptrdiff_t>(pick(b.size() + 1)),
               other.begin() + static_cast<std::ptrdiff_t>(at),
               other.begin() + static_cast<std::ptrdiff_t>(at + n));
      break;
    }
    default:  // cut the end off
      if (!b.empty()) b.resize(pick(b.size()));
      break;
  }
}

bool parse_count(const char* text, unsigned long long& out) {
  char* end = nullptr;
  errno = 0;
  out = std::strtoull(text, &end, 10);
  return errno == 0 && end != text && *end == '\0' && text[0] != '-';
}

}  // namespace

int main(int argc, char** argv) {
  unsigned long long mutations = 0, seed = 1;
  std::string crash_dir = ".";
  std::vector<fs::path> args;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if ((a == "--mutate" || a == "--seed" || a == "--crash-dir") && i + 1 < argc) {
      const char* v = argv[++i];
      if (a == "--crash-dir") {
        crash_dir = v;
      } else if (!parse_count(v, a == "--mutate" ? mutations : seed)) {
        std::fprintf(stderr, "%s: not a count: %s\n", a.c_str(), v);
        return 1;
      }
    } else if (a.starts_with("--")) {
      std::fprintf(stderr, "unknown option %s\n", a.c_str());
      return 1;
    } else {
      args.emplace_back(a);
    }
  }
  if (args.empty()) {
    std::fprintf(stderr,
                 "usage: %s [--mutate N] [--seed S] [--crash-dir D] <file-or-directory>...\n",
                 argv[0]);
    return 1;
  }
  std::snprintf(crash_path, sizeof crash_path, "%s/fuzz-crash-%d", crash_dir.c_str(),
                static_cast<int>(::getpid()));
  ::signal(SIGABRT, on_abort);

  std::vector<bytes> corpus;
  bool ok = true;
  for (const auto& arg : args) {
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
      for (const auto& f : files) ok = load(f, corpus) && ok;
    } else if (fs::is_regular_file(arg, ec)) {
      ok = load(arg, corpus) && ok;
    } else {
      std::fprintf(stderr, "no such file or directory: %s\n", arg.c_str());
      ok = false;
    }
  }
  for (const auto& input : corpus) run(input);
  std::printf("ran %zu inputs\n", corpus.size());
  if (corpus.empty()) {
    std::fprintf(stderr, "no inputs found\n");
    return 1;
  }
  std::mt19937_64 rng(seed);
  for (unsigned long long i = 0; i < mutations; ++i) {
    bytes b = corpus[rng() % corpus.size()];
    const bytes& other = corpus[rng() % corpus.size()];
    for (unsigned n = 1 + static_cast<unsigned>(rng() % 4); n > 0; --n) mutate_once(b, other, rng);
    run(b);
  }
  if (mutations > 0) std::printf("ran %llu mutated inputs (seed %llu)\n", mutations, seed);
  return ok ? 0 : 1;
}
