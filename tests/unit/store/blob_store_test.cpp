// Blob stores: both implementations against the same contract, plus the filesystem store's
// own guarantees (links never followed, atomic writes, exact quota across processes).
#include "sandbox/blob_store.hpp"

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <thread>

#include "unit/store/store_test_util.hpp"

extern char** environ;

namespace {

using sandbox::errc;
using sandbox::make_error_code;
using store_test::temp_dir;
namespace fs = std::filesystem;

std::shared_ptr<sandbox::blob_store> make_store(const std::string& kind, const temp_dir& tmp,
                                                std::uint64_t quota = 1ULL << 30) {
  if (kind == "memory") return sandbox::make_memory_blob_store(quota);
  auto s = sandbox::open_fs_blob_store({.root = tmp / "store", .quota_bytes_per_tenant = quota});
  REQUIRE(s);
  return *s;
}

// A pipe holding `data` (written by a thread so large inputs do not block).
struct pipe_input {
  int read_fd = -1;
  std::thread writer;
  explicit pipe_input(std::string data) {
    int fds[2];
    REQUIRE(::pipe2(fds, O_CLOEXEC) == 0);
    read_fd = fds[0];
    writer = std::thread([fd = fds[1], d = std::move(data)] {
      // The store may stop reading early (too_large): get EPIPE, not a process-wide SIGPIPE.
      sigset_t set;
      sigemptyset(&set);
      sigaddset(&set, SIGPIPE);
      pthread_sigmask(SIG_BLOCK, &set, nullptr);
      (void)sandbox::detail::write_all(fd, d.data(), d.size());
      ::close(fd);
    });
  }
  ~pipe_input() {
    ::close(read_fd);
    writer.join();
  }
};

std::string child_env_value(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

}  // namespace

TEST_CASE("blob store: put get size list and usage", "[blob_store]") {
  temp_dir tmp;
  const std::string kind = GENERATE("memory", "fs");
  auto store = make_store(kind, tmp);
  auto id = store->put("alice", "hello");
  REQUIRE(id);
  CHECK(*id == sandbox::blob_id_of("hello"));
  CHECK(*id == "sha256:2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824");
  auto back = store->get("alice", *id);
  REQUIRE(back);
  CHECK(*back == "hello");
  CHECK(store->size("alice", *id).value() == 5);
  CHECK(store->list("alice").value() == std::vector<std::string>{*id});
  CHECK(store->usage("alice").value() == 5);

  auto empty = store->put("alice", "");
  REQUIRE(empty);
  CHECK(store->get("alice", *empty).value().empty());
  CHECK(store->list("alice").value().size() == 2);

  REQUIRE(store->remove("alice", *id));
  CHECK(store->get("alice", *id).error() == make_error_code(errc::not_found));
  CHECK(store->remove("alice", *id).error() == make_error_code(errc::not_found));
  CHECK(store->usage("alice").value() == 0);
  CHECK(store->list("nobody").value().empty());
  CHECK(store->usage("nobody").value() == 0);
}

TEST_CASE("blob store: same content twice is stored once", "[blob_store]") {
  temp_dir tmp;
  const std::string kind = GENERATE("memory", "fs");
  auto store = make_store(kind, tmp, 10);
  auto a = store->put("t1", "0123456789");
  auto b = store->put("t1", "0123456789");  // would exceed the quota if counted twice
  REQUIRE(a);
  REQUIRE(b);
  CHECK(*a == *b);
  CHECK(store->usage("t1").value() == 10);
  CHECK(store->list("t1").value().size() == 1);
}

TEST_CASE("blob store: quota is per tenant and exact", "[blob_store]") {
  temp_dir tmp;
  const std::string kind = GENERATE("memory", "fs");
  auto store = make_store(kind, tmp, 100);
  REQUIRE(store->put("a", std::string(60, 'x')));
  CHECK(store->put("a", std::string(41, 'y')).error() == make_error_code(errc::quota_exceeded));
  CHECK(store->put("a", std::string(40, 'y')));  // exactly at the quota
  CHECK(store->usage("a").value() == 100);
  CHECK(store->put("a", "z").error() == make_error_code(errc::quota_exceeded));
  CHECK(store->put("b", std::string(100, 'x')));  // another tenant has its own quota
  CHECK(store->put("c", std::string(101, 'x')).error() == make_error_code(errc::quota_exceeded));
  REQUIRE(store->remove("a", sandbox::blob_id_of(std::string(60, 'x'))));
  CHECK(store->put("a", std::string(41, 'y')));
  CHECK(store->usage("a").value() == 81);
}

TEST_CASE("blob store: tenants cannot see each other's blobs", "[blob_store]") {
  temp_dir tmp;
  const std::string kind = GENERATE("memory", "fs");
  auto store = make_store(kind, tmp);
  auto id = store->put("alice", "secret");
  REQUIRE(id);
  const std::string missing = sandbox::blob_id_of("never stored");
  // Another tenant's blob and a blob nobody stored answer exactly alike.
  auto other = store->get("bob", *id);
  auto absent = store->get("bob", missing);
  REQUIRE_FALSE(other);
  REQUIRE_FALSE(absent);
  CHECK(other.error() == make_error_code(errc::not_found));
  CHECK(other.error() == absent.error());
  CHECK(store->size("bob", *id).error() == store->size("bob", missing).error());
  CHECK(store->remove("bob", *id).error() == make_error_code(errc::not_found));
  temp_dir out;
  int dfd = ::open(out.path().c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  REQUIRE(dfd >= 0);
  CHECK(store->copy_to("bob", *id, dfd, "x").error() == make_error_code(errc::not_found));
  ::close(dfd);
  CHECK(store->list("bob").value().empty());
  CHECK(store->get("alice", *id).value() == "secret");  // untouched by bob's remove
}

TEST_CASE("blob store: malformed tenants and ids are invalid_argument", "[blob_store]") {
  temp_dir tmp;
  const std::string kind = GENERATE("memory", "fs");
  auto store = make_store(kind, tmp);
  const auto invalid = make_error_code(errc::invalid_argument);
  const std::string good_id = sandbox::blob_id_of("x");
  for (const std::string& tenant :
       std::vector<std::string>{"", "..", ".hidden", "a/b", "../etc", "a b", std::string(65, 'a'),
                                std::string("a\0b", 3), "-dash"}) {
    INFO("tenant " << tenant);
    CHECK(store->put(tenant, "x").error() == invalid);
    CHECK(store->get(tenant, good_id).error() == invalid);
    CHECK(store->size(tenant, good_id).error() == invalid);
    CHECK(store->remove(tenant, good_id).error() == invalid);
    CHECK(store->list(tenant).error() == invalid);
    CHECK(store->usage(tenant).error() == invalid);
  }
  for (const std::string& id : std::vector<std::string>{
           std::string(""), std::string("sha256:"), good_id.substr(0, 70),
           "sha256:" + std::string(64, 'A'), "sha512:" + good_id.substr(7), good_id.substr(7),
           "sha256:../../../../../../../../etc/passwd", good_id + "0"}) {
    INFO("id " << id);
    CHECK(store->get("alice", id).error() == invalid);
    CHECK(store->size("alice", id).error() == invalid);
    CHECK(store->remove("alice", id).error() == invalid);
  }
  if (kind == "fs") {
    // Nothing was created for the bad tenants.
    auto names = store_test::entries(tmp / "store/tenants");
    CHECK(names.empty());
  }
}

TEST_CASE("blob store: put_fd reads to EOF and refuses more than max_bytes", "[blob_store]") {
  temp_dir tmp;
  const std::string kind = GENERATE("memory", "fs");
  auto store = make_store(kind, tmp, 10 << 20);
  const std::string big(3 << 20, 'q');  // several reads
  {
    pipe_input in(big);
    auto id = store->put_fd("t", in.read_fd, big.size());
    REQUIRE(id);
    CHECK(*id == sandbox::blob_id_of(big));
    CHECK(store->get("t", *id).value() == big);
  }
  {
    pipe_input in(big + "!");
    CHECK(store->put_fd("t", in.read_fd, big.size()).error() == make_error_code(errc::too_large));
  }
  {
    pipe_input in(std::string(11 << 20, 'r'));  // over the quota, under max_bytes
    CHECK(store->put_fd("t", in.read_fd, 64 << 20).error() ==
          make_error_code(errc::quota_exceeded));
  }
  CHECK(store->list("t").value().size() == 1);
  CHECK(store->usage("t").value() == big.size());
  CHECK(store->put_fd("t", -1, 10).error() == make_error_code(errc::invalid_argument));
  if (kind == "fs") {
    // No temp files left behind by the refused writes.
    for (const auto& n : store_test::entries(tmp / "store/tenants/t")) {
      CHECK((n == ".lock" || n.size() == 64));
    }
  }
}

TEST_CASE("blob store: copy_to creates a new 0444 file and never follows links", "[blob_store]") {
  temp_dir tmp;
  temp_dir out;
  const std::string kind = GENERATE("memory", "fs");
  auto store = make_store(kind, tmp);
  auto id = store->put("t", "payload");
  REQUIRE(id);
  int dfd = ::open(out.path().c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  REQUIRE(dfd >= 0);
  auto n = store->copy_to("t", *id, dfd, "in.txt");
  REQUIRE(n);
  CHECK(*n == 7);
  CHECK(store_test::read_file(out / "in.txt") == "payload");
  struct stat st {};
  REQUIRE(::stat((out / "in.txt").c_str(), &st) == 0);
  CHECK((st.st_mode & 07777) == 0444);
  CHECK(store->copy_to("t", *id, dfd, "in.txt").error() == make_error_code(errc::already_exists));
  // A planted symlink is an existing name: refused, and its target is not created.
  const fs::path target = tmp / "link-target";
  REQUIRE(::symlink(target.c_str(), (out / "link").c_str()) == 0);
  CHECK(store->copy_to("t", *id, dfd, "link").error() == make_error_code(errc::already_exists));
  CHECK_FALSE(fs::exists(target));
  for (const std::string& bad :
       std::vector<std::string>{"", ".", "..", "a/b", "../x", std::string(256, 'n')}) {
    CHECK(store->copy_to("t", *id, dfd, bad).error() == make_error_code(errc::invalid_argument));
  }
  CHECK(store->copy_to("t", *id, -1, "x").error() == make_error_code(errc::invalid_argument));
  ::close(dfd);
}

TEST_CASE("blob store: concurrent writers from threads keep the quota exact", "[blob_store]") {
  temp_dir tmp;
  const std::string kind = GENERATE("memory", "fs");
  // Many small blobs, so measuring usage takes a while and racing writers overlap often:
  // without the tenant lock around check-and-rename this overshoots the quota.
  constexpr int kThreads = 16, kEach = 25, kSize = 10, kFit = 300;
  auto store = make_store(kind, tmp, kFit * kSize);
  std::atomic<int> ok{0}, over{0}, other{0}, ready{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      ++ready;
      while (ready < kThreads) std::this_thread::yield();
      for (int i = 0; i < kEach; ++i) {
        std::string data(kSize, 'a');
        std::snprintf(data.data(), kSize, "%02d:%03d", t, i);
        auto r = store->put("shared", data);
        if (r) {
          ++ok;
        } else if (r.error() == make_error_code(errc::quota_exceeded)) {
          ++over;
        } else {
          ++other;
        }
        // Everyone also stores one common blob: dedupe under contention.
        (void)store->put("shared", std::string(kSize, 'c'));
      }
    });
  }
  for (auto& th : threads) th.join();
  CHECK(other == 0);
  CHECK(ok + over == kThreads * kEach);
  CHECK(store->usage("shared").value() == kFit * kSize);  // every byte used, none twice
  CHECK(store->list("shared").value().size() == kFit);
}

TEST_CASE("fs blob store: a symlink planted for a tenant dir or blob is never followed",
          "[blob_store]") {
  temp_dir tmp;
  auto store = make_store("fs", tmp);
  REQUIRE(store->put("alice", "first"));  // creates tenants/
  const fs::path outside = tmp / "outside";
  fs::create_directory(outside);
  // The attacker swaps tenant "mallory"'s directory for a link to a directory of their
  // choosing, hoping the store writes (or reads) there.
  REQUIRE(::symlink(outside.c_str(), (tmp / "store/tenants/mallory").c_str()) == 0);
  auto put = store->put("mallory", "data");
  REQUIRE_FALSE(put);
  CHECK(put.error() == make_error_code(errc::io_error));
  CHECK(store_test::entries(outside).empty());
  const std::string id = sandbox::blob_id_of("planted");
  store_test::write_file(outside / id.substr(7), "planted");
  CHECK_FALSE(store->get("mallory", id).has_value());
  CHECK_FALSE(store->list("mallory").has_value());
  CHECK_FALSE(store->usage("mallory").has_value());

  // A blob name that is a link to a file with the right content is not read either.
  REQUIRE(::symlink((outside / id.substr(7)).c_str(),
                    (tmp / "store/tenants/alice" / id.substr(7)).c_str()) == 0);
  auto got = store->get("alice", id);
  REQUIRE_FALSE(got);
  CHECK(got.error() == make_error_code(errc::io_error));
  CHECK(store->list("alice").value().size() == 1);  // the link is not a blob
  CHECK(store->usage("alice").value() == 5);

  // A store root that is itself a link is refused.
  REQUIRE(::symlink((tmp / "store").c_str(), (tmp / "root-link").c_str()) == 0);
  CHECK_FALSE(sandbox::open_fs_blob_store({.root = tmp / "root-link"}).has_value());
  CHECK(sandbox::open_fs_blob_store({.root = "relative/path"}).error() ==
        make_error_code(errc::invalid_argument));
}

TEST_CASE("fs blob store: corrupted content is detected and storing it again repairs it",
          "[blob_store]") {
  temp_dir tmp;
  temp_dir out;
  auto store = make_store("fs", tmp);
  auto id = store->put("t", "original content");
  REQUIRE(id);
  const fs::path file = tmp / "store/tenants/t" / id->substr(7);
  struct stat st {};
  REQUIRE(::stat(file.c_str(), &st) == 0);
  CHECK((st.st_mode & 07777) == 0600);
  REQUIRE(::stat((tmp / "store/tenants/t").c_str(), &st) == 0);
  CHECK((st.st_mode & 07777) == 0700);
  store_test::write_file(file, "tampered content");
  CHECK(store->get("t", *id).error() == make_error_code(errc::digest_mismatch));
  int dfd = ::open(out.path().c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  REQUIRE(dfd >= 0);
  CHECK(store->copy_to("t", *id, dfd, "f").error() == make_error_code(errc::digest_mismatch));
  CHECK_FALSE(fs::exists(out / "f"));  // no unverified copy is left behind
  REQUIRE(store->put("t", "original content"));
  CHECK(store->get("t", *id).value() == "original content");
  CHECK(store->copy_to("t", *id, dfd, "f").value() == 16);
  ::close(dfd);
}

TEST_CASE("fs blob store: temp files of dead writers are removed, live writers' kept",
          "[blob_store]") {
  temp_dir tmp;
  auto store = make_store("fs", tmp);
  REQUIRE(store->put("t", "x"));
  REQUIRE(store->put("u", "x"));
  // A writer holds its temp file's flock from its creation: one that is unlocked belongs to a
  // writer that died, however young it is (a daemon SIGKILLed a second ago).
  const fs::path stale = tmp / "store/tenants/t/.tmp-deadbeef";
  store_test::write_file(stale, std::string(1000, 's'));
  const timespec old[2] = {{1000000000, 0}, {1000000000, 0}};
  REQUIRE(::utimensat(AT_FDCWD, stale.c_str(), old, 0) == 0);
  const fs::path young = tmp / "store/tenants/t/.tmp-young";
  store_test::write_file(young, "f");
  const fs::path live = tmp / "store/tenants/t/.tmp-live";
  store_test::write_file(live, "l");
  const fs::path other = tmp / "store/tenants/u/.tmp-other";
  store_test::write_file(other, "o");
  const int held = ::open(live.c_str(), O_RDONLY | O_CLOEXEC);
  REQUIRE(held >= 0);
  REQUIRE(::flock(held, LOCK_EX | LOCK_NB) == 0);  // a live writer (its own description)
  CHECK(store->usage("t").value() == 1);           // temp files never count
  SECTION("a put removes its tenant's") {
    REQUIRE(store->put("t", "y"));
    CHECK_FALSE(fs::exists(stale));
    CHECK_FALSE(fs::exists(young));
    CHECK(fs::exists(live));
    CHECK(fs::exists(other));  // another tenant's wait for that tenant (or the next open)
  }
  SECTION("opening the store removes every tenant's, before any put") {
    auto reopened = make_store("fs", tmp);
    CHECK_FALSE(fs::exists(stale));
    CHECK_FALSE(fs::exists(young));
    CHECK_FALSE(fs::exists(other));
    CHECK(fs::exists(live));
    CHECK(reopened->get("t", *store->put("t", "x")).value() == "x");
  }
  ::close(held);
}

// Child side of the two-process test: hidden (tag starting with "."), run only when the
// parent test spawns this executable with the environment below.
TEST_CASE("blob store child writer", "[.blob_store_child]") {
  const std::string root = child_env_value("SANDBOX_TEST_BLOB_ROOT");
  const std::string who = child_env_value("SANDBOX_TEST_BLOB_WRITER");
  if (root.empty()) return;
  auto store = sandbox::open_fs_blob_store({.root = root, .quota_bytes_per_tenant = 300 * 10});
  REQUIRE(store);
  int ok = 0;
  for (int i = 0; i < 200; ++i) {
    std::string data(10, 'p');
    std::snprintf(data.data(), 10, "%s:%03d", who.c_str(), i);
    auto r = (*store)->put("shared", data);
    if (r) {
      ++ok;
    } else {
      REQUIRE(r.error() == make_error_code(errc::quota_exceeded));
    }
  }
  store_test::write_file(fs::path(root) / ("result-" + who), std::to_string(ok));
}

TEST_CASE("fs blob store: two processes writing at once keep the quota exact", "[blob_store]") {
  temp_dir tmp;
  const fs::path root = tmp / "store";
  REQUIRE(sandbox::open_fs_blob_store({.root = root}));
  char self[4096];
  ssize_t n = ::readlink("/proc/self/exe", self, sizeof self - 1);
  REQUIRE(n > 0);
  self[n] = '\0';
  std::vector<pid_t> pids;
  for (std::string who : {"p1", "p2"}) {
    std::vector<std::string> env = {"SANDBOX_TEST_BLOB_ROOT=" + root.string(),
                                    "SANDBOX_TEST_BLOB_WRITER=" + who, "PATH=/usr/bin:/bin"};
    std::vector<char*> envp;
    for (auto& e : env) envp.push_back(e.data());
    envp.push_back(nullptr);
    std::string arg = "[.blob_store_child]";
    std::string quiet = "--reporter=compact";
    char* argv[] = {self, arg.data(), quiet.data(), nullptr};
    pid_t pid = -1;
    REQUIRE(::posix_spawn(&pid, self, nullptr, nullptr, argv, envp.data()) == 0);
    pids.push_back(pid);
  }
  for (pid_t pid : pids) {
    int status = 0;
    REQUIRE(::waitpid(pid, &status, 0) == pid);
    CHECK(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);
  }
  const int one = std::stoi(store_test::read_file(root / "result-p1"));
  const int two = std::stoi(store_test::read_file(root / "result-p2"));
  CHECK(one + two == 300);  // 400 attempts, room for exactly 300
  auto store = sandbox::open_fs_blob_store({.root = root});
  REQUIRE(store);
  CHECK((*store)->usage("shared").value() == 300 * 10);
  CHECK((*store)->list("shared").value().size() == 300);
}
