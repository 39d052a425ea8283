// The host's handling of a guest agent's frames (backends/microvm, wire/guest_protocol.hpp):
// everything from the guest is untrusted. A hostile guest (its kernel taken over) can send
// any frame; the channel must refuse names that leave the output dir, sizes that differ from
// what was declared, more files or bytes than the caps, frames out of order — and write
// nothing outside the output dir, keeping no partial file.
#include <fcntl.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <vector>

#include "backends/microvm/microvm_backend.hpp"
#include "protocol/text_util.hpp"
#include "wire/guest_protocol.hpp"

namespace {

namespace fs = std::filesystem;
namespace ip = sandbox::detail::init_protocol;
namespace gp = sandbox::detail::guest_protocol;

ip::init_header hdr(gp::msg t, std::uint32_t a = 0, std::int64_t b = 0) {
  return {static_cast<ip::msg>(static_cast<std::uint32_t>(t)), a, b};
}

struct fixture {
  fs::path root, out;
  int dir = -1;
  std::unique_ptr<sandbox::detail::agent_channel> ch;
  explicit fixture(sandbox::detail::guest_output_limits l = {.max_files = 4, .max_bytes = 100}) {
    char tmpl[] = "/tmp/mvchan-XXXXXX";
    root = mkdtemp(tmpl);
    out = root / "out";
    fs::create_directory(out);
    dir = ::open(out.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    ch = sandbox::detail::make_guest_channel(dir, l, "memory_bytes=1\0");
  }
  ~fixture() {
    ch.reset();
    ::close(dir);
    fs::remove_all(root);
  }
  std::string send(gp::msg t, std::uint32_t a = 0, std::int64_t b = 0, std::string_view p = {}) {
    return ch->on_frame(hdr(t, a, b), p);
  }
  void ready() { REQUIRE(send(gp::msg::agent_ready, gp::version).empty()); }
  // Everything under root, relative: only out/ and what the channel accepted may exist.
  std::set<std::string> tree() const {
    std::set<std::string> s;
    for (const auto& e : fs::recursive_directory_iterator(root))
      s.insert(fs::relative(e.path(), root).string());
    return s;
  }
};

/// A usage report the channel accepts: the stream counts are required.
std::string_view valid_usage() {
  return std::string_view("cpu_usec=1\0stdout_bytes=0\0stderr_bytes=0\0", 41);
}

}  // namespace

TEST_CASE("guest channel: a well-formed output file is written within the caps", "[microvm]") {
  fixture f;
  f.ready();
  CHECK(f.send(gp::msg::file_open, 0600, 5, "a.txt").empty());
  CHECK(f.send(gp::msg::file_data, 0, 0, "he").empty());
  CHECK(f.send(gp::msg::file_data, 0, 0, "llo").empty());
  CHECK(f.send(gp::msg::file_close).empty());
  CHECK(f.send(gp::msg::usage, 0, 0,
               std::string_view("memory_peak_bytes=123\0cpu_usec=456\0oom_kills=1\0"
                                "stdout_bytes=18446744073709551615\0stderr_bytes=7\0",
                                47 + 34 + 15))
            .empty());
  REQUIRE(f.ch->usage());
  CHECK(f.ch->usage()->memory_peak_bytes == 123);
  CHECK(f.ch->usage()->cpu_usec == 456);
  CHECK(f.ch->usage()->oom_kills == 1);
  CHECK(f.ch->usage()->stdout_bytes == 18446744073709551615ULL);
  CHECK(f.ch->usage()->stderr_bytes == 7);
  std::ifstream in(f.out / "a.txt");
  std::string content((std::istreambuf_iterator<char>(in)), {});
  CHECK(content == "hello");
  CHECK(f.tree() == std::set<std::string>{"out", "out/a.txt"});
}

TEST_CASE("guest channel: hostile output names are refused and nothing is written", "[microvm]") {
  const std::vector<std::string> names = {
      "../x", "..", ".", "", "a/b", "/etc/x", std::string("a\0b", 3), std::string(256, 'n')};
  for (const auto& name : names) {
    fixture f;
    f.ready();
    auto why = f.send(gp::msg::file_open, 0600, 1, name);
    CAPTURE(name);
    CHECK_FALSE(why.empty());
    CHECK(f.tree() == std::set<std::string>{"out"});
    // Once refused, the channel takes nothing more from this guest.
    CHECK_FALSE(f.send(gp::msg::file_open, 0600, 1, "ok.txt").empty());
    CHECK(f.tree() == std::set<std::string>{"out"});
  }
}

TEST_CASE("guest channel: an existing name or symlink is never written through", "[microvm]") {
  fixture f;
  f.ready();
  // A symlink in the output dir pointing outside (the host made nothing like it, but the
  // channel must not rely on that): O_CREAT|O_EXCL|O_NOFOLLOW refuses it.
  fs::create_symlink(f.root / "outside", f.out / "link");
  CHECK_FALSE(f.send(gp::msg::file_open, 0600, 1, "link").empty());
  CHECK_FALSE(fs::exists(f.root / "outside"));
}

TEST_CASE("guest channel: sizes must match what was declared", "[microvm]") {
  SECTION("longer") {
    fixture f;
    f.ready();
    REQUIRE(f.send(gp::msg::file_open, 0600, 3, "a").empty());
    CHECK_FALSE(f.send(gp::msg::file_data, 0, 0, "abcd").empty());
    CHECK(f.tree() == std::set<std::string>{"out"});  // the partial file is removed
  }
  SECTION("shorter") {
    fixture f;
    f.ready();
    REQUIRE(f.send(gp::msg::file_open, 0600, 3, "a").empty());
    REQUIRE(f.send(gp::msg::file_data, 0, 0, "ab").empty());
    CHECK_FALSE(f.send(gp::msg::file_close).empty());
    CHECK(f.tree() == std::set<std::string>{"out"});
  }
  SECTION("negative") {
    fixture f;
    f.ready();
    CHECK_FALSE(f.send(gp::msg::file_open, 0600, -1, "a").empty());
  }
  SECTION("bad mode") {
    fixture f;
    f.ready();
    CHECK_FALSE(f.send(gp::msg::file_open, 04755, 1, "a").empty());
  }
}

TEST_CASE("guest channel: more files or bytes than the caps are refused", "[microvm]") {
  SECTION("count") {
    fixture f({.max_files = 2, .max_bytes = 100});
    f.ready();
    for (const char* n : {"a", "b"}) {
      REQUIRE(f.send(gp::msg::file_open, 0600, 1, n).empty());
      REQUIRE(f.send(gp::msg::file_data, 0, 0, "x").empty());
      REQUIRE(f.send(gp::msg::file_close).empty());
    }
    CHECK_FALSE(f.send(gp::msg::file_open, 0600, 1, "c").empty());
    CHECK(f.tree() == std::set<std::string>{"out", "out/a", "out/b"});
  }
  SECTION("bytes, declared up front") {
    fixture f({.max_files = 4, .max_bytes = 10});
    f.ready();
    CHECK_FALSE(f.send(gp::msg::file_open, 0600, 11, "big").empty());
    CHECK(f.tree() == std::set<std::string>{"out"});
  }
  SECTION("bytes, in total") {
    fixture f({.max_files = 4, .max_bytes = 10});
    f.ready();
    REQUIRE(f.send(gp::msg::file_open, 0600, 6, "a").empty());
    REQUIRE(f.send(gp::msg::file_data, 0, 0, "123456").empty());
    REQUIRE(f.send(gp::msg::file_close).empty());
    CHECK_FALSE(f.send(gp::msg::file_open, 0600, 6, "b").empty());
  }
}

TEST_CASE("guest channel: frames out of order or unknown are refused", "[microvm]") {
  SECTION("before agent_ready") {
    fixture f;
    CHECK_FALSE(f.send(gp::msg::file_open, 0600, 1, "a").empty());
  }
  SECTION("wrong protocol version") {
    fixture f;
    CHECK_FALSE(f.send(gp::msg::agent_ready, gp::version + 1).empty());
  }
  SECTION("agent_ready twice") {
    fixture f;
    f.ready();
    CHECK_FALSE(f.send(gp::msg::agent_ready, gp::version).empty());
  }
  SECTION("data without open, close without open, open while open") {
    fixture f;
    f.ready();
    CHECK_FALSE(f.send(gp::msg::file_data, 0, 0, "x").empty());
    fixture g;
    g.ready();
    CHECK_FALSE(g.send(gp::msg::file_close).empty());
    fixture h;
    h.ready();
    REQUIRE(h.send(gp::msg::file_open, 0600, 1, "a").empty());
    CHECK_FALSE(h.send(gp::msg::file_open, 0600, 1, "b").empty());
    CHECK(h.tree() == std::set<std::string>{"out"});
  }
  SECTION("a host-only message type, or an unknown one") {
    fixture f;
    f.ready();
    CHECK_FALSE(f.send(gp::msg::setup).empty());
    fixture g;
    g.ready();
    CHECK_FALSE(g.ch->on_frame({static_cast<ip::msg>(999), 0, 0}, {}).empty());
  }
  SECTION("usage without both stream counts, or with a count that is not a number") {
    for (std::string_view p :
         {std::string_view("cpu_usec=1\0", 11), std::string_view("stdout_bytes=1\0", 15),
          std::string_view("stderr_bytes=1\0", 15),
          std::string_view("stdout_bytes=1\0stderr_bytes=-1\0", 31),
          std::string_view("stdout_bytes=1\0stderr_bytes=18446744073709551616\0", 49)}) {
      fixture f;
      f.ready();
      CHECK_FALSE(f.send(gp::msg::usage, 0, 0, p).empty());
      CHECK_FALSE(f.ch->usage());
    }
  }
  SECTION("usage that is not numbers, or twice") {
    fixture f;
    f.ready();
    CHECK_FALSE(f.send(gp::msg::usage, 0, 0, std::string_view("cpu_usec=12x\0", 13)).empty());
    fixture g;
    g.ready();
    REQUIRE(g.send(gp::msg::usage, 0, 0, valid_usage()).empty());
    CHECK_FALSE(g.send(gp::msg::usage, 0, 0, valid_usage()).empty());
  }
  SECTION("the agent's own failure report ends the run") {
    fixture f;
    f.ready();
    auto why = f.send(gp::msg::agent_failed, 3, 2, "mount /dev/vda\x1b[31m");
    CHECK_FALSE(why.empty());
    CHECK(why.find('\x1b') == std::string::npos);  // guest bytes are escaped for the log
  }
}

TEST_CASE("guest channel: the staged files become file frames, setup goes first", "[microvm]") {
  fixture f;
  auto initial = f.ch->initial_frames();
  REQUIRE(initial.size() >= sizeof(std::uint32_t) + sizeof(ip::init_header));
  ip::init_header h;
  std::memcpy(&h, initial.data() + sizeof(std::uint32_t), sizeof h);
  CHECK(static_cast<std::uint32_t>(h.type) == static_cast<std::uint32_t>(gp::msg::setup));
  sandbox::detail::run_workspace ws{.dir = f.root,
                                    .inputs = f.root / "in",
                                    .source = f.root / "main.py",
                                    .staging = f.root / "root"};
  fs::create_directory(ws.inputs);
  std::ofstream(ws.source) << "print(1)";
  std::ofstream(ws.inputs / "d.bin") << std::string(300000, 'z');  // more than one frame
  auto frames = f.ch->file_frames(ws);
  REQUIRE(frames);
  // Walk the frames: source (open, data, close), then in/d.bin (open, 2 data, close).
  std::vector<std::pair<std::uint32_t, std::string>> seen;
  std::string_view rest = *frames;
  while (!rest.empty()) {
    std::uint32_t len;
    std::memcpy(&len, rest.data(), sizeof len);
    REQUIRE(len <= ip::max_packet);
    std::memcpy(&h, rest.data() + sizeof len, sizeof h);
    seen.emplace_back(static_cast<std::uint32_t>(h.type),
                      std::string(rest.substr(sizeof len + sizeof h, len - sizeof h)));
    rest.remove_prefix(sizeof len + len);
  }
  REQUIRE(seen.size() == 7);
  CHECK(seen[0] == std::pair<std::uint32_t, std::string>{103, "source"});
  CHECK(seen[1].second == "print(1)");
  CHECK(seen[3] == std::pair<std::uint32_t, std::string>{103, "in/d.bin"});
  CHECK(seen[4].second.size() + seen[5].second.size() == 300000);
  CHECK(seen[6].first == 105);
}

TEST_CASE("guest channel: entries the guest dropped are listed with their reasons", "[microvm]") {
  using sandbox::drop_reason;
  auto reason = [](gp::dropped d) { return static_cast<std::uint32_t>(d); };
  fixture f({.max_files = 1, .max_bytes = 100});
  f.ready();
  REQUIRE(f.send(gp::msg::file_dropped, reason(gp::dropped::not_regular_file), 0, "fifo").empty());
  REQUIRE(f.send(gp::msg::file_open, 0600, 1, "kept").empty());
  REQUIRE(f.send(gp::msg::file_data, 0, 0, "x").empty());
  REQUIRE(f.send(gp::msg::file_close).empty());
  REQUIRE(f.send(gp::msg::file_dropped, reason(gp::dropped::count_limit), 0, "more").empty());
  REQUIRE(f.send(gp::msg::file_dropped, reason(gp::dropped::bytes_limit), 0, "sparse").empty());
  // A bad name is bad_name whatever reason the guest gave, in its escaped display form.
  REQUIRE(
      f.send(gp::msg::file_dropped, reason(gp::dropped::count_limit), 0, "bad\x1b\xff").empty());
  REQUIRE(f.send(gp::msg::file_dropped, reason(gp::dropped::bad_name), 0, "z\u202Eexe").empty());
  std::vector<sandbox::dropped_file> want = {
      {.name_display = "fifo", .reason = drop_reason::not_regular_file},
      {.name_display = "more", .reason = drop_reason::count_limit},
      {.name_display = "sparse", .reason = drop_reason::bytes_limit},
      {.name_display = sandbox::escape_name_for_display("bad\x1b\xff"),
       .reason = drop_reason::bad_name},
      {.name_display = sandbox::escape_name_for_display("z\u202Eexe"),
       .reason = drop_reason::bad_name},
  };
  CHECK(f.ch->dropped() == want);
  CHECK(f.ch->dropped()[3].name_display.find('\x1b') == std::string::npos);
  // Nothing is written for a dropped entry.
  CHECK(f.tree() == std::set<std::string>{"out", "out/kept"});
}

TEST_CASE("guest channel: hostile file_dropped frames are refused", "[microvm]") {
  auto reason = [](gp::dropped d) { return static_cast<std::uint32_t>(d); };
  SECTION("names that are not one component") {
    for (std::string_view bad :
         {std::string_view(""), std::string_view("."), std::string_view(".."),
          std::string_view("a/b"), std::string_view("/etc"), std::string_view("a\0b", 3)}) {
      fixture f;
      f.ready();
      CHECK_FALSE(f.send(gp::msg::file_dropped, reason(gp::dropped::count_limit), 0, bad).empty());
      CHECK(f.ch->dropped().empty());
    }
    fixture g;
    g.ready();
    CHECK_FALSE(
        g.send(gp::msg::file_dropped, reason(gp::dropped::count_limit), 0, std::string(256, 'a'))
            .empty());
  }
  SECTION("a reason the agent may not give (bad_name for a plain name, the store's, unknown)") {
    for (auto r : {sandbox::drop_reason::bad_name, sandbox::drop_reason::quota_exceeded,
                   sandbox::drop_reason::store_error}) {
      fixture f;
      f.ready();
      CHECK_FALSE(f.send(gp::msg::file_dropped, static_cast<std::uint32_t>(r), 0, "a").empty());
    }
    fixture g;
    g.ready();
    CHECK_FALSE(g.send(gp::msg::file_dropped, 0xffffffffU, 0, "a").empty());
    CHECK(g.ch->dropped().empty());
  }
  SECTION("a name twice, dropped or sent") {
    fixture f;
    f.ready();
    REQUIRE(f.send(gp::msg::file_dropped, reason(gp::dropped::count_limit), 0, "a").empty());
    CHECK_FALSE(f.send(gp::msg::file_dropped, reason(gp::dropped::count_limit), 0, "a").empty());
    fixture g;
    g.ready();
    REQUIRE(g.send(gp::msg::file_open, 0600, 1, "a").empty());
    REQUIRE(g.send(gp::msg::file_data, 0, 0, "x").empty());
    REQUIRE(g.send(gp::msg::file_close).empty());
    CHECK_FALSE(g.send(gp::msg::file_dropped, reason(gp::dropped::count_limit), 0, "a").empty());
  }
  SECTION("out of order: before agent_ready, while a file is open, after usage") {
    fixture f;
    CHECK_FALSE(f.send(gp::msg::file_dropped, reason(gp::dropped::count_limit), 0, "a").empty());
    fixture g;
    g.ready();
    REQUIRE(g.send(gp::msg::file_open, 0600, 1, "a").empty());
    CHECK_FALSE(g.send(gp::msg::file_dropped, reason(gp::dropped::count_limit), 0, "b").empty());
    fixture h;
    h.ready();
    REQUIRE(h.send(gp::msg::usage, 0, 0, valid_usage()).empty());
    CHECK_FALSE(h.send(gp::msg::file_dropped, reason(gp::dropped::count_limit), 0, "b").empty());
  }
  SECTION("more than the collector's scan limit") {
    fixture f;
    f.ready();
    for (std::uint32_t i = 0; i < gp::max_dropped; ++i) {
      REQUIRE(f.send(gp::msg::file_dropped, reason(gp::dropped::count_limit), 0,
                     "n" + std::to_string(i))
                  .empty());
    }
    CHECK_FALSE(f.send(gp::msg::file_dropped, reason(gp::dropped::count_limit), 0, "last").empty());
    CHECK(f.ch->dropped().size() == gp::max_dropped);
  }
}

TEST_CASE("guest channel: the agent's name test is the collector's", "[microvm]") {
  // The agent drops bad names itself (so they never use up the count cap) with
  // detail::is_display_safe_name; the collector's test is "the display form is the name itself".
  for (std::string_view n :
       {std::string_view("a.txt"), std::string_view("caf\xc3\xa9"), std::string_view("a\\b"),
        std::string_view("\xff"), std::string_view("a\x7f"), std::string_view("a\nb"),
        std::string_view("\xe2\x80\xae"
                         "cod.exe"),
        std::string_view("\xc2\x85"), std::string_view("\xed\xa0\x80"),
        std::string_view("\xf0\x9f\x98\x80"),
        std::string_view("\xef\xbb\xbf"
                         "bom"),
        std::string_view("\xc0\xaf")}) {
    CAPTURE(sandbox::escape_name_for_display(n));
    CHECK(sandbox::detail::is_display_safe_name(n) == (sandbox::escape_name_for_display(n) == n));
  }
}
