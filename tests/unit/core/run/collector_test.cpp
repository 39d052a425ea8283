// collect_outputs: only regular files come back, nothing is followed, nothing blocks, caps
// hold, names come back exactly or are escaped. Every collection runs under a watchdog, so a
// collector that blocks (on a FIFO, say) fails the test instead of hanging it.
#include "core/run/collector.hpp"

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <functional>
#include <future>
#include <map>
#include <mutex>
#include <numeric>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "sandbox/blob_store.hpp"
#include "sys/sys.hpp"
#include "unit/test_files.hpp"

using sandbox::drop_reason;
using sandbox::detail::collect_limits;
using sandbox::detail::collect_outputs;
using sandbox::detail::collected_outputs;
using sandbox::test::read_text;
using sandbox::test::temp_dir;
using sandbox::test::write_text;
namespace sys = sandbox::detail::sys;
namespace fs = std::filesystem;

namespace {

const std::string tenant = "tenant-a";

/// Records which names were opened, and lets a test act between the scan's fstatat and the
/// open (to swap an entry), or make openat2 fail.
class spy_ops : public sys::ops {
 public:
  std::vector<std::string> opened;  ///< names passed to openat/openat2 (except ".")
  int openat2_calls = 0;
  int openat2_errno = 0;  ///< when set, openat2 fails with it
  /// Called after a successful fstatat of `name` (e.g. to replace the entry).
  std::function<void(const std::string& name)> after_fstatat;

  int openat(int dirfd, const char* path, int flags, mode_t mode) noexcept override {
    if (std::string(path) != ".") opened.emplace_back(path);
    return ops::openat(dirfd, path, flags, mode);
  }
  int openat2(int dirfd, const char* path, const sys::open_how& how) noexcept override {
    ++openat2_calls;
    if (openat2_errno != 0) {
      errno = openat2_errno;
      return -1;
    }
    opened.emplace_back(path);
    return ops::openat2(dirfd, path, how);
  }
  int fstatat(int dirfd, const char* path, struct stat* st, int flags) noexcept override {
    int r = ops::fstatat(dirfd, path, st, flags);
    if (r == 0 && after_fstatat) after_fstatat(path);
    return r;
  }
};

struct run_output {
  collected_outputs out;
  std::shared_ptr<sandbox::blob_store> store;
  std::vector<std::string> log;
};

/// Runs the collector on `dir` in a worker thread (with `ops` installed there, if given).
/// If it has not finished after 60 s it is presumed blocked: every FIFO under `dir` is
/// opened for writing (which releases a blocked open or read) and the test fails.
run_output collect(const fs::path& dir, collect_limits limits = {}, sys::ops* ops = nullptr,
                   std::uint64_t quota = 1ULL << 30) {
  run_output r;
  r.store = sandbox::make_memory_blob_store(quota);
  auto lines = std::make_shared<std::vector<std::string>>();
  auto mu = std::make_shared<std::mutex>();
  sandbox::log_sink log = [lines, mu](sandbox::log_level, std::string_view l) {
    std::lock_guard lock(*mu);
    lines->emplace_back(l);
  };
  int dirfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  REQUIRE(dirfd >= 0);
  auto store = r.store;
  auto fut = std::async(std::launch::async, [=] {
    std::optional<sys::scoped_override> guard;
    if (ops != nullptr) guard.emplace(*ops);
    return collect_outputs(dirfd, limits, *store, tenant, log);
  });
  if (fut.wait_for(std::chrono::seconds(60)) != std::future_status::ready) {
    for (const auto& e : fs::directory_iterator(dir)) {
      if (e.is_fifo()) {
        int w = ::open(e.path().c_str(), O_WRONLY | O_NONBLOCK);
        if (w >= 0) ::close(w);
      }
    }
    fut.wait();
    ::close(dirfd);
    FAIL("collect_outputs blocked");
  }
  r.out = fut.get();
  ::close(dirfd);
  std::lock_guard lock(*mu);
  r.log = *lines;
  return r;
}

std::vector<std::string> names_of(const collected_outputs& o) {
  std::vector<std::string> v;
  for (const auto& f : o.files) v.push_back(f.name);
  return v;
}

std::map<std::string, drop_reason> drops_of(const collected_outputs& o) {
  std::map<std::string, drop_reason> m;
  for (const auto& d : o.dropped) m[d.name_display] = d.reason;
  return m;
}

/// Every blob the tenant has, concatenated.
std::string all_blob_bytes(const sandbox::blob_store& store) {
  std::string all;
  auto ids = store.list(tenant);
  REQUIRE(ids.has_value());
  for (const auto& id : *ids) {
    auto b = store.get(tenant, id);
    REQUIRE(b.has_value());
    all += *b;
  }
  return all;
}

void make_fifo(const fs::path& p) { REQUIRE(::mkfifo(p.c_str(), 0644) == 0); }

/// Binds a unix socket at `p`; returns its descriptor (close it after the test).
int make_socket(const fs::path& p) {
  int s = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  REQUIRE(s >= 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  const std::string path = p.string();
  REQUIRE(path.size() < sizeof addr.sun_path);
  std::copy(path.begin(), path.end(), addr.sun_path);
  REQUIRE(::bind(s, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  return s;
}

}  // namespace

TEST_CASE("collector: regular files come back by name, in byte order", "[collector]") {
  temp_dir t;
  write_text(t.path / "b.bin", std::string("\0\x01\xFF tail", 8));
  write_text(t.path / "a.txt", "hello\n");
  write_text(t.path / "empty", "");
  auto r = collect(t.path);
  CHECK(names_of(r.out) == std::vector<std::string>{"a.txt", "b.bin", "empty"});
  CHECK(r.out.dropped.empty());
  CHECK(r.out.unscanned == 0);
  REQUIRE(r.out.files.size() == 3);
  CHECK(r.out.files[0].bytes == 6);
  CHECK(r.store->get(tenant, r.out.files[0].blob).value() == "hello\n");
  CHECK(r.store->get(tenant, r.out.files[1].blob).value() == std::string("\0\x01\xFF tail", 8));
  CHECK(r.out.files[1].blob == sandbox::blob_id_of(std::string("\0\x01\xFF tail", 8)));
  CHECK(r.out.files[2].bytes == 0);
}

TEST_CASE("collector: an empty directory", "[collector]") {
  temp_dir t;
  auto r = collect(t.path);
  CHECK(r.out.files.empty());
  CHECK(r.out.dropped.empty());
  CHECK(r.out.unscanned == 0);
}

TEST_CASE("collector: count limit", "[collector]") {
  temp_dir t;
  for (char c : std::string("edcba")) write_text(t.path / std::string(1, c), "x");
  auto r = collect(t.path, collect_limits{.max_files = 3});
  CHECK(names_of(r.out) == std::vector<std::string>{"a", "b", "c"});
  CHECK(drops_of(r.out) == std::map<std::string, drop_reason>{{"d", drop_reason::count_limit},
                                                              {"e", drop_reason::count_limit}});
}

TEST_CASE("collector: bytes limit, and a later smaller file still fits", "[collector]") {
  temp_dir t;
  write_text(t.path / "a", std::string(600, 'a'));
  write_text(t.path / "b", std::string(600, 'b'));
  write_text(t.path / "c", std::string(400, 'c'));
  write_text(t.path / "d", std::string(1, 'd'));
  auto r = collect(t.path, collect_limits{.max_bytes = 1000});
  CHECK(names_of(r.out) == std::vector<std::string>{"a", "c"});
  CHECK(drops_of(r.out) == std::map<std::string, drop_reason>{{"b", drop_reason::bytes_limit},
                                                              {"d", drop_reason::bytes_limit}});
  std::uint64_t total = 0;
  for (const auto& f : r.out.files) total += f.bytes;
  CHECK(total == 1000);
}

TEST_CASE("collector: links are never followed; host bytes never leak", "[collector]") {
  temp_dir host;
  const std::string canary = "CANARY-" + std::to_string(::getpid()) + "-must-not-leak";
  write_text(host.path / "secret", canary);
  temp_dir t;
  write_text(t.path / "a.txt", "ok");
  fs::create_symlink("a.txt", t.path / "rel-link");
  fs::create_symlink(t.path / "a.txt", t.path / "abs-link");
  fs::create_symlink("/", t.path / "root-link");
  fs::create_symlink(host.path / "secret", t.path / "canary-link");
  fs::create_symlink("../../../../../../.." + (host.path / "secret").string(),
                     t.path / "dotdot-link");
  fs::create_symlink("/proc/self/root" + (host.path / "secret").string(), t.path / "magic-link");
  fs::create_symlink("dangling-target", t.path / "dangling");
  auto r = collect(t.path);
  CHECK(names_of(r.out) == std::vector<std::string>{"a.txt"});
  auto d = drops_of(r.out);
  for (const char* n : {"rel-link", "abs-link", "root-link", "canary-link", "dotdot-link",
                        "magic-link", "dangling"}) {
    CAPTURE(n);
    CHECK(d[n] == drop_reason::not_regular_file);
  }
  CHECK(d.size() == 7);
  CHECK(all_blob_bytes(*r.store).find("CANARY") == std::string::npos);
}

TEST_CASE("collector: FIFO, socket, directory and device are not opened", "[collector]") {
  temp_dir t;
  make_fifo(t.path / "fifo");
  int sock = make_socket(t.path / "sock");
  fs::create_directory(t.path / "subdir");
  write_text(t.path / "subdir" / "inner.txt", "inner");
  bool have_device = ::mknod((t.path / "null-dev").c_str(), S_IFCHR | 0666, makedev(1, 3)) == 0;
  write_text(t.path / "z.txt", "last");
  spy_ops spy;
  auto r = collect(t.path, {}, &spy);
  ::close(sock);
  CHECK(names_of(r.out) == std::vector<std::string>{"z.txt"});
  auto d = drops_of(r.out);
  CHECK(d["fifo"] == drop_reason::not_regular_file);
  CHECK(d["sock"] == drop_reason::not_regular_file);
  CHECK(d["subdir"] == drop_reason::not_regular_file);
  if (have_device) CHECK(d["null-dev"] == drop_reason::not_regular_file);
  CHECK(d.count("inner.txt") == 0);
  CHECK(spy.opened == std::vector<std::string>{"z.txt"});  // nothing else was opened
}

TEST_CASE("collector: hard links are regular files", "[collector]") {
  temp_dir t;
  write_text(t.path / "orig", "shared content");
  fs::create_hard_link(t.path / "orig", t.path / "link");
  auto r = collect(t.path);
  REQUIRE(names_of(r.out) == std::vector<std::string>{"link", "orig"});
  CHECK(r.out.files[0].blob == r.out.files[1].blob);
  CHECK(r.store->get(tenant, r.out.files[0].blob).value() == "shared content");
}

TEST_CASE("collector: a sparse 1 TiB file is dropped without being opened", "[collector]") {
  temp_dir t;
  {
    int fd = ::open((t.path / "huge").c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
    REQUIRE(fd >= 0);
    REQUIRE(::ftruncate(fd, off_t{1} << 40) == 0);
    ::close(fd);
  }
  write_text(t.path / "small", "s");
  spy_ops spy;
  auto r = collect(t.path, {}, &spy);
  CHECK(names_of(r.out) == std::vector<std::string>{"small"});
  CHECK(drops_of(r.out) == std::map<std::string, drop_reason>{{"huge", drop_reason::bytes_limit}});
  CHECK(std::find(spy.opened.begin(), spy.opened.end(), "huge") == spy.opened.end());
}

TEST_CASE("collector: names", "[collector]") {
  temp_dir t;
  const std::string rtl = "\xE2\x80\xAEtxt.exe";    // U+202E: an invisible formatting char
  const std::string combining = "e\xCC\x81-acute";  // e + U+0301
  const std::string long_name(255, 'n');
  const std::string dash = "-rf";
  const std::string nfd_cjk = "\xE4\xB8\xAD\xE6\x96\x87.txt";  // 中文
  for (const auto& n : {rtl, combining, long_name, dash, nfd_cjk}) write_text(t.path / n, n);
  write_text(t.path / "zw\xE2\x80\x8Bsp", "x");  // U+200B ZERO WIDTH SPACE
  write_text(t.path / "new\nline", "x");
  write_text(t.path / "tab\there", "x");
  write_text(t.path / "bad\xFF\xFEutf8", "x");
  write_text(t.path / "c1\xC2\x85", "x");
  write_text(t.path / "esc\x1b[31m", "x");
  auto r = collect(t.path);
  std::vector<std::string> expected = {combining, long_name, dash, nfd_cjk};
  std::sort(expected.begin(), expected.end());
  CHECK(names_of(r.out) == expected);
  for (const auto& f : r.out.files) {
    CHECK(r.store->get(tenant, f.blob).value() == f.name);  // each file holds its name
  }
  CHECK(drops_of(r.out) == std::map<std::string, drop_reason>{
                               {"new\\x0aline", drop_reason::bad_name},
                               {"tab\\x09here", drop_reason::bad_name},
                               {"bad\\xff\\xfeutf8", drop_reason::bad_name},
                               {"c1\\xc2\\x85", drop_reason::bad_name},
                               {"esc\\x1b[31m", drop_reason::bad_name},
                               {"\\xe2\\x80\\xaetxt.exe", drop_reason::bad_name},
                               {"zw\\xe2\\x80\\x8bsp", drop_reason::bad_name},
                           });
  for (const auto& d : r.out.dropped) CHECK(sandbox::is_valid_utf8(d.name_display));
}

TEST_CASE("collector: 100k entries: a bounded, deterministic scan", "[collector]") {
  temp_dir t;
  // Created in a shuffled order, so the directory's own order is not the name order.
  std::vector<int> order(100000);
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), std::mt19937(7));
  char name[16];
  for (int i : order) {
    std::snprintf(name, sizeof name, "f%06d", i);
    int fd = ::open((t.path / name).c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
    REQUIRE(fd >= 0);
    ::close(fd);
  }
  {
    INFO("default limits");
    auto r = collect(t.path);
    CHECK(r.out.unscanned == 100000 - 65536);
    REQUIRE(r.out.files.size() == 16);
    CHECK(r.out.files.front().name == "f000000");
    CHECK(r.out.files.back().name == "f000015");
    CHECK(r.out.dropped.size() == 65536 - 16);
    CHECK(r.out.dropped.back().name_display == "f065535");  // the smallest names, in order
    CHECK(r.out.dropped.back().reason == drop_reason::count_limit);
  }
  {
    INFO("a tiny scan limit");
    auto r = collect(t.path, collect_limits{.max_scan_entries = 10});
    CHECK(r.out.unscanned == 99990);
    REQUIRE(r.out.files.size() == 10);
    CHECK(r.out.files.back().name == "f000009");
  }
  {
    INFO("scan limit zero");
    auto r = collect(t.path, collect_limits{.max_scan_entries = 0});
    CHECK(r.out.unscanned == 100000);
    CHECK(r.out.files.empty());
    CHECK(r.out.dropped.empty());
  }
}

TEST_CASE("collector: a file swapped between scan and open is not read", "[collector]") {
  temp_dir host;
  const std::string canary = "CANARY-swap-" + std::to_string(::getpid());
  write_text(host.path / "secret", canary);

  for (int fallback = 0; fallback < 2; ++fallback) {
    DYNAMIC_SECTION((fallback != 0 ? "openat fallback" : "openat2")) {
      temp_dir t;
      write_text(t.path / "to-fifo", "was regular");
      write_text(t.path / "to-symlink", "was regular");
      write_text(t.path / "to-big", "small");
      write_text(t.path / "ok", "fine");
      spy_ops spy;
      if (fallback != 0) spy.openat2_errno = ENOSYS;
      spy.after_fstatat = [&](const std::string& name) {
        const fs::path p = t.path / name;
        if (name == "to-fifo") {
          // No Catch assertions here: this runs on the collector's thread.
          std::error_code ec;
          fs::remove(p, ec);
          (void)::mkfifo(p.c_str(), 0644);
        } else if (name == "to-symlink") {
          std::error_code ec;
          fs::remove(p, ec);
          fs::create_symlink(host.path / "secret", p, ec);
        } else if (name == "to-big") {
          write_text(p, std::string(5000, 'B'));
        }
      };
      auto r = collect(t.path, collect_limits{.max_bytes = 1000}, &spy);
      CHECK(fs::is_fifo(fs::symlink_status(t.path / "to-fifo")));  // the swaps happened
      CHECK(fs::is_symlink(fs::symlink_status(t.path / "to-symlink")));
      CHECK(names_of(r.out) == std::vector<std::string>{"ok"});
      CHECK(drops_of(r.out) ==
            std::map<std::string, drop_reason>{{"to-big", drop_reason::bytes_limit},
                                               {"to-fifo", drop_reason::not_regular_file},
                                               {"to-symlink", drop_reason::not_regular_file}});
      CHECK(all_blob_bytes(*r.store).find("CANARY") == std::string::npos);
      if (fallback != 0) {
        CHECK(spy.openat2_calls == 1);  // tried once, then the fallback for the rest
      } else {
        CHECK(spy.openat2_calls == 4);
      }
    }
  }
}

TEST_CASE("collector: store quota", "[collector]") {
  temp_dir t;
  write_text(t.path / "a", std::string(20, 'a'));
  write_text(t.path / "b", std::string(5, 'b'));
  auto r = collect(t.path, {}, nullptr, /*quota=*/10);
  CHECK(names_of(r.out) == std::vector<std::string>{"b"});
  CHECK(drops_of(r.out) == std::map<std::string, drop_reason>{{"a", drop_reason::quota_exceeded}});
}

namespace {
// A store whose disk is full: every put fails with io_error (not the tenant's quota).
class full_disk_store final : public sandbox::blob_store {
 public:
  sandbox::result<std::string> put(std::string_view, std::string_view) override {
    return make_error_code(sandbox::errc::io_error);
  }
  sandbox::result<std::string> put_fd(std::string_view, int, std::uint64_t) override {
    return make_error_code(sandbox::errc::io_error);
  }
  sandbox::result<std::string> get(std::string_view, std::string_view) const override {
    return make_error_code(sandbox::errc::not_found);
  }
  sandbox::result<std::uint64_t> copy_to(std::string_view, std::string_view, int,
                                         const std::string&) const override {
    return make_error_code(sandbox::errc::not_found);
  }
  sandbox::result<std::uint64_t> size(std::string_view, std::string_view) const override {
    return make_error_code(sandbox::errc::not_found);
  }
  sandbox::result<void> remove(std::string_view, std::string_view) override {
    return make_error_code(sandbox::errc::not_found);
  }
  sandbox::result<std::vector<std::string>> list(std::string_view) const override {
    return std::vector<std::string>{};
  }
  sandbox::result<std::uint64_t> usage(std::string_view) const override { return 0; }
};
}  // namespace

TEST_CASE("collector: a store failure that is not the quota is store_error, logged",
          "[collector]") {
  temp_dir t;
  write_text(t.path / "a", "data");
  int dirfd = ::open(t.path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  REQUIRE(dirfd >= 0);
  full_disk_store store;
  std::vector<std::string> lines;
  auto out = collect_outputs(dirfd, {}, store, tenant, [&](sandbox::log_level, std::string_view l) {
    lines.emplace_back(l);
  });
  ::close(dirfd);
  CHECK(out.files.empty());
  CHECK(drops_of(out) == std::map<std::string, drop_reason>{{"a", drop_reason::store_error}});
  REQUIRE(lines.size() == 1);
  CHECK(lines[0].find("blob_store::put") != std::string::npos);
}

TEST_CASE("collector: host errors are logged, the entry dropped", "[collector]") {
  temp_dir t;
  write_text(t.path / "a", "a");
  write_text(t.path / "b", "b");
  struct failing_read : spy_ops {
    int fd_of_a = -1;
    int openat2(int dirfd, const char* path, const sys::open_how& how) noexcept override {
      int fd = spy_ops::openat2(dirfd, path, how);
      if (std::string(path) == "a") fd_of_a = fd;
      return fd;
    }
    int close(int fd) noexcept override {
      if (fd == fd_of_a) fd_of_a = -1;  // the number is reused for "b"
      return ops::close(fd);
    }
    ssize_t read(int fd, void* buf, std::size_t n) noexcept override {
      if (fd == fd_of_a) {
        errno = EIO;
        return -1;
      }
      return ops::read(fd, buf, n);
    }
  } ops;
  auto r = collect(t.path, {}, &ops);
  CHECK(names_of(r.out) == std::vector<std::string>{"b"});
  CHECK(drops_of(r.out) ==
        std::map<std::string, drop_reason>{{"a", drop_reason::not_regular_file}});
  CHECK(std::any_of(r.log.begin(), r.log.end(), [](const std::string& l) {
    return l.find("read(\"a\"): ") != std::string::npos;
  }));
}

namespace {

/// Enforces the owner's permission bits the way the kernel does for a non-root owner (an
/// unprivileged host reading the program's files as their owner), so the test means the same
/// whether it runs as root or not.
struct owner_permission_ops : spy_ops {
  /// Called before fchmodat of `name` (e.g. to swap the entry for a link).
  std::function<void(const std::string& name)> before_fchmodat;
  int fchmodat_calls = 0;

  static bool lacks(int dirfd, const char* path, mode_t bit, bool dirs, bool files) {
    struct stat st {};
    if (::fstatat(dirfd, path, &st, AT_SYMLINK_NOFOLLOW) != 0) return false;
    return ((dirs && S_ISDIR(st.st_mode)) || (files && S_ISREG(st.st_mode))) &&
           (st.st_mode & bit) == 0;
  }
  int openat(int dirfd, const char* path, int flags, mode_t mode) noexcept override {
    if (lacks(dirfd, path, S_IRUSR, true, true)) {
      errno = EACCES;
      return -1;
    }
    return spy_ops::openat(dirfd, path, flags, mode);
  }
  int openat2(int dirfd, const char* path, const sys::open_how& how) noexcept override {
    if (lacks(dirfd, ".", S_IXUSR, true, false) || lacks(dirfd, path, S_IRUSR, false, true)) {
      errno = EACCES;
      return -1;
    }
    return spy_ops::openat2(dirfd, path, how);
  }
  int fstatat(int dirfd, const char* path, struct stat* st, int flags) noexcept override {
    if (lacks(dirfd, ".", S_IXUSR, true, false)) {
      errno = EACCES;
      return -1;
    }
    return spy_ops::fstatat(dirfd, path, st, flags);
  }
  int fchmodat(int dirfd, const char* path, mode_t mode, int flags) noexcept override {
    ++fchmodat_calls;
    if (before_fchmodat) before_fchmodat(path);
    return ops::fchmodat(dirfd, path, mode, flags);
  }
};

}  // namespace

TEST_CASE("collector: modes the program set neither hide nor drop its files", "[collector]") {
  temp_dir host;
  const std::string canary = "CANARY-mode-" + std::to_string(::getpid());
  write_text(host.path / "secret", canary);
  ::chmod((host.path / "secret").c_str(), 0600);
  temp_dir t;
  for (auto [name, mode] :
       {std::pair{"m000", 0000}, {"m200", 0200}, {"m444", 0444}, {"swapped", 0000}}) {
    write_text(t.path / name, name);
    REQUIRE(::chmod((t.path / name).c_str(), static_cast<mode_t>(mode)) == 0);
  }
  REQUIRE(::chmod(t.path.c_str(), 0) == 0);  // neither readable nor searchable
  owner_permission_ops ops;
  ops.before_fchmodat = [&](const std::string& name) {
    if (name != "swapped") return;
    std::error_code ec;
    fs::remove(t.path / name, ec);
    fs::create_symlink(host.path / "secret", t.path / name, ec);
  };
  auto r = collect(t.path, {}, &ops);
  ::chmod(t.path.c_str(), 0700);
  CHECK(names_of(r.out) == std::vector<std::string>{"m000", "m200", "m444"});
  for (const auto& f : r.out.files) {
    auto b = r.store->get(tenant, f.blob);
    REQUIRE(b.has_value());
    CHECK(*b == f.name);
  }
  // Swapped for a link before its mode was given back: the link is neither followed by the
  // chmod nor read.
  CHECK(drops_of(r.out) ==
        std::map<std::string, drop_reason>{{"swapped", drop_reason::not_regular_file}});
  CHECK(fs::is_symlink(fs::symlink_status(t.path / "swapped")));
  struct stat st {};
  REQUIRE(::stat((host.path / "secret").c_str(), &st) == 0);
  CHECK((st.st_mode & 07777) == 0600);
  CHECK(ops.fchmodat_calls == 3);  // m000, m200 and swapped: never m444
  CHECK(all_blob_bytes(*r.store).find("CANARY") == std::string::npos);
}
