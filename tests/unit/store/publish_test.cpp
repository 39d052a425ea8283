// Publishing into shared state (store/publish.hpp): many threads and many processes publish
// into one directory at once and every call gets the complete, right file; a wrong file in
// place is replaced, never used; a cleanup never removes a file someone holds.
#include "store/publish.hpp"

#include <fcntl.h>
#include <sched.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "protocol/sha256.hpp"
#include "unit/test_files.hpp"

namespace {

using namespace sandbox::detail;
using sandbox::test::read_text;
using sandbox::test::temp_dir;
using sandbox::test::write_text;
namespace fs = std::filesystem;

unique_fd open_dir(const fs::path& p) {
  unique_fd fd(::open(p.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  REQUIRE(fd);
  return fd;
}

// Every byte readable from `fd` (from offset 0).
std::string read_all(int fd) {
  std::string out;
  char buf[65536];
  for (off_t off = 0;;) {
    ssize_t n = ::pread(fd, buf, sizeof buf, off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    out.append(buf, static_cast<std::size_t>(n));
    off += n;
  }
  return out;
}

// True when `name` under `dirfd` is the file open at `fd`.
bool is_published_as(int dirfd, const std::string& name, int fd) {
  struct stat a {
  }, b{};
  return ::fstatat(dirfd, name.c_str(), &a, AT_SYMLINK_NOFOLLOW) == 0 && ::fstat(fd, &b) == 0 &&
         a.st_dev == b.st_dev && a.st_ino == b.st_ino;
}

// Round r's bytes: 1 B to ~200 KiB, different in every round.
std::string content_of(int r) {
  std::string s = "round " + std::to_string(r) + "\n";
  s.resize(static_cast<std::size_t>((r * 7919) % 200000 + 1), static_cast<char>('a' + r % 26));
  return s;
}

std::vector<std::string> temps_in(const fs::path& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) {
    auto n = e.path().filename().string();
    if (n.rfind(".tmp-", 0) == 0) out.push_back(n);
  }
  return out;
}

// Shared between the test process and the processes it forks (an anonymous shared mapping).
struct shared_state {
  static constexpr int rounds = 300;
  std::atomic<int> arrived[rounds];
  std::atomic<int> calls;
  std::atomic<int> failures;
  std::atomic_flag first_taken;
  char first_failure[256];
};
static_assert(std::atomic<int>::is_always_lock_free);

void fail(shared_state* s, const std::string& why) {
  s->failures.fetch_add(1);
  if (!s->first_taken.test_and_set()) {
    std::strncpy(s->first_failure, why.c_str(), sizeof s->first_failure - 1);
  }
}

// Waits until all `n` participants reached round `r`.
void barrier(shared_state* s, int r, int n) {
  s->arrived[r].fetch_add(1);
  for (int spins = 0; s->arrived[r].load() < n; ++spins) {
    if (spins < 2000) {
      sched_yield();
    } else {
      ::usleep(100);
    }
  }
}

// Plants something wrong under `name` before a round: truncated, corrupted (same size), the
// wrong mode, a symlink to a right copy elsewhere, or nothing (every other round).
void plant(int dirfd, const fs::path& dir, const std::string& name, int r) {
  const std::string right = content_of(r);
  auto write_as = [&](const std::string& bytes, mode_t mode) {
    int fd = ::openat(dirfd, name.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode);
    if (fd < 0) return;
    (void)!::write(fd, bytes.data(), bytes.size());
    ::fchmod(fd, mode);
    ::close(fd);
  };
  switch (r % 8) {
    case 0:
      write_as(right.substr(0, right.size() / 2), 0444);
      break;
    case 2: {
      std::string bad = right;
      bad[bad.size() / 2] ^= 1;
      write_as(bad, 0444);
      break;
    }
    case 4:
      write_as(right, 0644);
      break;
    case 6: {
      auto elsewhere = dir.parent_path() / ("outside-" + std::to_string(r));
      write_text(elsewhere, right);
      ::chmod(elsewhere.c_str(), 0444);
      (void)::symlinkat(elsewhere.c_str(), dirfd, name.c_str());
      break;
    }
    default:
      break;
  }
}

// One participant: every round, publish that round's file (holding it), read it back whole
// through the descriptor, and check that the name still refers to the held file. Even
// participants clean up before publishing (racing the others' open-then-lock), odd ones after.
void participate(shared_state* s, const fs::path& dir, int id, int n) {
  unique_fd dirfd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!dirfd) return fail(s, "open dir");
  auto candidate = [](std::string_view name) { return name.rfind("f-", 0) == 0; };
  for (int r = 0; r < shared_state::rounds; ++r) {
    const std::string name = "f-" + std::to_string(r);
    const std::string want = content_of(r);
    if (id == 0) plant(dirfd.get(), dir, name, r);
    barrier(s, r, n);
    if (id % 2 == 0) remove_unheld_at(dirfd.get(), candidate, "", store_logger{});
    auto fd = publish_file_at(dirfd.get(), name, want, {.mode = 0444, .hold = true});
    s->calls.fetch_add(1);
    if (!fd) {
      fail(s, "round " + std::to_string(r) + ": " + fd.error().message());
      continue;
    }
    if (read_all(fd->get()) != want) fail(s, "round " + std::to_string(r) + ": wrong bytes");
    if (id % 2 == 1) remove_unheld_at(dirfd.get(), candidate, "", store_logger{});
    if (!is_published_as(dirfd.get(), name, fd->get())) {
      fail(s, "round " + std::to_string(r) + ": a held file was removed or replaced");
    }
    struct stat st {};
    if (::fstat(fd->get(), &st) != 0 || (st.st_mode & 07777) != 0444) {
      fail(s, "round " + std::to_string(r) + ": wrong mode");
    }
  }
}

}  // namespace

TEST_CASE("publish: threads and processes publishing one directory at once all get the file",
          "[publish]") {
  temp_dir t;
  const fs::path dir = t.path / "shared";
  fs::create_directory(dir);
  void* mem = ::mmap(nullptr, sizeof(shared_state), PROT_READ | PROT_WRITE,
                     MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  REQUIRE(mem != MAP_FAILED);
  auto* s = new (mem) shared_state{};
  (void)sha256_hex("warm up OpenSSL before forking");
  constexpr int processes = 4, threads = 4, n = processes + threads;
  // The processes first, while this test runs no thread of its own.
  std::vector<pid_t> children;
  for (int i = 0; i < processes; ++i) {
    pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      participate(s, dir, threads + i, n);
      ::_exit(0);
    }
    children.push_back(pid);
  }
  std::vector<std::thread> pool;
  for (int i = 1; i < threads; ++i) pool.emplace_back(participate, s, dir, i, n);
  participate(s, dir, 0, n);  // participant 0 also plants the wrong files
  for (auto& th : pool) th.join();
  for (pid_t pid : children) {
    int status = 0;
    REQUIRE(::waitpid(pid, &status, 0) == pid);
    CHECK(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);
  }
  INFO(s->first_failure);
  CHECK(s->calls.load() == n * shared_state::rounds);
  CHECK(s->failures.load() == 0);
  // Nothing half-written is left behind, and the last round's file is whole.
  CHECK(temps_in(dir).empty());
  CHECK(read_text(dir / ("f-" + std::to_string(shared_state::rounds - 1))) ==
        content_of(shared_state::rounds - 1));
  ::munmap(mem, sizeof(shared_state));
}

TEST_CASE("publish: a wrong file in place is replaced, never used", "[publish]") {
  temp_dir t;
  auto dirfd = open_dir(t.path);
  const std::string right = "the helper's bytes\n" + std::string(100000, 'x');
  auto check_published = [&](const std::string& name) {
    auto fd = publish_file_at(dirfd.get(), name, right, {.mode = 0555});
    REQUIRE(fd.has_value());
    CHECK(read_all(fd->get()) == right);
    CHECK(is_published_as(dirfd.get(), name, fd->get()));
    struct stat st {};
    REQUIRE(::lstat((t.path / name).c_str(), &st) == 0);
    CHECK(S_ISREG(st.st_mode));
    CHECK((st.st_mode & 07777) == 0555);
    CHECK(read_text(t.path / name) == right);
  };
  SECTION("truncated") {
    write_text(t.path / "init", right.substr(0, 4096));
    ::chmod((t.path / "init").c_str(), 0555);
    check_published("init");
  }
  SECTION("empty") {
    write_text(t.path / "init", "");
    ::chmod((t.path / "init").c_str(), 0555);
    check_published("init");
  }
  SECTION("corrupted, same size") {
    std::string bad = right;
    bad[50000] = 'y';
    write_text(t.path / "init", bad);
    ::chmod((t.path / "init").c_str(), 0555);
    check_published("init");
  }
  SECTION("longer") {
    write_text(t.path / "init", right + "tail");
    ::chmod((t.path / "init").c_str(), 0555);
    check_published("init");
  }
  SECTION("right bytes, wrong mode") {
    write_text(t.path / "init", right);
    ::chmod((t.path / "init").c_str(), 0755);
    check_published("init");
  }
  SECTION("a symlink to the right bytes elsewhere: replaced, not followed") {
    const auto outside = t.path / "outside";
    write_text(outside, right);
    ::chmod(outside.c_str(), 0555);
    REQUIRE(::symlink(outside.c_str(), (t.path / "init").c_str()) == 0);
    check_published("init");
    CHECK(read_text(outside) == right);
  }
  SECTION("a symlink to a missing file") {
    REQUIRE(::symlink("/nonexistent/x", (t.path / "init").c_str()) == 0);
    check_published("init");
  }
  SECTION("a held wrong file is replaced too (the repairer waits, then goes ahead)") {
    write_text(t.path / "init", "bad");
    ::chmod((t.path / "init").c_str(), 0555);
    unique_fd holder(::open((t.path / "init").c_str(), O_RDONLY | O_CLOEXEC));
    REQUIRE(::flock(holder.get(), LOCK_SH) == 0);
    check_published("init");
  }
  CHECK(temps_in(t.path).empty());
}

TEST_CASE("publish: bad names, a directory in place, a filler that writes other bytes",
          "[publish]") {
  temp_dir t;
  auto dirfd = open_dir(t.path);
  for (const char* bad : {"", ".", "..", "a/b", ".tmp-x"}) {
    INFO(bad);
    auto r = publish_file_at(dirfd.get(), bad, std::string_view("x"), {});
    REQUIRE_FALSE(r.has_value());
    CHECK(r.error().value() == EINVAL);
  }
  fs::create_directory(t.path / "dir");
  auto r = publish_file_at(dirfd.get(), "dir", std::string_view("x"), {});
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().value() == EISDIR);

  const file_digest want = digest_of("meant");
  auto liar = [](int fd, const std::string&) -> sandbox::result<void> {
    if (::write(fd, "other", 5) != 5) return sys_error(errno);
    return {};
  };
  r = publish_file_at(dirfd.get(), "lied", want, liar, {});
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().value() == EBADMSG);
  CHECK(!fs::exists(t.path / "lied"));
  auto failing = [](int, const std::string&) -> sandbox::result<void> { return sys_error(ENOSPC); };
  r = publish_file_at(dirfd.get(), "failed", want, failing, {});
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().value() == ENOSPC);
  CHECK(!fs::exists(t.path / "failed"));
  CHECK(temps_in(t.path).empty());

  // install_file_at without replace never overwrites what is there.
  write_text(t.path / "taken", "first");
  auto writer = [](int fd, const std::string&) -> sandbox::result<void> {
    if (::write(fd, "second", 6) != 6) return sys_error(errno);
    return {};
  };
  auto i = install_file_at(dirfd.get(), "taken", 0444, writer, nullptr, false);
  REQUIRE_FALSE(i.has_value());
  CHECK(i.error().value() == EEXIST);
  CHECK(read_text(t.path / "taken") == "first");
  i = install_file_at(dirfd.get(), "taken", 0444, writer, nullptr, true);
  REQUIRE(i.has_value());
  CHECK(*i == digest_of("second"));
  CHECK(read_text(t.path / "taken") == "second");
  CHECK(temps_in(t.path).empty());
}

TEST_CASE("publish: open_verified_at says absent, wrong or right", "[publish]") {
  temp_dir t;
  auto dirfd = open_dir(t.path);
  const auto want = digest_of("abc");
  auto r = open_verified_at(dirfd.get(), "f", want, 0444);
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().value() == ENOENT);
  write_text(t.path / "f", "abd");
  ::chmod((t.path / "f").c_str(), 0444);
  r = open_verified_at(dirfd.get(), "f", want, 0444);
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().value() == EBADMSG);
  write_text(t.path / "g", "abc");
  ::chmod((t.path / "g").c_str(), 0444);
  CHECK(open_verified_at(dirfd.get(), "g", want, 0444).has_value());
  CHECK_FALSE(open_verified_at(dirfd.get(), "g", want, 0555).has_value());
  REQUIRE(::mkfifo((t.path / "fifo").c_str(), 0444) == 0);
  r = open_verified_at(dirfd.get(), "fifo", want, 0444);  // never blocks on a FIFO
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().value() == EBADMSG);
}

TEST_CASE("publish: remove_unheld_at removes only copies nobody holds", "[publish]") {
  temp_dir t;
  auto dirfd = open_dir(t.path);
  auto held = publish_file_at(dirfd.get(), "copy-held", std::string_view("1"), {.hold = true});
  REQUIRE(held.has_value());
  REQUIRE(publish_file_at(dirfd.get(), "copy-free", std::string_view("2"), {}).has_value());
  REQUIRE(publish_file_at(dirfd.get(), "copy-mine", std::string_view("3"), {}).has_value());
  write_text(t.path / "other", "4");
  auto candidate = [](std::string_view n) { return n.rfind("copy-", 0) == 0; };
  CHECK(remove_unheld_at(dirfd.get(), candidate, "copy-mine", store_logger{}) == 1);
  CHECK(fs::exists(t.path / "copy-held"));
  CHECK(!fs::exists(t.path / "copy-free"));
  CHECK(fs::exists(t.path / "copy-mine"));
  CHECK(fs::exists(t.path / "other"));
  // Once its holder is gone, it goes too.
  held->reset();
  CHECK(remove_unheld_at(dirfd.get(), candidate, "copy-mine", store_logger{}) == 1);
  CHECK(!fs::exists(t.path / "copy-held"));
}

TEST_CASE("publish: directories published at once by many threads, a wrong one replaced",
          "[publish]") {
  temp_dir t;
  auto dirfd = open_dir(t.path);
  // A directory is right when it holds "a" (5 bytes) and "b/c" (3 bytes).
  auto build = [](int dfd, const std::string&) -> sandbox::result<void> {
    if (auto r = replace_file_at(dfd, "a", "12345", 0444); !r) return r;
    if (::mkdirat(dfd, "b", 0755) != 0) return sys_error(errno);
    auto sub = open_dir_at(dfd, "b");
    if (!sub) return sub.error();
    return replace_file_at(sub->get(), "c", "xyz", 0444);
  };
  auto check = [](int dfd) {
    auto a = read_file_at(dfd, "a", 100);
    auto sub = open_dir_at(dfd, "b");
    if (!a || *a != "12345" || !sub) return false;
    auto c = read_file_at(sub->get(), "c", 100);
    return c && *c == "xyz";
  };
  std::atomic<int> bad{0};
  for (int round = 0; round < 40; ++round) {
    const std::string name = "root-" + std::to_string(round);
    if (round % 4 == 1) {  // a partial one in place
      fs::create_directory(t.path / name);
      write_text(t.path / name / "a", "12");
    } else if (round % 4 == 3) {  // a file in place
      write_text(t.path / name, "not a directory");
    }
    std::vector<std::thread> pool;
    for (int i = 0; i < 6; ++i) {
      pool.emplace_back([&] {
        auto d = publish_dir_at(dirfd.get(), name, 0755, build, check);
        if (!d || !check(d->get()) || !is_published_as(dirfd.get(), name, d->get())) ++bad;
      });
    }
    for (auto& th : pool) th.join();
    struct stat st {};
    REQUIRE(::stat((t.path / name).c_str(), &st) == 0);
    CHECK(S_ISDIR(st.st_mode));
    CHECK((st.st_mode & 07777) == 0755);
  }
  CHECK(bad.load() == 0);
  CHECK(temps_in(t.path).empty());
}
