// The start-up self-test's verdict cache (core/run/self_test_cache.hpp): a recorded pass is
// reused only under exactly the key it was recorded with — every part and every file's
// content — and only from a record that can be trusted; anything else means testing again.
#include "core/run/self_test_cache.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <string>

#include "unit/test_files.hpp"

using sandbox::detail::host_key_parts;
using sandbox::detail::self_test_cache;
using sandbox::detail::self_test_key;
namespace fs = std::filesystem;

namespace {

using sandbox::test::read_text;
using sandbox::test::write_text;

bool has(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

/// A key as the run machine builds one, with two files it depends on.
self_test_key key_with(const fs::path& a, const fs::path& b) {
  self_test_key k{.parts = host_key_parts(), .files = {a, b}};
  k.parts["level"] = "microvm";
  k.parts["cgroups"] = "v2 parent=/agent-sandbox root=/sys/fs/cgroup";
  k.parts["options"] = "uid_base=2100000000 uid_count=4096";
  k.parts["level_config"] = "accel=tcg";
  return k;
}

/// A level's cache in a temp dir, keyed on two files there (`a`, `b`) holding the given text.
struct level_cache {
  sandbox::test::temp_dir tmp;
  fs::path a, b;
  self_test_cache cache;
  self_test_key key;
  level_cache(const std::string& level, const std::string& a_name, const std::string& a_text,
              const std::string& b_name, const std::string& b_text)
      : a(tmp.path / a_name),
        b(tmp.path / b_name),
        cache(tmp.path / "selftest", level, ::geteuid()),
        key(key_with(a, b)) {
    write_text(a, a_text);
    write_text(b, b_text);
  }
};

}  // namespace

TEST_CASE("self-test cache: the host's key parts are read, never empty", "[selftest]") {
  auto parts = host_key_parts();
  REQUIRE(parts.count("boot_id") == 1);
  REQUIRE(parts.count("host_kernel") == 1);
  REQUIRE(parts.count("build") == 1);
  CHECK(parts["boot_id"].size() == 36);  // a UUID
  CHECK(parts["boot_id"].rfind("unknown:", 0) != 0);
  CHECK(parts["host_kernel"].rfind("unknown:", 0) != 0);
  // This test program carries a GNU build id (Debian's linker adds one).
  CHECK(parts["build"].rfind("gnu-build-id:", 0) == 0);
  CHECK(parts["build"].size() > 13 + 16);
  CHECK(host_key_parts() == parts);  // the same process, the same key
}

TEST_CASE("self-test cache: a pass is reused under the same key, and only then", "[selftest]") {
  level_cache f("microvm", "qemu", "vmm binary v1", "vmlinuz", "kernel image");
  const auto &a = f.a, &b = f.b;
  const auto& cache = f.cache;
  const auto& key = f.key;

  auto none = cache.lookup(key);
  CHECK_FALSE(none.reusable);
  CHECK(none.why_not == "no record");

  std::string why;
  REQUIRE(cache.record_pass(key, &why));
  struct stat st {};
  REQUIRE(::stat((f.tmp.path / "selftest").c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0700);
  REQUIRE(::stat(cache.path().c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0600);

  auto hit = cache.lookup(key);
  CHECK(hit.reusable);
  CHECK(hit.why_not.empty());
  CHECK(hit.recorded_at.size() == 20);  // 2026-12-03T08:00:00Z

  // Another level's cache in the same directory has no record.
  CHECK(self_test_cache(f.tmp.path / "selftest", "crun", ::geteuid()).lookup(key).why_not ==
        "no record");

  SECTION("each part of the key invalidates it") {
    const char* names[] = {"boot_id", "host_kernel", "build",       "level",
                           "cgroups", "options",     "level_config"};
    for (const char* name : names) {
      INFO(name);
      self_test_key other = key;
      other.parts[name] += "-different";
      auto miss = cache.lookup(other);
      CHECK_FALSE(miss.reusable);
      CHECK(has(miss.why_not, std::string("(") + name + ")"));
    }
    self_test_key extra = key;
    extra.parts["new_part"] = "x";
    CHECK_FALSE(cache.lookup(extra).reusable);
    self_test_key fewer = key;
    fewer.parts.erase("options");
    CHECK_FALSE(cache.lookup(fewer).reusable);
  }
  SECTION("a file's content invalidates it; a file touched but unchanged does not") {
    // Rewritten with other bytes of the same length: the content decides.
    write_text(a, "vmm binary v2");
    auto miss = cache.lookup(key);
    CHECK_FALSE(miss.reusable);
    CHECK(miss.why_not == a.string() + " changed");
    // Back to the recorded bytes (a new inode time): hashed again and found equal.
    write_text(a, "vmm binary v1");
    CHECK(cache.lookup(key).reusable);
    // Replaced by a copy (a new inode) with the same bytes: still the same content.
    write_text(f.tmp.path / "copy", "kernel image");
    fs::rename(f.tmp.path / "copy", b);
    CHECK(cache.lookup(key).reusable);
  }
  SECTION("a missing file, or another set of files, invalidates it") {
    fs::remove(b);
    auto miss = cache.lookup(key);
    CHECK_FALSE(miss.reusable);
    CHECK(miss.why_not == b.string() + " is missing");
    self_test_key one = key;
    one.files.pop_back();
    CHECK_FALSE(cache.lookup(one).reusable);
    self_test_key swapped = key;
    swapped.files = {a, f.tmp.path / "elsewhere"};
    write_text(f.tmp.path / "elsewhere", "kernel image");
    CHECK_FALSE(cache.lookup(swapped).reusable);
  }
}

TEST_CASE("self-test cache: a record that cannot be trusted is never reused", "[selftest]") {
  level_cache f("crun", "crun", "runtime", "init", "helper");
  const auto& a = f.a;
  const auto& cache = f.cache;
  const auto& key = f.key;
  std::string why;
  REQUIRE(cache.record_pass(key, &why));
  REQUIRE(cache.lookup(key).reusable);
  const std::string good = read_text(cache.path());

  SECTION("writable by group or others") {
    ::chmod(cache.path().c_str(), 0666);
    auto miss = cache.lookup(key);
    CHECK_FALSE(miss.reusable);
    CHECK(has(miss.why_not, "writable by group or others"));
  }
  SECTION("a directory that is not 0700: not read, and not written") {
    for (mode_t mode : {0777, 0750, 0701}) {
      INFO(mode);
      ::chmod((f.tmp.path / "selftest").c_str(), mode);
      auto miss = cache.lookup(key);
      CHECK_FALSE(miss.reusable);
      CHECK(has(miss.why_not, "is open to group or others"));
      CHECK_FALSE(cache.record_pass(key, &why));
      CHECK(has(why, "is open to group or others"));
    }
    ::chmod((f.tmp.path / "selftest").c_str(), 0700);
    CHECK(cache.lookup(key).reusable);  // the record itself was never the problem
  }
  SECTION("a directory of another owner") {
    if (::geteuid() != 0) {
      const self_test_cache theirs(f.tmp.path / "selftest", "crun", ::geteuid() + 1);
      CHECK(has(theirs.lookup(key).why_not, "belongs to uid"));
    } else {
      REQUIRE(::chown((f.tmp.path / "selftest").c_str(), 65534, 65534) == 0);
      auto miss = cache.lookup(key);
      CHECK_FALSE(miss.reusable);
      CHECK(has(miss.why_not, "selftest belongs to uid 65534"));
      CHECK_FALSE(cache.record_pass(key, &why));
    }
  }
  SECTION("a directory in a parent that others may write, or that is another user's") {
    // Whoever may write the state directory could swap in a directory of their making.
    ::chmod(f.tmp.path.c_str(), 0777);
    auto miss = cache.lookup(key);
    CHECK_FALSE(miss.reusable);
    CHECK(has(miss.why_not, f.tmp.path.string() + " is writable by group or others"));
    CHECK_FALSE(cache.record_pass(key, &why));
    CHECK(has(why, "is writable by group or others"));
    ::chmod(f.tmp.path.c_str(), 0770);
    CHECK_FALSE(cache.lookup(key).reusable);
    ::chmod(f.tmp.path.c_str(), 0700);
    CHECK(cache.lookup(key).reusable);
    if (::geteuid() == 0) {
      REQUIRE(::chown(f.tmp.path.c_str(), 65534, 65534) == 0);
      CHECK(has(cache.lookup(key).why_not, "belongs to uid 65534, not 0 or root"));
      REQUIRE(::chown(f.tmp.path.c_str(), 0, 0) == 0);
      CHECK(cache.lookup(key).reusable);
    }
  }
  SECTION("a symbolic link in place of the directory, even to a good one") {
    fs::rename(f.tmp.path / "selftest", f.tmp.path / "real");
    fs::create_symlink(f.tmp.path / "real", f.tmp.path / "selftest");
    auto miss = cache.lookup(key);
    CHECK_FALSE(miss.reusable);
    CHECK(has(miss.why_not, "is not a directory"));
    CHECK_FALSE(cache.record_pass(key, &why));
  }
  SECTION("another owner") {
    if (::geteuid() != 0) {
      // As another user the record is someone else's: build a cache that expects another
      // owner (what a chown by root would make of it).
      const self_test_cache theirs(f.tmp.path / "selftest", "crun", ::geteuid() + 1);
      CHECK(has(theirs.lookup(key).why_not, "belongs to uid"));
    } else {
      REQUIRE(::chown(cache.path().c_str(), 65534, 65534) == 0);
      auto miss = cache.lookup(key);
      CHECK_FALSE(miss.reusable);
      CHECK(has(miss.why_not, "belongs to uid 65534"));
    }
  }
  SECTION("a symbolic link in its place, even to a good record") {
    fs::rename(cache.path(), f.tmp.path / "elsewhere.json");
    fs::create_symlink(f.tmp.path / "elsewhere.json", cache.path());
    auto miss = cache.lookup(key);
    CHECK_FALSE(miss.reusable);
    CHECK(has(miss.why_not, "symbolic link"));
  }
  SECTION("malformed, truncated, another level's, a failure, a record too large") {
    const std::string bad[] = {"",
                               "not json",
                               good.substr(0, good.size() / 2),
                               "[]",
                               "{\"v\":2}",
                               [&] {
                                 std::string t = good;
                                 t.replace(t.find("\"crun\""), 6, "\"runc\"");
                                 return t;
                               }(),
                               [&] {
                                 std::string t = good;
                                 t.replace(t.find("\"pass\""), 6, "\"fail\"");
                                 return t;
                               }(),
                               good + std::string(300 << 10, ' ')};
    for (const auto& text : bad) {
      INFO(text.substr(0, 60));
      write_text(cache.path(), text);
      ::chmod(cache.path().c_str(), 0600);
      auto miss = cache.lookup(key);
      CHECK_FALSE(miss.reusable);
      CHECK_FALSE(miss.why_not.empty());
    }
  }
  SECTION("a part edited in the record") {
    std::string t = good;
    const auto at = t.find("\"level_config\": \"accel=tcg\"");
    REQUIRE(at != std::string::npos);
    t.replace(at, 27, "\"level_config\": \"accel=kvm\"");
    write_text(cache.path(), t);
    CHECK(has(cache.lookup(key).why_not, "(level_config)"));
  }
  SECTION(
      "a file's recorded digest edited (its identity left as recorded) is caught once the "
      "file is touched") {
    write_text(a, "runtime");  // same bytes, new times: the digest is compared
    CHECK(cache.lookup(key).reusable);
    std::string t = good;
    const auto at = t.find("\"sha256\": \"");
    REQUIRE(at != std::string::npos);
    t[at + 11] = t[at + 11] == '0' ? '1' : '0';
    write_text(cache.path(), t);
    CHECK_FALSE(cache.lookup(key).reusable);
  }
}
