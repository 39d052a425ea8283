// Unit tests of the process backend's host-side mechanisms that need no sandbox: the DNS
// sink's packet handling, destination classification for egress records, the uid pool,
// workspace removal, and the spawner.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <future>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "core/run/seccomp_notify.hpp"
#include "core/run/uid_pool.hpp"
#include "core/run/workspace.hpp"
#include "sys/pidfd.hpp"
#include "sys/spawn.hpp"
#include "wire/dns_sink.hpp"
#include "wire/seccomp_policy.hpp"

using namespace sandbox::detail;

namespace {

std::vector<std::uint8_t> query(std::string_view name, std::uint16_t id = 0x1234) {
  std::vector<std::uint8_t> q = {static_cast<std::uint8_t>(id >> 8),
                                 static_cast<std::uint8_t>(id),
                                 0x01,
                                 0x00,
                                 0,
                                 1,
                                 0,
                                 0,
                                 0,
                                 0,
                                 0,
                                 0};
  std::size_t start = 0;
  while (start <= name.size()) {
    auto dot = name.find('.', start);
    if (dot == std::string_view::npos) dot = name.size();
    auto label = name.substr(start, dot - start);
    if (!label.empty()) {
      q.push_back(static_cast<std::uint8_t>(label.size()));
      q.insert(q.end(), label.begin(), label.end());
    }
    start = dot + 1;
  }
  q.push_back(0);
  q.insert(q.end(), {0, 1, 0, 1});  // A, IN
  return q;
}

std::filesystem::path temp_dir() {
  char tmpl[] = "/tmp/sandbox-unit-XXXXXX";
  return mkdtemp(tmpl);
}

}  // namespace

TEST_CASE("dns sink: query name and REFUSED response", "[dns]") {
  auto q = query("example.com");
  auto name = dns_query_name(q);
  REQUIRE(name);
  CHECK(*name == "example.com");
  auto r = dns_refused_response(q);
  REQUIRE(r.size() == q.size());
  CHECK(r[0] == 0x12);
  CHECK(r[1] == 0x34);
  CHECK((r[2] & 0x80) != 0);  // a response
  CHECK((r[3] & 0x0F) == 5);  // REFUSED
  CHECK(r[6] == 0);
  CHECK(r[7] == 0);  // no answers
}

TEST_CASE("dns sink: hostile packets give nothing, never an over-read", "[dns]") {
  auto q = query("example.com");
  for (std::size_t cut = 0; cut < q.size(); ++cut) {
    std::span<const std::uint8_t> part(q.data(), cut);
    CHECK_FALSE(dns_query_name(part));
    CHECK(dns_refused_response(part).empty());
  }
  auto ptr = q;
  ptr[12] = 0xC0;  // compression pointer in a query
  CHECK_FALSE(dns_query_name(ptr));
  auto resp = q;
  resp[2] |= 0x80;  // a response, not a query
  CHECK_FALSE(dns_query_name(resp));
  std::string big(64, 'a');  // a 64-byte label is not a label
  auto bad = query(big);
  CHECK_FALSE(dns_query_name(bad));
  std::string long_name;
  for (int i = 0; i < 10; ++i) long_name += std::string(30, 'b') + ".";
  CHECK_FALSE(dns_query_name(query(long_name)));  // over 255 bytes
  auto odd = query("a\x01\xff.test");
  auto n = dns_query_name(odd);
  REQUIRE(n);
  CHECK(*n == "a\\x01\\xff.test");
}

TEST_CASE("dns sink: the run's own names resolve to loopback; nothing else does", "[dns]") {
  auto with_type = [](std::string_view name, std::uint8_t type) {
    auto q = query(name);
    q[q.size() - 3] = type;  // QTYPE low byte
    return q;
  };
  // A localhost → 127.0.0.1, one answer pointing at the question's name.
  auto q = query("localhost");
  auto r = dns_local_response(q);
  REQUIRE(r.size() == q.size() + 16);
  CHECK(r[0] == 0x12);
  CHECK(r[1] == 0x34);
  CHECK((r[2] & 0x80) != 0);  // a response
  CHECK((r[3] & 0x0F) == 0);  // NOERROR
  CHECK(r[7] == 1);           // one answer
  CHECK(std::vector<std::uint8_t>(r.end() - 4, r.end()) == std::vector<std::uint8_t>{127, 0, 0, 1});
  // AAAA → ::1; names under .localhost and any letter case too; the hostname A only.
  auto r6 = dns_local_response(with_type("Foo.LocalHost", 28));
  REQUIRE(r6.size() == query("Foo.LocalHost").size() + 28);
  CHECK(r6.back() == 1);
  CHECK(dns_local_response(query("sandbox")).size() == query("sandbox").size() + 16);
  auto host6 = dns_local_response(with_type("sandbox", 28));
  REQUIRE(!host6.empty());
  CHECK(host6[7] == 0);  // NODATA: the hostname has no IPv6 address in /etc/hosts
  auto mx = dns_local_response(with_type("localhost", 15));
  REQUIRE(!mx.empty());
  CHECK(mx[7] == 0);
  // Loopback's reverse names: PTR localhost (found by the CPython comparison: a lookup of
  // 127.0.0.1 was refused and recorded as egress, so the run ended network_disabled).
  const std::vector<std::uint8_t> localhost_name = {9,   'l', 'o', 'c', 'a', 'l',
                                                    'h', 'o', 's', 't', 0};
  std::string v6 = "1";
  for (int i = 0; i < 31; ++i) v6 += ".0";
  for (std::string rev :
       {std::string("1.0.0.127.in-addr.arpa"), std::string("9.8.7.127.IN-ADDR.ARPA"),
        std::string("255.255.255.127.in-addr.arpa"), v6 + ".ip6.arpa"}) {
    INFO(rev);
    auto ptr = dns_local_response(with_type(rev, 12));
    REQUIRE(ptr.size() == with_type(rev, 12).size() + 12 + localhost_name.size());
    CHECK(ptr[7] == 1);
    CHECK(std::vector<std::uint8_t>(ptr.end() - static_cast<std::ptrdiff_t>(localhost_name.size()),
                                    ptr.end()) == localhost_name);
    auto a = dns_local_response(with_type(rev, 1));  // no A record for a reverse name
    REQUIRE(!a.empty());
    CHECK(a[7] == 0);
  }
  // Everything else stays with the refusing, recording path.
  for (const char* other :
       {"example.com", "localhost.example.com", "notlocalhost", "sandbox.example", "localhostx",
        "xlocalhost", "1.0.0.10.in-addr.arpa", "1.0.0.128.in-addr.arpa", "0.0.127.in-addr.arpa",
        "1.0.0.0.127.in-addr.arpa", "256.0.0.127.in-addr.arpa", "01.0.0.127.in-addr.arpa",
        "x.0.0.127.in-addr.arpa", "127.in-addr.arpa",
        "2.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.ip6.arpa"}) {
    INFO(other);
    CHECK(dns_local_response(query(other)).empty());
  }
  for (std::size_t cut = 0; cut < q.size(); ++cut) {
    CHECK(dns_local_response(std::span<const std::uint8_t>(q.data(), cut)).empty());
  }
}

TEST_CASE("egress: loopback, unspecified and unix destinations stay local", "[egress]") {
  sockaddr_in in{};
  in.sin_family = AF_INET;
  inet_pton(AF_INET, "127.0.0.53", &in.sin_addr);
  CHECK(is_local_destination(&in, sizeof in));
  inet_pton(AF_INET, "0.0.0.0", &in.sin_addr);
  CHECK(is_local_destination(&in, sizeof in));
  for (const char* external : {"1.1.1.1", "169.254.169.254", "10.0.0.1", "128.0.0.1"}) {
    inet_pton(AF_INET, external, &in.sin_addr);
    CHECK_FALSE(is_local_destination(&in, sizeof in));
  }
  sockaddr_in6 in6{};
  in6.sin6_family = AF_INET6;
  inet_pton(AF_INET6, "::1", &in6.sin6_addr);
  CHECK(is_local_destination(&in6, sizeof in6));
  inet_pton(AF_INET6, "::ffff:127.0.0.1", &in6.sin6_addr);
  CHECK(is_local_destination(&in6, sizeof in6));
  inet_pton(AF_INET6, "::ffff:1.1.1.1", &in6.sin6_addr);
  CHECK_FALSE(is_local_destination(&in6, sizeof in6));
  inet_pton(AF_INET6, "2606:4700::1111", &in6.sin6_addr);
  CHECK_FALSE(is_local_destination(&in6, sizeof in6));
  inet_pton(AF_INET6, "fd00::1", &in6.sin6_addr);
  CHECK_FALSE(is_local_destination(&in6, sizeof in6));
  sockaddr_un un{};
  un.sun_family = AF_UNIX;
  CHECK(is_local_destination(&un, sizeof un));
  // The kernel accepts IPv6 destinations of 24 bytes (RFC 2133, no scope id): so do we.
  CHECK_FALSE(is_local_destination(&in6, 24));
  CHECK(is_local_destination(&in6, 23));  // EINVAL in the kernel: nothing is sent
  inet_pton(AF_INET6, "::1", &in6.sin6_addr);
  CHECK(is_local_destination(&in6, 24));
}

TEST_CASE("uid pool: distinct uids, exhaustion, release, and a second process's locks",
          "[uid_pool]") {
  auto dir = temp_dir();
  auto pool = uid_pool::open(dir / "uids.lock", 500000, 3);
  REQUIRE(pool.has_value());
  auto a = (*pool)->acquire();
  auto b = (*pool)->acquire();
  auto c = (*pool)->acquire();
  REQUIRE(a.has_value());
  REQUIRE(b.has_value());
  REQUIRE(c.has_value());
  CHECK(*a != *b);
  CHECK(*b != *c);
  CHECK(*a >= 500000);
  CHECK(*c < 500003);
  CHECK_FALSE((*pool)->acquire().has_value());
  (*pool)->release(*b);
  auto d = (*pool)->acquire();
  REQUIRE(d.has_value());
  CHECK(*d == *b);
  // Another open file description (as another process would have) sees them as taken.
  auto other = uid_pool::open(dir / "uids.lock", 500000, 3);
  REQUIRE(other.has_value());
  CHECK_FALSE((*other)->acquire().has_value());
  (*pool)->release(*a);
  auto e = (*other)->acquire();
  REQUIRE(e.has_value());
  CHECK(*e == *a);
  CHECK_FALSE(uid_pool::open(dir / "x.lock", 0, 10).has_value());
  CHECK(uid_pool::open(dir / "no-such-dir" / "u.lock", 500000, 3).error().value() == ENOENT);
  CHECK_FALSE(uid_pool::open(dir / "y.lock", 0xFFFFFFF0u, 100).has_value());
  std::filesystem::remove_all(dir);
}

TEST_CASE("uid pool: overlapping ranges over the host's lock file never share a uid",
          "[uid_pool]") {
  // Two runtimes of one host (other state dirs, other bases) reserve through the same file:
  // a uid is byte `uid` of it, so a uid in both ranges is taken once.
  auto dir = temp_dir();
  auto low = uid_pool::open(dir / "uids.lock", 600000, 4);   // 600000..600003
  auto high = uid_pool::open(dir / "uids.lock", 600002, 4);  // 600002..600005
  REQUIRE(low.has_value());
  REQUIRE(high.has_value());
  std::set<std::uint32_t> seen;
  for (int i = 0; i < 4; ++i) {
    auto u = (*low)->acquire();
    REQUIRE(u.has_value());
    CHECK(seen.insert(*u).second);
  }
  // 600002 and 600003 are the low pool's: the high one gets only its other two.
  for (int i = 0; i < 2; ++i) {
    auto u = (*high)->acquire();
    REQUIRE(u.has_value());
    CHECK(seen.insert(*u).second);
    CHECK(*u >= 600004);
  }
  CHECK_FALSE((*high)->acquire().has_value());
  (*low)->release(600003);
  auto freed = (*high)->acquire();
  REQUIRE(freed.has_value());
  CHECK(*freed == 600003);
  std::filesystem::remove_all(dir);
}

TEST_CASE("workspace: remove_tree never follows a symlink out", "[workspace]") {
  auto dir = temp_dir();
  auto outside = dir / "outside";
  std::filesystem::create_directories(outside);
  {
    std::FILE* f = std::fopen((outside / "canary").c_str(), "w");
    std::fputs("keep", f);
    std::fclose(f);
  }
  auto tree = dir / "tree";
  std::filesystem::create_directories(tree / "a" / "b");
  std::filesystem::create_symlink(outside, tree / "a" / "link");
  std::filesystem::create_symlink(outside / "canary", tree / "a" / "b" / "file-link");
  chmod((tree / "a").c_str(), 0555);
  remove_tree(tree);
  CHECK_FALSE(std::filesystem::exists(tree));
  CHECK(std::filesystem::exists(outside / "canary"));
  std::filesystem::remove_all(dir);
}

TEST_CASE("spawn: fds 0-3 in place, nothing else inherited, empty environment", "[spawn]") {
  int out[2];
  REQUIRE(pipe2(out, O_CLOEXEC) == 0);
  int leak = open("/dev/null", O_RDONLY);  // not CLOEXEC: must still not be inherited
  int exec_fd = open("/bin/sh", O_PATH | O_CLOEXEC);
  REQUIRE(exec_fd >= 0);
  int devnull = open("/dev/null", O_RDWR | O_CLOEXEC);
  spawn_request req;
  req.exec_fd = exec_fd;
  req.argv = {"sh", "-c", "ls /proc/self/fd | tr '\\n' ' '; echo; env | wc -l"};
  req.fd0 = devnull;
  req.fd1 = out[1];
  req.fd2 = devnull;
  req.fd3 = devnull;
  auto sp = spawn_process(req);
  REQUIRE(sp.has_value());
  close(out[1]);
  std::string text;
  char buf[256];
  ssize_t n;
  while ((n = read(out[0], buf, sizeof buf)) > 0) text.append(buf, static_cast<std::size_t>(n));
  siginfo_t si{};
  sandbox::detail::waitid_pidfd(sp->pidfd, &si, WEXITED);
  close(sp->pidfd);
  close(out[0]);
  close(leak);
  close(exec_fd);
  close(devnull);
  // 0 1 2 3 and the fd `ls` itself opened; then PWD (and SHLVL) that sh sets itself.
  CHECK(text.rfind("0 1 2 3 4 \n", 0) == 0);
  auto lines = std::stoi(text.substr(text.find('\n') + 1));
  CHECK(lines <= 3);
}

TEST_CASE("spawn: a missing executable is an error, not a child", "[spawn]") {
  spawn_request req;
  req.exec_fd = 9999;  // not open
  req.argv = {"x"};
  int devnull = open("/dev/null", O_RDWR | O_CLOEXEC);
  req.fd0 = req.fd1 = req.fd2 = req.fd3 = devnull;
  auto sp = spawn_process(req);
  CHECK_FALSE(sp.has_value());
  close(devnull);
}

TEST_CASE("seccomp notify: a listener whose filter users are all gone never blocks the host",
          "[notify]") {
  // The filter's only user is a thread that exits at once: the listener then polls
  // readable (hung up) with nothing pending, and a receive would wait forever (it ignores
  // O_NONBLOCK). A run whose program exits while the host is about to read must not take
  // the host's executor thread with it (seen with crun under a loaded soak).
  int listener = -1;
  std::thread t([&] {
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0) listener = load_seccomp_filter(nullptr);
  });
  t.join();
  REQUIRE(listener >= 0);
  pollfd p{listener, POLLIN, 0};
  REQUIRE(poll(&p, 1, 2000) == 1);
  CHECK((p.revents & POLLHUP) != 0);
  auto done = std::make_shared<std::promise<bool>>();
  auto result = done->get_future();
  std::thread([done, listener] {
    notify_mem_cache mem;
    done->set_value(handle_notification(listener, mem).has_value());
  }).detach();  // left behind only if the call blocks (then the test has failed anyway)
  REQUIRE(result.wait_for(std::chrono::seconds(5)) == std::future_status::ready);
  CHECK_FALSE(result.get());
  close(listener);
}
