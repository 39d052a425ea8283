// The run's own passwd and group entries (private to src/; compiled into sandbox-init, which
// is static and has no exceptions, and into the host library for the OCI bundle).
//
// The program runs under a uid and gid of its own (a pool uid on root hosts, 1000 under a
// user namespace) that the image does not know: without an entry, `getpwuid(getuid())` fails
// and with it `getpass.getuser()`, `Path.home()` without HOME, `~user`, and every tool that
// asks who it is (git, pip, ssh). Every level therefore binds generated copies of the image's
// /etc/passwd and /etc/group read-only over the image's: the image's lines kept, except any
// that would give the run's uid, gid or name another meaning, and one entry for the run
// (`sandbox`, home /home/sandbox = the run's HOME). The image itself is never written; the
// copies live in the run's own root (process level, microvm guest) or its bundle (OCI).
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <string>
#include <string_view>

namespace sandbox::detail {

/// The run's user and group name.
inline constexpr std::string_view run_account_name = "sandbox";
/// The run's home directory: the HOME every level sets (core/run/init_messages.cpp).
inline constexpr std::string_view run_account_home = "/home/sandbox";
/// The run's login shell, as the passwd entry names it.
inline constexpr std::string_view run_account_shell = "/bin/sh";
/// How much of an image's passwd or group file is used (bytes): the image's lines up to the
/// last whole line within this; the rest is left out. Debian's own are about 1-2 KiB.
inline constexpr std::size_t account_file_max_bytes = 128 * 1024;

/**
 * The run's /etc/passwd: `image` (an image's passwd, possibly empty) line by line, minus every
 * line whose name is `run_account_name` or whose uid field is `uid` (so `getpwuid(uid)` and
 * `getpwnam("sandbox")` find only the run's entry), then
 * "sandbox:x:<uid>:<gid>::/home/sandbox:/bin/sh\n". Other lines (comments, blank lines,
 * malformed ones) are kept as they are. Pure.
 */
std::string passwd_with_run_account(std::string_view image, uid_t uid, gid_t gid);

/// The run's /etc/group, the same way: `image` minus the lines named `run_account_name` or with
/// gid field `gid`, then "sandbox:x:<gid>:\n". Pure.
std::string group_with_run_account(std::string_view image, gid_t gid);

/**
 * Reads `etc/<name>` beneath the directory `root_fd` (an image's root) into `*out`, never
 * following a symlink: neither `etc` nor the file may be one (an image's link could name a
 * host file, and here the host reads it). At most `account_file_max_bytes`, cut at the last
 * whole line. Returns 0; -ENOENT when either is absent, -ELOOP or -ENOTDIR when either is a
 * symlink or not what it should be, -EINVAL when the file is not a regular file, another
 * -errno when reading fails. `name` is one path component. Thread-safe; not
 * async-signal-safe (allocates).
 */
int read_image_etc_file(int root_fd, const char* name, std::string* out);

}  // namespace sandbox::detail
