// OCI bundles: the generated config.json mounts only the closed set of host paths (and
// check_config proves it), the root skeleton mirrors the image's top level without touching
// the image, the seccomp section is the seccomp table's (wire/seccomp_policy.hpp) with the same
// actions and argument conditions and agrees with sandbox-init's filter, and hostile
// parameters and hand-made hostile documents are refused.
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <seccomp.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>
#include <functional>
#include <iterator>
#include <regex>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "backends/oci/bundle.hpp"
#include "unit/test_files.hpp"
#include "unit/wire/seccomp_reference.hpp"
#include "wire/seccomp_policy.hpp"

namespace oci = sandbox::detail::oci;
namespace fs = std::filesystem;
using json = nlohmann::json;
using sandbox::test::read_text;
using sandbox::test::temp_dir;
using sandbox::test::write_text;

namespace {

const auto invalid_argument = sandbox::make_error_code(sandbox::errc::invalid_argument);
const auto io_error = sandbox::make_error_code(sandbox::errc::io_error);

constexpr const char* input_name = "in-0123456789abcdef";

// The fixture image's /etc/passwd: root, a user with the run's uid (1000) and one named like
// the run's, neither of which may survive into the run's copy, and a comment.
constexpr const char* image_passwd =
    "root:x:0:0:root:/root:/bin/bash\n"
    "node:x:1000:1000::/home/node:/bin/bash\n"
    "# a comment\n"
    "sandbox:x:4242:4242::/nowhere:/bin/false\n"
    "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin";  // no final newline

fs::path clean(const fs::path& p) { return p.lexically_normal(); }

mode_t mode_of(const fs::path& p) {
  struct stat st {};
  REQUIRE(lstat(p.c_str(), &st) == 0);
  return st.st_mode;
}

std::set<std::string> listing(const fs::path& dir) {
  std::set<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.insert(e.path().filename().string());
  return names;
}

/// A fake image, a fake run workspace and an init executable, each in its own temp dir.
struct fixture {
  temp_dir image_dir, ws_dir, init_dir;
  fs::path image = clean(image_dir.path / "rootfs");
  fs::path ws = clean(ws_dir.path / "run");
  fs::path init = clean(init_dir.path / "sandbox-init");
  oci::bundle_params params;

  fixture() {
    // The image: usr/ and etc/ (resolv.conf and passwd files, hosts a symlink, group a symlink
    // to a host file), a top-level symlink, a top-level file, a FIFO (skipped) and reserved
    // names (never mirrored).
    fs::create_directories(image / "usr" / "lib");
    fs::create_directories(image / "etc");
    write_text(image / "etc" / "resolv.conf", "nameserver 192.0.2.1\n");
    fs::create_symlink("resolv.conf", image / "etc" / "hosts");
    write_text(image / "etc" / "passwd", image_passwd);
    fs::create_symlink("/etc/group", image / "etc" / "group");
    fs::create_symlink("usr/lib", image / "lib");
    write_text(image / "VERSION", "1\n");
    REQUIRE(mkfifo((image / "pipe").c_str(), 0644) == 0);
    fs::create_directories(image / "proc" / "self");
    fs::create_directories(image / "sandbox" / "out");
    write_text(image / ".sandbox-init", "not ours\n");
    // The workspace: inputs, source, output dir.
    fs::create_directories(ws / "in");
    write_text(ws / "in" / "data.csv", "a,b\n");
    write_text(ws / "main.py", "print(1)\n");
    fs::create_directories(ws / "out");
    write_text(init, "#!init\n");
    fs::permissions(init, fs::perms::owner_all | fs::perms::group_exec | fs::perms::others_exec);

    params = oci::bundle_params{
        .container_id = "r-test-1",
        .kind = oci::runtime_kind::crun,
        .image_root = image,
        .workspace = ws,
        .inputs = ws / "in",
        .source = ws / "main.py",
        .source_name = "main.py",
        .input_name = input_name,
        .output_dir = ws / "out",
        .init_executable = init,
        .cgroups_path = "/agent-sandbox/r-test-1",
        .uid = 1000,
        .gid = 1001,
        .memory_bytes = 256ULL << 20,
        .max_pids = 64,
        .cpu_millicores = 500,
        .tmp_bytes = 64ULL << 20,
        .home_bytes = 32ULL << 20,
        .shm_bytes = 16ULL << 20,
        .tmpfs_inodes = 4096,
        .nofile = 256,
        .fsize_bytes = 1ULL << 30,
    };
  }
  ~fixture() { oci::remove_bundle(ws / "bundle"); }
  fixture(const fixture&) = delete;
  fixture& operator=(const fixture&) = delete;

  std::vector<fs::path> allowed() const {
    return {image, ws / "in", ws / "main.py", ws / "out", ws / "bundle" / "files", init};
  }

  json written() {
    std::string why;
    auto b = oci::write_bundle(params, &why);
    INFO(why);
    REQUIRE(b.has_value());
    return b->config;
  }
};

const json* find_mount(const json& config, std::string_view destination) {
  for (const auto& m : config["mounts"]) {
    if (m["destination"] == destination) return &m;
  }
  return nullptr;
}

std::vector<std::string> options_of(const json& m) {
  return m["options"].get<std::vector<std::string>>();
}

bool is_bind(const json& m) {
  auto opts = m.contains("options") ? options_of(m) : std::vector<std::string>{};
  return m.value("type", "") == "bind" ||
         std::find(opts.begin(), opts.end(), "bind") != opts.end() ||
         std::find(opts.begin(), opts.end(), "rbind") != opts.end();
}

/// Component-wise "equal to or below", written independently of the code under test.
bool under(const fs::path& p, const fs::path& root) {
  auto pi = p.begin();
  for (auto ri = root.begin(); ri != root.end(); ++ri, ++pi) {
    if (pi == p.end() || *pi != *ri) return false;
  }
  return true;
}

std::vector<const json*> rules_for(const json& seccomp, std::string_view name) {
  std::vector<const json*> out;
  for (const auto& r : seccomp["syscalls"]) {
    for (const auto& n : r["names"]) {
      if (n == name) out.push_back(&r);
    }
  }
  return out;
}

}  // namespace

TEST_CASE("oci bundle: write_bundle builds the skeleton, files and a checked config", "[oci]") {
  fixture f;
  auto before = listing(f.image);
  std::string why;
  auto b = oci::write_bundle(f.params, &why);
  INFO(why);
  REQUIRE(b.has_value());
  const fs::path dir = f.ws / "bundle";
  CHECK(b->dir == dir);
  CHECK(b->config_path == dir / "config.json");
  CHECK((mode_of(dir) & 07777) == 0711);
  CHECK((mode_of(dir / "config.json") & 07777) == 0600);

  // What is on disk is what was returned, and it passes the checker.
  json config = json::parse(read_text(b->config_path));
  CHECK(config == b->config);
  CHECK(oci::check_config(config, f.allowed()) == "");
  CHECK(config["ociVersion"] == "1.0.2");
  CHECK(config["root"]["path"] == (dir / "rootfs").string());
  CHECK(config["root"]["readonly"] == true);
  CHECK(config["hostname"] == "sandbox");

  SECTION("every bind source is in the allowed set and none is a socket") {
    int binds = 0;
    for (const auto& m : config["mounts"]) {
      if (!is_bind(m)) {
        CHECK((m["type"] == "tmpfs" || m["type"] == "proc" || m["type"] == "devpts"));
        continue;
      }
      ++binds;
      fs::path source = m["source"].get<std::string>();
      INFO(source);
      CHECK(source.is_absolute());
      CHECK(source == clean(source));
      auto allowed = f.allowed();
      CHECK(std::any_of(allowed.begin(), allowed.end(),
                        [&](const fs::path& a) { return under(source, a); }));
      struct stat st {};
      REQUIRE(lstat(source.c_str(), &st) == 0);
      CHECK(!S_ISSOCK(st.st_mode));
      CHECK(!S_ISLNK(st.st_mode));
      auto opts = options_of(m);
      CHECK(std::find(opts.begin(), opts.end(), "rbind") == opts.end());
    }
    // VERSION, etc, usr, boot_id, inputs, out, main.py, resolv.conf, passwd, init, the
    // bundle's files (/.sandbox-etc): nothing else.
    CHECK(binds == 11);
  }

  SECTION("mounts come in order, with the documented options") {
    std::vector<std::string> dests;
    for (const auto& m : config["mounts"]) dests.push_back(m["destination"]);
    const std::vector<std::string> expected = {
        "/VERSION",
        "/etc",
        "/usr",  // the image, by name; lib is a symlink, pipe a FIFO
        "/proc",
        "/proc/sys/kernel/random/boot_id",
        "/dev",
        "/dev/pts",
        "/dev/shm",
        "/tmp",
        "/home/sandbox",
        std::string("/sandbox/") + input_name,
        "/sandbox/out",
        "/sandbox/main.py",
        "/etc/resolv.conf",  // hosts is a symlink in the image: not bound
        "/etc/passwd",       // group is a symlink in the image: not read, not bound
        "/.sandbox-init",
        "/.sandbox-etc"};
    CHECK(dests == expected);

    using v = std::vector<std::string>;
    const json* usr = find_mount(config, "/usr");
    REQUIRE(usr);
    CHECK((*usr)["source"] == (f.image / "usr").string());
    CHECK(options_of(*usr) == v{"bind", "ro", "nosuid", "nodev"});
    CHECK(options_of(*find_mount(config, "/sandbox/out")) ==
          v{"bind", "rw", "nosuid", "nodev", "noexec"});
    CHECK((*find_mount(config, "/sandbox/out"))["source"] == (f.ws / "out").string());
    const json* in = find_mount(config, std::string("/sandbox/") + input_name);
    REQUIRE(in);
    CHECK((*in)["source"] == (f.ws / "in").string());
    CHECK(options_of(*in) == v{"bind", "ro", "nosuid", "nodev", "noexec"});
    CHECK(options_of(*find_mount(config, "/sandbox/main.py")) ==
          v{"bind", "ro", "nosuid", "nodev", "noexec"});
    const json* init = find_mount(config, "/.sandbox-init");
    REQUIRE(init);
    CHECK((*init)["source"] == f.init.string());
    CHECK(options_of(*init) == v{"bind", "ro", "nosuid", "nodev"});
    const json* resolv = find_mount(config, "/etc/resolv.conf");
    REQUIRE(resolv);
    CHECK((*resolv)["source"] == (dir / "files" / "resolv.conf").string());
    CHECK(find_mount(config, "/etc/hosts") == nullptr);
    CHECK(find_mount(config, "/etc/hostname") == nullptr);
    const json* boot = find_mount(config, "/proc/sys/kernel/random/boot_id");
    REQUIRE(boot);
    CHECK((*boot)["source"] == (dir / "files" / "boot_id").string());

    CHECK(options_of(*find_mount(config, "/tmp")) ==
          v{"nosuid", "nodev", "size=67108864", "nr_inodes=4096", "mode=1777"});
    CHECK(options_of(*find_mount(config, "/home/sandbox")) == v{"nosuid", "nodev", "size=33554432",
                                                                "nr_inodes=4096", "mode=0700",
                                                                "uid=1000", "gid=1001"});
    CHECK(options_of(*find_mount(config, "/dev/shm")) ==
          v{"nosuid", "noexec", "nodev", "size=16777216", "nr_inodes=4096", "mode=1777"});
    CHECK(options_of(*find_mount(config, "/dev")) ==
          v{"nosuid", "noexec", "strictatime", "mode=755", "size=65536"});
    // hidepid=2: the program never sees sandbox-init (PID 1) or anything not its own.
    CHECK(options_of(*find_mount(config, "/proc")) == v{"nosuid", "noexec", "nodev", "hidepid=2"});
    // The run's own devpts instance: private, nosuid, noexec, at most 16 ptys.
    const json* pts = find_mount(config, "/dev/pts");
    REQUIRE(pts);
    CHECK((*pts)["type"] == "devpts");
    CHECK(options_of(*pts) ==
          v{"nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "max=16"});
    const json* passwd = find_mount(config, "/etc/passwd");
    REQUIRE(passwd);
    CHECK((*passwd)["source"] == (dir / "files" / "passwd").string());
    CHECK(options_of(*passwd) == v{"bind", "ro", "nosuid", "nodev", "noexec"});
    for (const char* absent : {"/lib", "/pipe", "/sys", "/sandbox", "/run", "/etc/group"}) {
      CHECK(find_mount(config, absent) == nullptr);
    }
  }

  SECTION("the skeleton has the mount points, the symlink copied, nothing of the image") {
    const fs::path root = dir / "rootfs";
    CHECK(S_ISDIR(mode_of(root / "usr")));
    CHECK(fs::is_empty(root / "usr"));
    CHECK(S_ISDIR(mode_of(root / "etc")));
    CHECK(fs::is_empty(root / "etc"));
    CHECK(S_ISREG(mode_of(root / "VERSION")));
    CHECK((mode_of(root / "VERSION") & 07777) == 0644);
    CHECK(fs::file_size(root / "VERSION") == 0);
    REQUIRE(S_ISLNK(mode_of(root / "lib")));
    CHECK(fs::read_symlink(root / "lib") == "usr/lib");
    CHECK(!fs::exists(fs::symlink_status(root / "pipe")));
    CHECK(fs::is_empty(root / "proc"));  // ours, not the image's proc/
    CHECK((mode_of(root / "tmp") & 07777) == 01777);
    CHECK((mode_of(root / "home" / "sandbox") & 07777) == 0700);
    CHECK(S_ISDIR(mode_of(root / "dev")));
    CHECK(S_ISREG(mode_of(root / ".sandbox-init")));
    CHECK((mode_of(root / ".sandbox-init") & 07777) == 0555);
    CHECK(fs::file_size(root / ".sandbox-init") == 0);
    CHECK((mode_of(root / "sandbox") & 07777) == 0111);
    CHECK((mode_of(root / "sandbox" / input_name) & 07777) == 0555);
    CHECK((mode_of(root / "sandbox" / "out") & 07777) == 0755);
    CHECK((mode_of(root / "sandbox" / "main.py") & 07777) == 0444);
    CHECK(S_ISREG(mode_of(root / "sandbox" / "main.py")));
    CHECK(listing(root) == std::set<std::string>{".sandbox-etc", ".sandbox-init", "VERSION", "dev",
                                                 "etc", "home", "lib", "proc", "sandbox", "tmp",
                                                 "usr"});
    // The image is untouched.
    CHECK(listing(f.image) == before);
    CHECK(listing(f.image / "usr") == std::set<std::string>{"lib"});
    CHECK(read_text(f.image / "etc" / "resolv.conf") == "nameserver 192.0.2.1\n");
  }

  SECTION("the bundle's files") {
    const fs::path files = dir / "files";
    CHECK(read_text(files / "resolv.conf") ==
          "nameserver 127.0.0.1\noptions attempts:1 timeout:1\n");
    CHECK(read_text(files / "hosts") ==
          "127.0.0.1 localhost sandbox\n::1 localhost ip6-localhost\n");
    CHECK(read_text(files / "hostname") == "sandbox\n");
    std::string boot_id = read_text(files / "boot_id");
    CHECK(std::regex_match(boot_id,
                           std::regex("[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-"
                                      "[0-9a-f]{12}\n")));
    // The image's passwd with the run's entry: the lines giving its uid or name another
    // meaning are gone; the image's own file is untouched; group (a symlink) was not read.
    CHECK(read_text(files / "passwd") ==
          "root:x:0:0:root:/root:/bin/bash\n"
          "# a comment\n"
          "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
          "sandbox:x:1000:1001::/home/sandbox:/bin/sh\n");
    CHECK(read_text(f.image / "etc" / "passwd") == image_passwd);
    CHECK(!fs::exists(fs::symlink_status(files / "group")));
    for (const char* name : {"resolv.conf", "hosts", "hostname", "boot_id", "passwd"}) {
      INFO(name);
      CHECK((mode_of(files / name) & 07777) == 0444);
    }
    // A second bundle has another boot id.
    oci::remove_bundle(dir);
    CHECK(!fs::exists(fs::symlink_status(dir)));
    REQUIRE(oci::write_bundle(f.params).has_value());
    CHECK(read_text(files / "boot_id") != boot_id);
  }

  SECTION("process and linux") {
    const json& proc = config["process"];
    CHECK(proc["args"] == json::array({"/.sandbox-init"}));  // runsc: + --control-stdin
    CHECK(proc["env"] == json::array());
    CHECK(proc["cwd"] == "/");
    CHECK(proc["terminal"] == false);
    CHECK(proc["user"]["uid"] == 0);
    CHECK(proc["user"]["gid"] == 0);
    CHECK(proc["noNewPrivileges"] == true);
    const json caps = {"CAP_SETUID", "CAP_SETGID", "CAP_SETPCAP", "CAP_NET_BIND_SERVICE"};
    CHECK(proc["capabilities"]["bounding"] == caps);
    CHECK(proc["capabilities"]["effective"] == caps);
    CHECK(proc["capabilities"]["permitted"] == caps);
    CHECK(proc["capabilities"]["inheritable"] == json::array());
    CHECK(proc["capabilities"]["ambient"] == json::array());
    CHECK(proc["rlimits"] == json::parse(R"([
        {"type": "RLIMIT_NOFILE", "hard": 256, "soft": 256},
        {"type": "RLIMIT_FSIZE", "hard": 1073741824, "soft": 1073741824},
        {"type": "RLIMIT_CORE", "hard": 0, "soft": 0}])"));
    const json& linux = config["linux"];
    CHECK(linux["cgroupsPath"] == "/agent-sandbox/r-test-1");
    CHECK(linux["namespaces"] == json::parse(R"([{"type": "pid"}, {"type": "network"},
        {"type": "ipc"}, {"type": "uts"}, {"type": "mount"}, {"type": "cgroup"}])"));
    CHECK(linux["resources"] == json::parse(R"({
        "memory": {"limit": 268435456}, "pids": {"limit": 64},
        "cpu": {"quota": 50000, "period": 100000},
        "devices": [{"allow": false, "access": "rwm"}]})"));
    auto masked = linux["maskedPaths"].get<std::vector<std::string>>();
    CHECK(masked.size() == 15);
    CHECK(std::find(masked.begin(), masked.end(), "/proc/kcore") != masked.end());
    CHECK(std::find(masked.begin(), masked.end(), "/proc/scsi") != masked.end());
    CHECK(linux["readonlyPaths"] ==
          json({"/proc/sys", "/proc/bus", "/proc/fs", "/proc/irq", "/proc/asound"}));
    CHECK(linux["seccomp"] == oci::seccomp_section(oci::runtime_kind::crun));
    CHECK(!config.contains("hooks"));
    CHECK(!linux.contains("sysctl"));
  }
}

TEST_CASE("oci bundle: runc masks the boot id, runsc binds it; no cpu quota at 0", "[oci]") {
  fixture f;
  f.params.kind = oci::runtime_kind::runc;
  f.params.cpu_millicores = 0;
  std::string why;
  auto runc = oci::make_config(f.params, &why);
  INFO(why);
  REQUIRE(runc.has_value());
  CHECK(find_mount(*runc, "/proc/sys/kernel/random/boot_id") == nullptr);
  auto masked = (*runc)["linux"]["maskedPaths"].get<std::vector<std::string>>();
  CHECK(std::find(masked.begin(), masked.end(), "/proc/sys/kernel/random/boot_id") != masked.end());
  CHECK(!(*runc)["linux"]["resources"].contains("cpu"));
  CHECK((*runc)["linux"]["seccomp"] == oci::seccomp_section(oci::runtime_kind::runc));

  f.params.kind = oci::runtime_kind::runsc;
  auto runsc = oci::make_config(f.params, &why);
  REQUIRE(runsc.has_value());
  CHECK(find_mount(*runsc, "/proc/sys/kernel/random/boot_id") != nullptr);
  CHECK((*runsc)["linux"]["maskedPaths"].size() == 15);
  // runsc mounts a devpts of the sandbox's own kernel itself; crun and runc get ours.
  CHECK(find_mount(*runsc, "/dev/pts") == nullptr);
  CHECK(find_mount(*runc, "/dev/pts") != nullptr);
  CHECK(find_mount(*runsc, "/etc/passwd") != nullptr);
  // make_config is pure: no bundle yet.
  CHECK(!fs::exists(f.ws / "bundle"));
}

TEST_CASE("oci bundle: runsc covers gVisor's own /sys, /dev/net and /dev/fuse", "[oci]") {
  // gVisor mounts a sysfs at /sys and adds /dev/fuse and /dev/net/tun to its /dev whatever
  // config.json says: each is covered by something empty that the program cannot use.
  fixture f;
  const std::vector<std::string> empty_ro = {"ro",        "nosuid",       "noexec",  "nodev",
                                             "size=4096", "nr_inodes=16", "mode=755"};
  f.params.kind = oci::runtime_kind::runsc;
  json config = f.written();
  const fs::path files = f.ws / "bundle" / "files";
  for (const char* d : {"/sys", "/dev/net"}) {
    INFO(d);
    const auto* m = find_mount(config, d);
    REQUIRE(m != nullptr);
    CHECK((*m)["type"] == "tmpfs");
    CHECK(options_of(*m) == empty_ro);
  }
  // gVisor's own devpts stays usable: ptys for programs that ask (nothing covers it).
  CHECK(find_mount(config, "/dev/pts") == nullptr);
  const auto* fuse = find_mount(config, "/dev/fuse");
  REQUIRE(fuse != nullptr);
  CHECK(is_bind(*fuse));
  CHECK((*fuse)["source"] == (files / "no-device").string());
  CHECK(options_of(*fuse) == std::vector<std::string>{"bind", "ro", "nosuid", "nodev", "noexec"});
  // The file: regular, empty, mode 0 (the program, not root, cannot open it), root's where
  // the bundle is written by root.
  struct stat st {};
  REQUIRE(::lstat((files / "no-device").c_str(), &st) == 0);
  CHECK(S_ISREG(st.st_mode));
  CHECK((st.st_mode & 07777) == 0);
  CHECK(st.st_size == 0);
  CHECK(S_ISDIR(mode_of(f.ws / "bundle" / "rootfs" / "sys")));
  CHECK(oci::check_config(config, f.allowed()) == "");
  oci::remove_bundle(f.ws / "bundle");

  // crun and runc add none of them, and none is in their config; /dev/pts there is the
  // run's own devpts instance.
  for (auto kind : {oci::runtime_kind::crun, oci::runtime_kind::runc}) {
    f.params.kind = kind;
    auto c = oci::make_config(f.params);
    REQUIRE(c.has_value());
    for (const char* d : {"/sys", "/dev/net", "/dev/fuse"}) {
      CHECK(find_mount(*c, d) == nullptr);
    }
    const auto* pts = find_mount(*c, "/dev/pts");
    REQUIRE(pts != nullptr);
    CHECK((*pts)["type"] == "devpts");
  }
}

TEST_CASE("oci bundle: /etc files are bound only over regular files of a real /etc", "[oci]") {
  fixture f;
  write_text(f.image / "etc" / "hostname", "image\n");
  auto with = oci::make_config(f.params);
  REQUIRE(with.has_value());
  CHECK(find_mount(*with, "/etc/hostname") != nullptr);
  CHECK(find_mount(*with, "/etc/resolv.conf") != nullptr);
  CHECK(find_mount(*with, "/etc/hosts") == nullptr);

  // /etc itself a symlink: nothing is bound below it (the runtime would follow the link).
  fs::rename(f.image / "etc", f.image / "etc-real");
  fs::create_symlink("etc-real", f.image / "etc");
  auto linked = oci::make_config(f.params);
  REQUIRE(linked.has_value());
  for (const char* d :
       {"/etc", "/etc/hostname", "/etc/resolv.conf", "/etc/hosts", "/etc/passwd", "/etc/group"}) {
    CHECK(find_mount(*linked, d) == nullptr);
  }
  CHECK(find_mount(*linked, "/etc-real") != nullptr);
}

TEST_CASE("oci bundle: passwd and group are read only as regular files, never through a link",
          "[oci][accounts]") {
  fixture f;
  // A host file the image's links point at: its content must never reach the bundle.
  temp_dir host;
  const fs::path secret = clean(host.path / "shadow");
  write_text(secret, "root:HOST-SECRET:0:0::/root:/bin/sh\n");
  fs::remove(f.image / "etc" / "passwd");
  fs::remove(f.image / "etc" / "group");

  SECTION("both symlinks to a host file") {
    fs::create_symlink(secret, f.image / "etc" / "passwd");
    fs::create_symlink(secret, f.image / "etc" / "group");
    json config = f.written();
    for (const char* name : {"passwd", "group"}) {
      INFO(name);
      CHECK(!fs::exists(fs::symlink_status(f.ws / "bundle" / "files" / name)));
      CHECK(find_mount(config, std::string("/etc/") + name) == nullptr);
    }
  }
  SECTION("a FIFO named group is neither read (no hang) nor bound; group from a file") {
    REQUIRE(mkfifo((f.image / "etc" / "group").c_str(), 0644) == 0);
    write_text(f.image / "etc" / "passwd", "root:x:0:0::/root:/bin/sh\n");
    json config = f.written();
    CHECK(find_mount(config, "/etc/group") == nullptr);
    CHECK(find_mount(config, "/etc/passwd") != nullptr);
    CHECK(read_text(f.ws / "bundle" / "files" / "passwd") ==
          "root:x:0:0::/root:/bin/sh\nsandbox:x:1000:1001::/home/sandbox:/bin/sh\n");
  }
  SECTION("group a file: the run's group replaces the image's with its gid or name") {
    write_text(f.image / "etc" / "group", "root:x:0:\nusers:x:1001:a,b\nsandbox:x:7:\n");
    json config = f.written();
    const json* group = find_mount(config, "/etc/group");
    REQUIRE(group);
    CHECK((*group)["source"] == (f.ws / "bundle" / "files" / "group").string());
    CHECK(read_text(f.ws / "bundle" / "files" / "group") == "root:x:0:\nsandbox:x:1001:\n");
  }
}

TEST_CASE("oci bundle: the seccomp section mirrors the process backend's errno rows", "[oci]") {
  for (auto kind : {oci::runtime_kind::crun, oci::runtime_kind::runc, oci::runtime_kind::runsc}) {
    json s = oci::seccomp_section(kind);
    INFO("kind " << static_cast<int>(kind));
    CHECK(s["defaultAction"] == "SCMP_ACT_ALLOW");
    // Non-native ABIs pass this filter so that sandbox-init's reports them as violations
    // (an errno here would take precedence); gVisor runs neither.
    if (kind == oci::runtime_kind::runsc) {
      CHECK(s["architectures"] == json::array({"SCMP_ARCH_X86_64"}));
    } else {
      CHECK(s["architectures"] ==
            json::array({"SCMP_ARCH_X86_64", "SCMP_ARCH_X86", "SCMP_ARCH_X32"}));
    }
    for (const auto& r : s["syscalls"]) {
      CHECK(r["action"] == "SCMP_ACT_ERRNO");
      CHECK(r["errnoRet"].is_number_integer());
      CHECK(r["names"].size() == 1);
    }

    // clone: one rule per namespace flag, mask and datum both the flag.
    auto clone = rules_for(s, "clone");
    const std::uint64_t flags[] = {CLONE_NEWNS,   CLONE_NEWCGROUP, CLONE_NEWUTS, CLONE_NEWIPC,
                                   CLONE_NEWUSER, CLONE_NEWPID,    CLONE_NEWNET};
    CHECK(clone.size() == std::size(flags));
    for (auto flag : flags) {
      INFO("flag " << flag);
      json expected = json::array(
          {json{{"index", 0}, {"value", flag}, {"valueTwo", flag}, {"op", "SCMP_CMP_MASKED_EQ"}}});
      CHECK(std::any_of(clone.begin(), clone.end(), [&](const json* r) {
        return (*r)["args"] == expected && (*r)["errnoRet"] == EPERM;
      }));
    }

    // ioctl: the low 32 bits of the request (mask first, datum second).
    auto ioctl = rules_for(s, "ioctl");
    REQUIRE(ioctl.size() == 2);
    CHECK((*ioctl[0])["args"][0]["index"] == 1);
    CHECK((*ioctl[0])["args"][0]["value"] == 0xFFFFFFFFULL);
    CHECK((*ioctl[0])["args"][0]["valueTwo"] == 0x5412);
    CHECK((*ioctl[0])["args"][0]["op"] == "SCMP_CMP_MASKED_EQ");
    CHECK((*ioctl[1])["args"][0]["valueTwo"] == 0x541C);

    // socket: families above netlink, the refused low ones, netlink other than ROUTE.
    auto socket = rules_for(s, "socket");
    CHECK(socket.size() == 1 + 13 + 1);
    CHECK(std::any_of(socket.begin(), socket.end(), [](const json* r) {
      return (*r)["args"].size() == 1 && (*r)["args"][0]["op"] == "SCMP_CMP_GT" &&
             (*r)["args"][0]["value"] == AF_NETLINK && (*r)["errnoRet"] == EAFNOSUPPORT;
    }));
    CHECK(std::none_of(socket.begin(), socket.end(), [](const json* r) {
      const json& a = (*r)["args"][0];
      return a["op"] == "SCMP_CMP_EQ" &&
             (a["value"] == AF_UNIX || a["value"] == AF_INET || a["value"] == AF_INET6);
    }));
    CHECK(std::any_of(socket.begin(), socket.end(), [](const json* r) {
      return (*r)["args"] == json::parse(R"([
          {"index": 0, "value": 16, "valueTwo": 0, "op": "SCMP_CMP_EQ"},
          {"index": 2, "value": 0, "valueTwo": 0, "op": "SCMP_CMP_NE"}])") &&
             (*r)["errnoRet"] == EPROTONOSUPPORT;
    }));

    // Calls refused only when aimed at sandbox-init (PID 1, the low 32 bits compared) or at
    // a whole uid keep their conditions.
    auto prlimit = rules_for(s, "prlimit64");
    REQUIRE(prlimit.size() == 1);
    CHECK((*prlimit[0])["args"] == json::parse(R"([
        {"index": 0, "value": 4294967295, "valueTwo": 1, "op": "SCMP_CMP_MASKED_EQ"},
        {"index": 2, "value": 0, "valueTwo": 0, "op": "SCMP_CMP_NE"}])"));
    for (auto [name, user] : {std::pair{"setpriority", 2}, std::pair{"ioprio_set", 3}}) {
      auto r = rules_for(s, name);
      REQUIRE(r.size() == 2);
      CHECK((*r[0])["args"] == json::parse(R"([
          {"index": 1, "value": 4294967295, "valueTwo": 1, "op": "SCMP_CMP_MASKED_EQ"}])"));
      CHECK((*r[1])["args"] == json::array({{{"index", 0},
                                             {"value", 4294967295},
                                             {"valueTwo", user},
                                             {"op", "SCMP_CMP_MASKED_EQ"}}}));
    }
    for (const char* name : {"sched_setaffinity", "sched_setscheduler", "sched_setparam",
                             "sched_setattr", "migrate_pages", "move_pages"}) {
      auto r = rules_for(s, name);
      REQUIRE(r.size() == 1);
      CHECK((*r[0])["args"] == json::parse(R"([
          {"index": 0, "value": 4294967295, "valueTwo": 1, "op": "SCMP_CMP_MASKED_EQ"}])"));
    }

    // Every errno row is there, one OCI rule per rule of the row, each with its errno;
    // unconditioned rows carry no args.
    for (const auto& row : sandbox::detail::seccomp_table()) {
      INFO(row.syscall);
      auto r = rules_for(s, row.syscall);
      if (row.treatment == sandbox::detail::seccomp_treatment::errno_value &&
          kind == oci::runtime_kind::runsc && row.rules[0].errno_value == ENOSYS) {
        CHECK(r.empty());  // runsc would answer EPERM, and EPERM means "no fallback"
      } else if (row.treatment == sandbox::detail::seccomp_treatment::errno_value) {
        REQUIRE(r.size() == row.rules.size());
        for (std::size_t i = 0; i < r.size(); ++i) {
          CHECK((*r[i])["errnoRet"] == row.rules[i].errno_value);
          CHECK(r[i]->contains("args") == (row.rules[i].check_count > 0));
        }
      } else if (row.treatment == sandbox::detail::seccomp_treatment::egress) {
        CHECK(r.empty());  // always sandbox-init's (recorded by the host)
      } else if (kind == oci::runtime_kind::runsc) {
        REQUIRE(r.size() == 1);
        CHECK((*r[0])["errnoRet"] == EPERM);
        CHECK(!r[0]->contains("args"));
      } else {
        CHECK(r.empty());  // sandbox-init's USER_NOTIF must not be hidden by an ERRNO here
      }
    }
    auto clone3 = rules_for(s, "clone3");
    if (kind == oci::runtime_kind::runsc) {
      CHECK(clone3.empty());
      CHECK(rules_for(s, "io_uring_setup").empty());
    } else {
      REQUIRE(clone3.size() == 1);
      CHECK((*clone3[0])["errnoRet"] == ENOSYS);
      CHECK(!clone3[0]->contains("args"));
    }
    CHECK(rules_for(s, "connect").empty());
    CHECK(rules_for(s, "sendto").empty());
    CHECK(rules_for(s, "ptrace").size() == (kind == oci::runtime_kind::runsc ? 1U : 0U));
  }
}

TEST_CASE("oci bundle: the seccomp section is the table's and agrees with sandbox-init's filter",
          "[oci][seccomp]") {
  namespace ref = seccomp_reference;
  using sandbox::detail::seccomp_action;
  using sandbox::detail::seccomp_action_kind;
  using sandbox::detail::seccomp_enforcer;
  // The filters sandbox-init stacks on top (crun/runc: with notification; runsc: without).
  const auto init_notify = ref::exported_filter(seccomp_enforcer::init_notify);
  const auto init_without_notify = ref::exported_filter(seccomp_enforcer::init_without_notify);
  const auto bpf_action = [](const std::vector<sock_filter>& prog, const ref::call& c) {
    const auto a = ref::action_of_return(ref::run_bpf(prog, c));
    REQUIRE(a.has_value());
    return *a;
  };
  for (auto kind : {oci::runtime_kind::crun, oci::runtime_kind::runc, oci::runtime_kind::runsc}) {
    INFO("kind " << static_cast<int>(kind));
    const bool runsc = kind == oci::runtime_kind::runsc;
    const auto enforcer = runsc ? seccomp_enforcer::oci_gvisor : seccomp_enforcer::oci_stacked;
    const json s = oci::seccomp_section(kind);
    // Every OCI rule names one call of the table: nothing is refused that the table does not
    // refuse.
    std::set<std::string> table_names;
    std::size_t expected_rules = 0;
    for (const auto& row : sandbox::detail::seccomp_table()) {
      table_names.insert(row.syscall);
      for (const auto& rule : row.rules) {
        if (sandbox::detail::seccomp_action_for(row, rule, enforcer).kind !=
            seccomp_action_kind::none) {
          ++expected_rules;
        }
      }
    }
    CHECK(s["syscalls"].size() == expected_rules);
    for (const auto& r : s["syscalls"]) {
      REQUIRE(r["names"].size() == 1);
      CHECK(table_names.contains(r["names"][0].get<std::string>()));
    }
    for (const auto& row : sandbox::detail::seccomp_table()) {
      const int nr = seccomp_syscall_resolve_name(row.syscall);
      for (const auto& c : ref::probes(row, nr)) {
        INFO(row.syscall << " args " << c.args[0] << ", " << c.args[1] << ", " << c.args[2] << ", "
                         << c.args[4]);
        // Each rule with the same action and argument conditions as the table says.
        const auto oci_got = ref::oci_action(s, row.syscall, c);
        const auto want = ref::reference_action(row, c, enforcer);
        INFO("want " << ref::describe(want) << ", got " << ref::describe(oci_got));
        CHECK(ref::same(oci_got, want));
        // Against sandbox-init's filter as built: crun/runc refuse what it refuses with the
        // same errno, and never touch a call it sends to the host; runsc refuses what the
        // filter without notification refuses, less the ENOSYS rows.
        if (!runsc) {
          const auto init = bpf_action(init_notify, c);
          if (init.kind == seccomp_action_kind::notify) {
            CHECK(oci_got.kind == seccomp_action_kind::none);
          } else {
            CHECK(ref::same(oci_got, init));
          }
        } else {
          const auto init = bpf_action(init_without_notify, c);
          const bool enosys =
              init.kind == seccomp_action_kind::errno_value && init.errno_value == ENOSYS;
          CHECK(ref::same(oci_got, enosys ? seccomp_action{} : init));
        }
      }
    }
    // Non-native ABIs: crun/runc list them so their calls reach sandbox-init's filter, which
    // the table has judge them; gVisor runs neither.
    CHECK(sandbox::detail::seccomp_non_native_abi_action(enforcer).kind ==
          seccomp_action_kind::none);
    CHECK(s["architectures"].size() == (runsc ? 1U : 3U));
  }
}

TEST_CASE("oci bundle: hostile parameters are refused and leave nothing behind", "[oci]") {
  fixture f;
  using mutation = std::function<void(oci::bundle_params&)>;
  const fs::path ws = f.ws;
  const fs::path elsewhere = f.image_dir.path / "elsewhere";
  fs::create_directories(elsewhere);
  const std::vector<std::pair<std::string, mutation>> cases = {
      {"container_id with '/' and '..'", [](auto& p) { p.container_id = "A/../x"; }},
      {"container_id upper case", [](auto& p) { p.container_id = "Run1"; }},
      {"empty container_id", [](auto& p) { p.container_id = ""; }},
      {"container_id starting with '-'", [](auto& p) { p.container_id = "-x"; }},
      {"container_id of 65 chars", [](auto& p) { p.container_id = std::string(65, 'a'); }},
      {"source_name ../x", [](auto& p) { p.source_name = "../x"; }},
      {"source_name a/b", [](auto& p) { p.source_name = "a/b"; }},
      {"source_name ..", [](auto& p) { p.source_name = ".."; }},
      {"source_name .", [](auto& p) { p.source_name = "."; }},
      {"empty source_name", [](auto& p) { p.source_name = ""; }},
      {"source_name out", [](auto& p) { p.source_name = "out"; }},
      {"source_name with NUL", [](auto& p) { p.source_name = std::string("a\0b", 3); }},
      {"source_name of 256 bytes", [](auto& p) { p.source_name = std::string(256, 'a'); }},
      {"source_name = input_name", [](auto& p) { p.source_name = p.input_name; }},
      {"input_name in-xyz", [](auto& p) { p.input_name = "in-xyz"; }},
      {"input_name upper hex", [](auto& p) { p.input_name = "in-0123456789ABCDEF"; }},
      {"input_name without prefix", [](auto& p) { p.input_name = "xx-0123456789abcdef"; }},
      {"relative inputs", [](auto& p) { p.inputs = "in"; }},
      {"inputs outside the workspace", [&](auto& p) { p.inputs = elsewhere; }},
      {"inputs through ..", [&](auto& p) { p.inputs = ws / ".." / "run" / "in"; }},
      {"inputs with a trailing /", [&](auto& p) { p.inputs = (ws / "in").string() + "/"; }},
      {"inputs = the workspace", [&](auto& p) { p.inputs = ws; }},
      {"inputs in a prefix sibling", [&](auto& p) { p.inputs = ws.string() + "-evil/in"; }},
      {"source inside the bundle", [&](auto& p) { p.source = ws / "bundle" / "x"; }},
      {"output_dir outside", [](auto& p) { p.output_dir = "/tmp"; }},
      {"image_root /", [](auto& p) { p.image_root = "/"; }},
      {"workspace /", [](auto& p) { p.workspace = "/"; }},
      {"relative image_root", [](auto& p) { p.image_root = "rootfs"; }},
      {"image_root inside the workspace", [&](auto& p) { p.image_root = ws / "in"; }},
      {"relative init_executable", [](auto& p) { p.init_executable = "sandbox-init"; }},
      {"relative cgroups_path", [](auto& p) { p.cgroups_path = "agent-sandbox/r"; }},
      {"cgroups_path with ..", [](auto& p) { p.cgroups_path = "/agent-sandbox/../r"; }},
      {"uid 0", [](auto& p) { p.uid = 0; }},
      {"gid 0", [](auto& p) { p.gid = 0; }},
      {"memory 0", [](auto& p) { p.memory_bytes = 0; }},
      {"pids 0", [](auto& p) { p.max_pids = 0; }},
      {"tmp 0", [](auto& p) { p.tmp_bytes = 0; }},
      {"home 0", [](auto& p) { p.home_bytes = 0; }},
      {"shm 0", [](auto& p) { p.shm_bytes = 0; }},
      {"inodes 0", [](auto& p) { p.tmpfs_inodes = 0; }},
  };
  for (const auto& [name, mutate] : cases) {
    INFO(name);
    oci::bundle_params p = f.params;
    mutate(p);
    std::string why;
    auto config = oci::make_config(p, &why);
    REQUIRE(!config.has_value());
    CHECK(config.error() == invalid_argument);
    CHECK(!why.empty());
    why.clear();
    auto b = oci::write_bundle(p, &why);
    REQUIRE(!b.has_value());
    CHECK(b.error() == invalid_argument);
    CHECK(!why.empty());
    CHECK(!fs::exists(fs::symlink_status(ws / "bundle")));
  }
  // The unmodified parameters work (the refusals above were for the mutation).
  CHECK(oci::make_config(f.params).has_value());
}

TEST_CASE("oci bundle: a failure after the bundle was started removes it", "[oci]") {
  fixture f;
  std::string why;

  SECTION("source is a symlink (the runtime would follow it)") {
    fs::remove(f.ws / "main.py");
    fs::create_symlink("/etc/passwd", f.ws / "main.py");
    auto b = oci::write_bundle(f.params, &why);
    REQUIRE(!b.has_value());
    CHECK(b.error() == invalid_argument);
    CHECK_THAT(why, Catch::Contains("symlink"));
  }
  SECTION("init executable is a FIFO") {
    fs::remove(f.init);
    REQUIRE(mkfifo(f.init.c_str(), 0755) == 0);
    auto b = oci::write_bundle(f.params, &why);
    REQUIRE(!b.has_value());
    CHECK(b.error() == invalid_argument);
    CHECK_THAT(why, Catch::Contains("FIFO"));
  }
  SECTION("inputs missing") {
    fs::remove_all(f.ws / "in");
    auto b = oci::write_bundle(f.params, &why);
    REQUIRE(!b.has_value());
    CHECK(!why.empty());
  }
  SECTION("image root missing") {
    f.params.image_root = f.image_dir.path / "absent";
    auto b = oci::write_bundle(f.params, &why);
    REQUIRE(!b.has_value());
    CHECK(b.error() == io_error);
    CHECK(!why.empty());
  }
  CHECK(!fs::exists(fs::symlink_status(f.ws / "bundle")));
  auto left = listing(f.ws);
  left.erase("in");  // removed by one section
  CHECK(left == std::set<std::string>{"main.py", "out"});
}

TEST_CASE("oci bundle: an existing bundle directory is refused and left alone", "[oci]") {
  fixture f;
  fs::create_directories(f.ws / "bundle");
  write_text(f.ws / "bundle" / "marker", "x");
  std::string why;
  auto b = oci::write_bundle(f.params, &why);
  REQUIRE(!b.has_value());
  CHECK(b.error() == io_error);
  CHECK(read_text(f.ws / "bundle" / "marker") == "x");
}

TEST_CASE("oci bundle: check_config refuses hand-made hostile documents", "[oci]") {
  fixture f;
  const json good = f.written();
  REQUIRE(oci::check_config(good, f.allowed()) == "");
  const fs::path in = f.ws / "in";

  // A real unix socket, in a directory the caller allows.
  temp_dir sock_dir;
  const fs::path sock = clean(sock_dir.path / "docker.sock");
  int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  REQUIRE(s >= 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  REQUIRE(sock.string().size() < sizeof addr.sun_path);
  std::strncpy(addr.sun_path, sock.c_str(), sizeof addr.sun_path - 1);
  REQUIRE(bind(s, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  close(s);
  auto allowed = f.allowed();
  allowed.push_back(clean(sock_dir.path));

  fs::create_directories(f.ws.string() + "-evil");
  fs::create_symlink("/etc", in / "link");

  auto with_bind = [&](const std::string& source) {
    json doc = good;
    doc["mounts"].push_back({{"destination", "/mnt"},
                             {"type", "bind"},
                             {"source", source},
                             {"options", json::array({"bind", "ro", "nosuid", "nodev"})}});
    return doc;
  };
  using edit = std::function<json()>;
  const std::vector<std::tuple<std::string, edit, std::string>> cases = {
      {"bind of a socket in an allowed dir", [&] { return with_bind(sock.string()); }, "socket"},
      {"bind of /etc", [&] { return with_bind("/etc"); }, "outside the allowed paths"},
      {"source through ..", [&] { return with_bind(in.string() + "/../etc"); }, ".."},
      {"prefix trick", [&] { return with_bind(f.ws.string() + "-evil"); }, "outside"},
      {"relative source", [&] { return with_bind("etc"); }, "not absolute"},
      {"symlink below an allowed dir", [&] { return with_bind((in / "link").string()); },
       "symlink"},
      {"missing source", [&] { return with_bind((in / "absent").string()); }, "absent"},
      {"bind via options only",
       [&] {
         json doc = good;
         doc["mounts"].push_back({{"destination", "/mnt"},
                                  {"type", "none"},
                                  {"source", "/etc"},
                                  {"options", json::array({"bind", "nosuid", "nodev"})}});
         return doc;
       },
       "outside"},
      {"rbind",
       [&] {
         json doc = with_bind(in.string());
         doc["mounts"].back()["options"].push_back("rbind");
         return doc;
       },
       "rbind"},
      {"bind without nosuid",
       [&] {
         json doc = good;
         doc["mounts"].push_back({{"destination", "/mnt"},
                                  {"type", "bind"},
                                  {"source", in.string()},
                                  {"options", json::array({"bind", "nodev"})}});
         return doc;
       },
       "nosuid"},
      {"sysfs mount",
       [&] {
         json doc = good;
         doc["mounts"].push_back({{"destination", "/sys"}, {"type", "sysfs"}, {"source", "sysfs"}});
         return doc;
       },
       "sysfs"},
      {"devpts mount without newinstance (the host's instance on old kernels)",
       [&] {
         json doc = good;
         doc["mounts"].push_back(
             {{"destination", "/dev/pts"}, {"type", "devpts"}, {"source", "devpts"}});
         return doc;
       },
       "devpts without newinstance"},
      {"devpts mount without noexec",
       [&] {
         json doc = good;
         doc["mounts"].push_back({{"destination", "/dev/pts"},
                                  {"type", "devpts"},
                                  {"source", "devpts"},
                                  {"options", json::array({"newinstance", "nosuid"})}});
         return doc;
       },
       "devpts without noexec"},
      {"devpts mounted elsewhere",
       [&] {
         json doc = good;
         doc["mounts"].push_back({{"destination", "/mnt"},
                                  {"type", "devpts"},
                                  {"source", "devpts"},
                                  {"options", json::array({"newinstance", "nosuid", "noexec"})}});
         return doc;
       },
       "devpts at /mnt"},
      {"relative destination",
       [&] {
         json doc = good;
         doc["mounts"][0]["destination"] = "usr";
         return doc;
       },
       "destination"},
      {"destination with ..",
       [&] {
         json doc = good;
         doc["mounts"][0]["destination"] = "/usr/../../x";
         return doc;
       },
       "destination"},
      {"namespace with a path",
       [&] {
         json doc = good;
         doc["linux"]["namespaces"].push_back({{"type", "network"}, {"path", "/proc/1/ns/net"}});
         return doc;
       },
       "namespaces"},
      {"no network namespace",
       [&] {
         json doc = good;
         json kept = json::array();
         for (const auto& ns : doc["linux"]["namespaces"]) {
           if (ns["type"] != "network") kept.push_back(ns);
         }
         doc["linux"]["namespaces"] = kept;
         return doc;
       },
       "network"},
      {"hooks",
       [&] {
         json doc = good;
         doc["hooks"] = {{"prestart", json::array({{{"path", "/bin/sh"}}})}};
         return doc;
       },
       "hooks"},
      {"CAP_SYS_ADMIN added",
       [&] {
         json doc = good;
         doc["process"]["capabilities"]["bounding"].push_back("CAP_SYS_ADMIN");
         return doc;
       },
       "CAP_SYS_ADMIN"},
      {"ambient capability",
       [&] {
         json doc = good;
         doc["process"]["capabilities"]["ambient"].push_back("CAP_SETUID");
         return doc;
       },
       "ambient"},
      {"root.readonly false",
       [&] {
         json doc = good;
         doc["root"]["readonly"] = false;
         return doc;
       },
       "readonly"},
      {"root elsewhere",
       [&] {
         json doc = good;
         doc["root"]["path"] = "/";
         return doc;
       },
       "root.path"},
      {"terminal",
       [&] {
         json doc = good;
         doc["process"]["terminal"] = true;
         return doc;
       },
       "terminal"},
      {"no noNewPrivileges",
       [&] {
         json doc = good;
         doc["process"]["noNewPrivileges"] = false;
         return doc;
       },
       "noNewPrivileges"},
      {"sysctl",
       [&] {
         json doc = good;
         doc["linux"]["sysctl"] = {{"net.ipv4.ip_forward", "1"}};
         return doc;
       },
       "sysctl"},
      {"a device allowed",
       [&] {
         json doc = good;
         doc["linux"]["resources"]["devices"].push_back({{"allow", true}, {"access", "rwm"}});
         return doc;
       },
       "devices"},
  };
  for (const auto& [name, make, expected] : cases) {
    INFO(name);
    std::string violation = oci::check_config(make(), allowed);
    CHECK_THAT(violation, Catch::Contains(expected));
  }
  // The socket's directory itself is fine to bind (it is allowed and a directory).
  CHECK(oci::check_config(with_bind(clean(sock_dir.path).string()), allowed) == "");
  // Not a document at all.
  CHECK(!oci::check_config(json::array(), allowed).empty());
  CHECK(!oci::check_config(json::object(), allowed).empty());
}
