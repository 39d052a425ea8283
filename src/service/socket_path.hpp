// The daemon's unix socket on disk (private to the service room): judging what is at the
// path before binding, and binding it with the documented mode.
#pragma once

#include <sys/stat.h>

#include <filesystem>
#include <string>

namespace sandbox::service {

/// Checks `path` before starting: absent is fine; a stale socket (nobody accepts on it) is
/// removed; anything else (another daemon listening, a file that is not a socket) is
/// refused. Empty on success, else why not ("another server is listening on '...'").
std::string clear_socket_path(const std::filesystem::path& path);

/// Creates the listening socket at `path` (shorter than `sun_path`), mode 0660: created
/// under umask 077 first, so it is never more open than that, not even for an instant.
/// Returns the descriptor (non-blocking, close-on-exec), with the file's identity in `st`
/// (so that only this file is removed at exit), or -1 with `why` set.
int bind_socket(const std::filesystem::path& path, struct stat& st, std::string& why);

}  // namespace sandbox::service
