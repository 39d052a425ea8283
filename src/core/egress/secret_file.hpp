// Reading a host-held secret's value from its file (sandbox/secrets.hpp). Private to src/.
#pragma once

#include <sys/types.h>

#include <string>

namespace sandbox::detail {

/// What `read_secret_file` found: the value, or why the file was refused.
struct secret_file_read {
  std::string value;    ///< the value (empty when refused)
  std::string problem;  ///< empty on success; else a short reason naming what is wrong
};

/**
 * Reads the value of a secret from `path` (absolute), refusing a file an unprivileged user
 * could have read or planted: it must be a regular file reached without following a final
 * symbolic link (O_NOFOLLOW), owned by root or by `owner` (the host process's effective uid),
 * with no permission bit for group or others (mode 0600 or 0400). The value is the file's
 * content without one final "\n" (or "\r\n"), `min_secret_value_bytes` ..
 * `max_secret_value_bytes` bytes of printable ASCII (0x20..0x7e, so it can go in a header
 * without breaking it), without leading or trailing spaces. The reason never quotes the
 * content. Blocking file I/O: call it at start-up, not on an executor.
 */
secret_file_read read_secret_file(const std::string& path, uid_t owner);

}  // namespace sandbox::detail
