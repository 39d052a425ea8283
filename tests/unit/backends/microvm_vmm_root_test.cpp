// The VMM's prepared root (backends/microvm/vmm_root.hpp) and spawn's root switch checks:
// the root holds exactly what the loader resolves for QEMU, and a bad switch request is
// refused before any process exists.
#include <sched.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>
#include <vector>

#include "backends/microvm/vmm_root.hpp"
#include "sys/spawn.hpp"

namespace fs = std::filesystem;
using sandbox::detail::parse_loader_list;
using sandbox::detail::prepare_vmm_root;
using sandbox::detail::vmm_root;

namespace {

struct temp_dir {
  fs::path path;
  temp_dir() {
    char t[] = "/tmp/vmm-root-test-XXXXXX";
    path = ::mkdtemp(t);
  }
  ~temp_dir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

}  // namespace

TEST_CASE("vmm root: the loader's --list output gives each resolved library", "[microvm]") {
  std::string missing;
  auto libs = parse_loader_list(
      "\tlinux-vdso.so.1 (0x00007ffd)\n"
      "\tlibz.so.1 => /lib/x86_64-linux-gnu/libz.so.1 (0x00007f04)\n"
      "\t/lib64/ld-linux-x86-64.so.2 (0x00007f02)\n"
      "\n"
      "\tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f01)\n",
      &missing);
  CHECK(missing.empty());
  CHECK(libs == std::vector<std::string>{"/lib/x86_64-linux-gnu/libz.so.1",
                                         "/lib64/ld-linux-x86-64.so.2",
                                         "/lib/x86_64-linux-gnu/libc.so.6"});
  libs = parse_loader_list("\tlibgone.so.3 => not found\n\tlibc.so.6 => /x/libc.so.6 (0x1)\n",
                           &missing);
  CHECK(missing == "libgone.so.3");
  CHECK(libs == std::vector<std::string>{"/x/libc.so.6"});
}

TEST_CASE("vmm root: a file that is not an ELF executable is refused with a reason", "[microvm]") {
  temp_dir t;
  const auto fake = t.path / "qemu-system-x86_64";
  { std::ofstream(fake) << "#!/bin/sh\n"; }
  auto r = prepare_vmm_root(t.path / "state", fake);
  REQUIRE(std::holds_alternative<std::string>(r));
  CHECK(std::get<std::string>(r).find("not a 64-bit ELF") != std::string::npos);
}

TEST_CASE("vmm root: QEMU's root holds its executable, libraries and firmware only", "[microvm]") {
  const fs::path qemu = "/usr/bin/qemu-system-x86_64";
  if (::access(qemu.c_str(), X_OK) != 0) {
    const char* ci = std::getenv("CI");
    const char* must = std::getenv("SANDBOX_MUST_WORK");
    if ((ci != nullptr && std::string(ci) == "true") ||
        (must != nullptr && std::string(must) == "1"))
      FAIL("qemu-system-x86_64 is missing (CI must run this)");
    WARN("skipped: no qemu-system-x86_64");
    return;
  }
  temp_dir t;
  auto r = prepare_vmm_root(t.path / "state", qemu);
  if (auto* why = std::get_if<std::string>(&r)) FAIL(*why);
  const auto root = std::get<vmm_root>(r);
  CHECK(root.dir.parent_path().parent_path() == t.path / "state" / "vmm-root");
  CHECK(root.dir.filename() == "root");
  CHECK(root.exec_path == qemu.string());
  struct stat st {};
  REQUIRE(::stat((root.dir / root.exec_path.substr(1)).c_str(), &st) == 0);
  CHECK(S_ISREG(st.st_mode));
  CHECK((st.st_mode & 06000) == 0);
  CHECK(::stat((root.dir / "usr/share/qemu/bios-microvm.bin").c_str(), &st) == 0);
  // The interpreter resolves inside the root (through the links the host has on its path).
  CHECK(::stat((root.dir / "lib64/ld-linux-x86-64.so.2").c_str(), &st) == 0);
  for (const char* p : {"/dev/null", "/dev/kvm", "/proc"}) {
    CHECK(std::find(root.entries.begin(), root.entries.end(), p) != root.entries.end());
  }
  for (const char* p : {"/etc", "/etc/passwd", "/home", "/root", "/tmp", "/var", "/bin/sh"}) {
    INFO(p);
    CHECK(std::find(root.entries.begin(), root.entries.end(), p) == root.entries.end());
  }
  // Every regular file is the executable, a shared object, the firmware or a mount point.
  for (const auto& e : root.entries) {
    if (::lstat((root.dir.string() + e).c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
    const auto name = fs::path(e).filename().string();
    INFO(e);
    CHECK((e == root.exec_path || e == "/dev/null" || e == "/dev/kvm" ||
           e.find("/share/qemu/") != std::string::npos || name.find(".so") != std::string::npos));
  }
  // Prepared once: a second backend reuses it.
  auto again = prepare_vmm_root(t.path / "state", qemu);
  REQUIRE(std::holds_alternative<vmm_root>(again));
  CHECK(std::get<vmm_root>(again).dir == root.dir);
}

TEST_CASE("vmm root: prepared by many threads at once, one complete root; a damaged one rebuilt",
          "[microvm]") {
  const fs::path qemu = "/usr/bin/qemu-system-x86_64";
  if (::access(qemu.c_str(), X_OK) != 0) {
    const char* ci = std::getenv("CI");
    const char* must = std::getenv("SANDBOX_MUST_WORK");
    if ((ci != nullptr && std::string(ci) == "true") ||
        (must != nullptr && std::string(must) == "1"))
      FAIL("qemu-system-x86_64 is missing (CI must run this)");
    WARN("skipped: no qemu-system-x86_64");
    return;
  }
  temp_dir t;
  const auto state = t.path / "state";
  std::vector<std::variant<vmm_root, std::string>> got(6);
  {
    std::vector<std::thread> pool;
    for (auto& g : got) pool.emplace_back([&] { g = prepare_vmm_root(state, qemu); });
    for (auto& th : pool) th.join();
  }
  for (const auto& g : got) {
    if (auto* why = std::get_if<std::string>(&g)) FAIL(*why);
  }
  const auto root = std::get<vmm_root>(got[0]);
  for (const auto& g : got) {
    CHECK(std::get<vmm_root>(g).dir == root.dir);
    CHECK(std::get<vmm_root>(g).entries == root.entries);
  }
  std::vector<std::string> names;
  const auto key_dir = root.dir.parent_path();
  for (const auto& e : fs::directory_iterator(key_dir.parent_path())) {
    names.push_back(e.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  // The root, and the repair lock of the directory at most: no temporary left behind.
  CHECK(std::count_if(names.begin(), names.end(),
                      [](const std::string& n) { return n.rfind(".tmp-", 0) == 0; }) == 0);
  CHECK(std::count(names.begin(), names.end(), key_dir.filename().string()) == 1);
  // The manifest is beside the root, never inside it (the VMM sees the root only).
  CHECK(fs::exists(key_dir / "manifest"));
  CHECK(std::find(root.entries.begin(), root.entries.end(), "/manifest") == root.entries.end());

  // A damaged root (a file gone) is not used: it is rebuilt under the same name.
  const auto firmware = root.dir / "usr/share/qemu/bios-microvm.bin";
  REQUIRE(fs::exists(firmware));
  fs::remove(firmware);
  auto again = prepare_vmm_root(state, qemu);
  REQUIRE(std::holds_alternative<vmm_root>(again));
  CHECK(std::get<vmm_root>(again).dir == root.dir);
  CHECK(fs::exists(firmware));
  CHECK(std::get<vmm_root>(again).entries == root.entries);
  // So is one without its manifest (an older version's, or a partial build).
  fs::remove(key_dir / "manifest");
  again = prepare_vmm_root(state, qemu);
  REQUIRE(std::holds_alternative<vmm_root>(again));
  CHECK(fs::exists(key_dir / "manifest"));
  CHECK(std::get<vmm_root>(again).entries == root.entries);
}

TEST_CASE("spawn: a root switch without its namespaces or with a bad bind is refused",
          "[microvm]") {
  sandbox::detail::spawn_request sr;
  sr.argv = {"x"};
  sr.fd0 = sr.fd1 = sr.fd2 = sr.fd3 = 0;
  sr.new_root = sandbox::detail::spawn_request::root_switch{
      .dir = "/nonexistent-root", .binds = {}, .proc = true, .exec_path = "/bin/x"};
  sr.clone_flags = CLONE_NEWNS;  // no CLONE_NEWPID: the procfs would be the host's pids
  auto r = sandbox::detail::spawn_process(sr);
  REQUIRE(!r);
  CHECK(r.error().value() == EINVAL);
  sr.clone_flags = CLONE_NEWNS | CLONE_NEWPID;
  sr.new_root->binds = {{"/dev/null", "../dev/null"}};
  r = sandbox::detail::spawn_process(sr);
  REQUIRE(!r);
  CHECK(r.error().value() == EINVAL);
  sr.new_root->binds = {{"/dev/null", "/abs"}};
  r = sandbox::detail::spawn_process(sr);
  REQUIRE(!r);
  CHECK(r.error().value() == EINVAL);
}
