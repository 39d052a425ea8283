// The daemon under a service manager (private to the service room): socket activation
// (sd_listen_fds(3)) and readiness notification (sd_notify(3)), both as the plain
// environment-and-descriptor protocols those man pages define — no libsystemd. Used by
// `sandboxctl serve --systemd-socket` and by every `serve` started with $NOTIFY_SOCKET
// (deploy/systemd/, docs/deployment.md).
#pragma once

#include <sys/types.h>

#include <optional>
#include <string>
#include <variant>
#include <vector>

namespace sandbox::service {

/// The socket-activation variables as the process found them (unset: nullopt).
struct listen_env {
  std::optional<std::string> listen_pid;      ///< $LISTEN_PID: the pid they are meant for
  std::optional<std::string> listen_fds;      ///< $LISTEN_FDS: how many, from fd 3 on
  std::optional<std::string> listen_fdnames;  ///< $LISTEN_FDNAMES: colon-separated names
};

/// An inherited listening socket, checked and made ours.
struct activated_socket {
  int fd = -1;          ///< the descriptor (close-on-exec, non-blocking), owned by the caller
  std::string name;     ///< its LISTEN_FDNAMES name ("" when none was given)
  std::string address;  ///< the path it is bound to, for logs ("" for an abstract one)
};

/// Reads $LISTEN_PID, $LISTEN_FDS and $LISTEN_FDNAMES and unsets them, as
/// sd_listen_fds(unset_environment=1) does, so no child (a run's helper, a VMM, an OCI
/// runtime) ever inherits them. Not thread-safe (setenv/unsetenv): call while single-threaded.
listen_env take_listen_env();

/**
 * Takes the one socket systemd passed (sd_listen_fds(3)): LISTEN_PID must be `self`,
 * LISTEN_FDS exactly 1 (the unit's one ListenStream=), LISTEN_FDNAMES (if set) one valid
 * name, and descriptor `first_fd` (3, SD_LISTEN_FDS_START; tests pass another) a listening
 * AF_UNIX SOCK_STREAM socket. On success it is made close-on-exec and non-blocking and
 * returned; otherwise a one-line reason says what was wrong and what to change, and nothing
 * is closed (the descriptor is not known to be ours). Never throws, whatever the values.
 */
std::variant<activated_socket, std::string> take_activated_socket(const listen_env& env, pid_t self,
                                                                  int first_fd = 3);

/**
 * A readiness channel to the service manager (sd_notify(3)): the unix datagram socket named
 * by $NOTIFY_SOCKET (a path, or "@name" for an abstract one), read once and unset at
 * construction so no child inherits it. Without $NOTIFY_SOCKET every call does nothing.
 * Construct while single-threaded; `notify` is thread-safe.
 */
class systemd_notifier {
 public:
  systemd_notifier();
  /// Whether $NOTIFY_SOCKET was set (usable or not).
  bool active() const noexcept { return !address_.empty(); }
  /// Sends `state` ("READY=1", "STOPPING=1", "STATUS=…", newline-separated assignments) as
  /// one datagram. Empty on success (or when inactive), else why not (for a log line).
  std::string notify(const std::string& state) const;

 private:
  std::string address_;
};

}  // namespace sandbox::service
