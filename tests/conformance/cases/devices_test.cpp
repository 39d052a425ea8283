// Kind 20 — the device and /sys surface: what a program finds in /dev and /sys, and what it
// can open there. Every level documents the same small set (docs/security.md, "What the
// generated config.json allows" and "What differs under gVisor"): the memory devices null,
// zero, full, random, urandom, at most a tty without a terminal behind it and pseudo-terminal
// devices of the run's own, and nothing of the kernel's other devices; /sys absent or empty.
// gVisor adds /dev/fuse and /dev/net/tun and a sysfs of its own whatever config.json says:
// they are covered (an empty read-only /sys and /dev/net, a mode 0 file over /dev/fuse), so
// here too FUSE and tun cannot be opened and /sys shows nothing.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "conformance/suite.hpp"

using conformance::py;
using sandbox::code;

namespace {

// Lists /dev (each entry's kind and, for a character device, major:minor), lists /sys and a
// few directories below it, and tries to open devices that must not open, read-write and
// read-only.
constexpr const char* py_surface = R"PY(
import os, errno, json, stat
def err(e): return errno.errorcode.get(e.errno, str(e.errno))
dev = {}
for n in sorted(os.listdir('/dev')):
    st = os.lstat('/dev/' + n)
    if stat.S_ISCHR(st.st_mode): dev[n] = 'chr %d:%d' % (os.major(st.st_rdev), os.minor(st.st_rdev))
    elif stat.S_ISBLK(st.st_mode): dev[n] = 'blk'
    elif stat.S_ISDIR(st.st_mode): dev[n] = 'dir'
    elif stat.S_ISLNK(st.st_mode): dev[n] = 'lnk'
    elif stat.S_ISREG(st.st_mode): dev[n] = 'reg'
    else: dev[n] = 'other'
listed = {}
for d in ['/sys', '/sys/fs/cgroup', '/sys/class', '/sys/devices', '/dev/net']:
    try: listed[d] = sorted(os.listdir(d))
    except OSError as e: listed[d] = err(e)
opened = {}
for p in ['/dev/fuse', '/dev/net/tun', '/dev/kmsg', '/dev/mem', '/dev/kvm', '/dev/console',
          '/dev/tty0', '/dev/loop-control', '/dev/sda', '/dev/vda', '/dev/vsock',
          '/dev/vhost-net', '/dev/nvme0', '/dev/dri/card0', '/dev/uinput', '/dev/uhid']:
    for label, flags in (('rw', os.O_RDWR), ('ro', os.O_RDONLY)):
        try:
            fd = os.open(p, flags | os.O_NOCTTY | os.O_NONBLOCK)
            opened[p + ' ' + label] = 'OK ' + dev.get(p[5:], 'chr' if stat.S_ISCHR(os.fstat(fd).st_mode) else 'not a device')
            os.close(fd)
        except OSError as e:
            opened[p + ' ' + label] = err(e)
made = {}
for d in ['/sys/x', '/sys/fs/cgroup/x', '/dev/net/x']:
    try:
        os.mkdir(d); made[d] = 'OK'
    except OSError as e:
        made[d] = err(e)
print(json.dumps({'dev': dev, 'listed': listed, 'opened': opened, 'made': made}))
)PY";

}  // namespace

TEST_CASE("devices: /dev holds only the documented devices; no FUSE, no tun, /sys empty",
          "[devices][core]") {
  CONFORMANCE_BACKEND(b);
  auto r = b.run(py(py_surface));
  REQUIRE(r.code == code::ok);
  auto j = nlohmann::json::parse(b.blob(r.std_out.blob));
  INFO("inside: " << j.dump());
  // Character devices: the memory devices, tty (5:0: no terminal behind it), and the run's
  // own pseudo-terminals (ptmx 5:2, pts 136:N) where a level gives it a devpts of its own.
  const std::set<std::string> memory_devices = {"chr 1:3", "chr 1:5", "chr 1:7", "chr 1:8",
                                                "chr 1:9"};
  for (auto& [name, kind] : j["dev"].items()) {
    INFO("/dev/" << name << ": " << kind);
    const auto k = kind.get<std::string>();
    if (k.rfind("chr ", 0) == 0) {
      CHECK((memory_devices.count(k) == 1 || k == "chr 5:0" || k == "chr 5:2"));
    } else {
      CHECK((k == "dir" || k == "lnk" || k == "reg"));  // shm, pts, fd, stdin, …; no block device
    }
  }
  for (const char* n : {"null", "zero", "full", "random", "urandom"}) {
    INFO(n);
    CHECK(j["dev"].contains(n));
  }
  // gVisor's extra nodes are covered: /dev/fuse (if listed at all) is no device; /dev/net is
  // empty or absent.
  if (j["dev"].contains("fuse")) CHECK(j["dev"]["fuse"] == "reg");
  CHECK((j["listed"]["/dev/net"] == "ENOENT" || j["listed"]["/dev/net"].empty()));
  // Nothing of these opens, read-write or read-only.
  for (auto& [what, result] : j["opened"].items()) {
    INFO(what);
    CHECK(result.get<std::string>().rfind("OK", 0) != 0);
  }
  // /sys: absent or empty, and nothing can be made in it.
  for (auto& [dir, listing] : j["listed"].items()) {
    INFO(dir);
    if (dir == "/sys") {
      CHECK((listing == "ENOENT" || listing.empty()));
    } else if (dir != "/dev/net") {
      CHECK(listing == "ENOENT");
    }
  }
  for (auto& [dir, result] : j["made"].items()) {
    INFO(dir);
    CHECK(result != "OK");
  }
}
