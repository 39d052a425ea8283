// Publishing into shared state (see publish.hpp for the rules every function here keeps).
#include "store/publish.hpp"

#include <fcntl.h>
#include <stdio.h>  // renameat2, RENAME_NOREPLACE, RENAME_EXCHANGE
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <thread>

#include "protocol/sha256.hpp"

namespace sandbox::detail {
namespace {

constexpr std::string_view tmp_prefix = ".tmp-";
// Repairs of wrong entries in a directory take this lock file's exclusive flock (publish.hpp).
constexpr const char* repair_lock_name = ".publish.lock";
// A writer locks its temporary entry at once; this only covers the gap between creating it
// and locking it (remove_stale_temps also needs the lock to be free).
constexpr long stale_temp_age_s = 60;
// How often publish_* starts over when the entry changes under it (a cleanup removing it,
// another publisher replacing a wrong one) before giving up with EAGAIN.
constexpr int max_attempts = 16;
// How long a repairer waits for the exclusive lock on a wrong entry before replacing it
// anyway: a holder of a wrong file (verified once, corrupted since) must not block repair.
constexpr int repair_lock_tries = 200;
constexpr auto repair_lock_pause = std::chrono::milliseconds(10);

int open_at(int dirfd, const char* name, int flags, mode_t mode = 0) noexcept {
  int fd;
  do {
    fd = ::openat(dirfd, name, flags, mode);
  } while (fd < 0 && errno == EINTR);
  return fd;
}

int lock_fd(int fd, int op) noexcept {
  int r;
  do {
    r = ::flock(fd, op);
  } while (r != 0 && errno == EINTR);
  return r;
}

// True when `name` under `dirfd` is (still) the file open at `fd`.
bool names_fd(int dirfd, const std::string& name, int fd) noexcept {
  struct stat a {
  }, b{};
  return ::fstatat(dirfd, name.c_str(), &a, AT_SYMLINK_NOFOLLOW) == 0 && ::fstat(fd, &b) == 0 &&
         a.st_dev == b.st_dev && a.st_ino == b.st_ino;
}

// Takes the exclusive lock on a wrong entry before replacing it, so that no cleanup removes
// it meanwhile. Gives up waiting after a bounded time: see repair_lock_tries.
void lock_for_repair(int fd) noexcept {
  for (int i = 0; i < repair_lock_tries; ++i) {
    if (lock_fd(fd, LOCK_EX | LOCK_NB) == 0) return;
    std::this_thread::sleep_for(repair_lock_pause);
  }
}

// Renames `from` to `to` under `dirfd` only if `to` is free (EEXIST otherwise). Falls back to
// link + unlink where the file system lacks RENAME_NOREPLACE (regular files only).
int rename_noreplace(int dirfd, const std::string& from, const std::string& to) noexcept {
  if (::renameat2(dirfd, from.c_str(), dirfd, to.c_str(), RENAME_NOREPLACE) == 0) return 0;
  if (errno != EINVAL && errno != ENOSYS) return -1;
  if (::linkat(dirfd, from.c_str(), dirfd, to.c_str(), 0) != 0) return -1;
  (void)::unlinkat(dirfd, from.c_str(), 0);
  return 0;
}

// Checks the file open at `fd` (positioned anywhere) against `want`; leaves it at offset 0.
result<void> verify_fd(int fd, const file_digest& want, mode_t mode) noexcept {
  struct stat st {};
  if (::fstat(fd, &st) != 0) return sys_error(errno);
  if (S_ISDIR(st.st_mode)) return sys_error(EISDIR);
  if (!S_ISREG(st.st_mode) || st.st_uid != ::geteuid() || (st.st_mode & 07777) != mode ||
      static_cast<std::uint64_t>(st.st_size) != want.size) {
    return sys_error(EBADMSG);
  }
  if (::lseek(fd, 0, SEEK_SET) != 0) return sys_error(errno);
  auto h = hash_fd(fd);
  if (!h) return h.error();
  if (::lseek(fd, 0, SEEK_SET) != 0) return sys_error(errno);
  if (want.sha256.empty() || h->first != want.sha256 || h->second != want.size) {
    return sys_error(EBADMSG);
  }
  return {};
}

// Opens whatever regular file is at `name` without following a link or blocking on a FIFO.
int open_entry(int dirfd, const std::string& name) noexcept {
  int fd = open_at(dirfd, name.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return -1;
  int fl = ::fcntl(fd, F_GETFL);
  if (fl >= 0) (void)::fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
  return fd;
}

// An entry that cannot even be opened as a file: a symlink (ELOOP under O_NOFOLLOW), a
// socket (ENXIO). It is wrong, and replaced.
bool unopenable_entry(int e) noexcept { return e == ELOOP || e == ENXIO; }

}  // namespace

file_digest digest_of(std::string_view bytes) noexcept {
  try {
    return {sha256_hex(bytes), bytes.size()};
  } catch (...) {
    return {};
  }
}

result<unique_fd> open_verified_at(int dirfd, const std::string& name, const file_digest& want,
                                   mode_t mode) noexcept {
  int fd = open_entry(dirfd, name);
  if (fd < 0) return sys_error(unopenable_entry(errno) ? EBADMSG : errno);
  unique_fd owned(fd);
  if (auto v = verify_fd(fd, want, mode); !v) return v.error();
  return owned;
}

result<file_digest> install_file_at(int dirfd, const std::string& name, mode_t mode,
                                    const publish_fill& fill, const file_digest* want,
                                    bool replace) noexcept {
  try {
    remove_stale_temps(dirfd, tmp_prefix, stale_temp_age_s, store_logger{});
    auto tmp = create_temp_file_at(dirfd, tmp_prefix);
    if (!tmp) return tmp.error();
    unique_fd fd = std::move(tmp->first);
    const std::string tmp_name = std::move(tmp->second);
    auto fail = [&](boost::system::error_code ec) -> result<file_digest> {
      fd.reset();
      (void)::unlinkat(dirfd, tmp_name.c_str(), 0);
      return ec;
    };
    if (auto f = fill(fd.get(), tmp_name); !f) return fail(f.error());
    // A tool that wrote by path must have written this file, not put another in its place.
    if (!names_fd(dirfd, tmp_name, fd.get())) return fail(sys_error(EBADMSG));
    if (::fsync(fd.get()) != 0) return fail(sys_error(errno));
    if (::fchmod(fd.get(), mode) != 0) return fail(sys_error(errno));
    if (::lseek(fd.get(), 0, SEEK_SET) != 0) return fail(sys_error(errno));
    auto h = hash_fd(fd.get());
    if (!h) return fail(h.error());
    file_digest got{std::move(h->first), h->second};
    if (want != nullptr && got != *want) return fail(sys_error(EBADMSG));
    // Closed before it is published: an executable with a writer open anywhere cannot be
    // exec'd (ETXTBSY). Its mtime is its last write, so remove_stale_temps (older than
    // stale_temp_age_s, unlocked) cannot take it in the moment before the rename.
    fd.reset();
    int r = replace ? ::renameat(dirfd, tmp_name.c_str(), dirfd, name.c_str())
                    : rename_noreplace(dirfd, tmp_name, name);
    if (r != 0) return fail(sys_error(errno));
    (void)::fsync(dirfd);
    return got;
  } catch (...) {
    return sys_error(ENOMEM);
  }
}

namespace {

// Replaces a wrong entry at `name` (publish_file_at, step 3). Under the directory's repair
// lock, so repairers take turns, and holding the entry's own exclusive lock, so that no
// cleanup removes it meanwhile (after which a publisher could put a good file there that we
// would then replace): the entry is looked at again, and replaced only if it is still there
// and still wrong. Success means "look again", not "replaced".
result<void> repair_file(int dirfd, const std::string& name, const file_digest& want,
                         const publish_fill& fill, mode_t mode) noexcept {
  auto turn = file_lock::acquire(dirfd, repair_lock_name, true, true);
  if (!turn) return turn.error();
  unique_fd fd(open_entry(dirfd, name));
  if (!fd) {
    if (errno == ENOENT) return {};  // gone: it will be published afresh
    if (!unopenable_entry(errno)) return sys_error(errno);
    // A link or a socket: only a repairer replaces it (a cleanup never removes one, and a
    // publisher never links over it), and the repairer is us.
  } else {
    lock_for_repair(fd.get());
    if (!names_fd(dirfd, name, fd.get())) return {};  // replaced or removed since
    auto v = verify_fd(fd.get(), want, mode);
    if (v) return {};  // repaired by another meanwhile
    if (v.error() != boost::system::error_code(EBADMSG, boost::system::system_category())) {
      return v.error();
    }
  }
  auto r = install_file_at(dirfd, name, mode, fill, &want, true);
  if (!r) return r.error();
  return {};
}

}  // namespace

result<unique_fd> publish_file_at(int dirfd, const std::string& name, const file_digest& want,
                                  const publish_fill& fill, const publish_options& opts) noexcept {
  if (!is_plain_name(name) || name.compare(0, tmp_prefix.size(), tmp_prefix) == 0 ||
      name == repair_lock_name) {
    return sys_error(EINVAL);
  }
  for (int attempt = 0; attempt < max_attempts; ++attempt) {
    int raw = open_entry(dirfd, name);
    if (raw < 0) {
      const int e = errno;
      if (e == ENOENT) {
        // Absent: publish ours unless another publisher is first.
        auto r = install_file_at(dirfd, name, opts.mode, fill, &want, false);
        if (!r &&
            r.error() != boost::system::error_code(EEXIST, boost::system::system_category())) {
          return r.error();
        }
      } else if (unopenable_entry(e)) {
        if (auto r = repair_file(dirfd, name, want, fill, opts.mode); !r) return r.error();
      } else {
        return sys_error(e);
      }
      continue;  // verify what is there now, ours or another publisher's
    }
    unique_fd fd(raw);
    if (opts.hold) {
      if (lock_fd(fd.get(), LOCK_SH) != 0) return sys_error(errno);
      // A cleanup may have removed the name between our open and our lock.
      if (!names_fd(dirfd, name, fd.get())) continue;
    }
    auto v = verify_fd(fd.get(), want, opts.mode);
    if (v) return fd;
    if (v.error() != boost::system::error_code(EBADMSG, boost::system::system_category())) {
      return v.error();
    }
    fd.reset();  // (our own shared lock would hold up the repair)
    if (auto r = repair_file(dirfd, name, want, fill, opts.mode); !r) return r.error();
  }
  return sys_error(EAGAIN);
}

result<unique_fd> publish_file_at(int dirfd, const std::string& name, std::string_view data,
                                  const publish_options& opts) noexcept {
  const file_digest want = digest_of(data);
  if (want.sha256.empty()) return sys_error(ENOMEM);
  return publish_file_at(
      dirfd, name, want,
      [data](int fd, const std::string&) -> result<void> {
        if (!write_all(fd, data.data(), data.size())) return sys_error(errno);
        return {};
      },
      opts);
}

std::size_t remove_unheld_at(int dirfd, const std::function<bool(std::string_view)>& is_candidate,
                             const std::string& keep, const store_logger& log) noexcept {
  std::size_t removed = 0;
  auto names = list_dir_names(dirfd);
  if (!names) return 0;
  for (const auto& n : *names) {
    try {
      if (n == keep || n == repair_lock_name || n.compare(0, tmp_prefix.size(), tmp_prefix) == 0 ||
          !is_candidate(n)) {
        continue;
      }
      int raw = open_entry(dirfd, n);
      if (raw < 0) continue;
      unique_fd fd(raw);
      struct stat st {};
      if (::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
      if (lock_fd(fd.get(), LOCK_EX | LOCK_NB) != 0) continue;  // held: in use
      // Only the file we locked: a new copy published under the name since is not ours.
      if (!names_fd(dirfd, n, fd.get())) continue;
      if (::unlinkat(dirfd, n.c_str(), 0) != 0) {
        if (errno != ENOENT) log(log_level::warning, "removing unused " + n + ": unlinkat failed");
        continue;
      }
      ++removed;
    } catch (...) {
      // (Allocation failure: leave the rest for the next start.)
    }
  }
  return removed;
}

result<unique_fd> publish_dir_at(int dirfd, const std::string& name, mode_t mode,
                                 const publish_build& build, const publish_check& check) noexcept {
  if (!is_plain_name(name) || name.compare(0, tmp_prefix.size(), tmp_prefix) == 0 ||
      name == repair_lock_name) {
    return sys_error(EINVAL);
  }
  try {
    for (int attempt = 0; attempt < max_attempts; ++attempt) {
      unique_fd have(open_at(dirfd, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
      bool wrong = false;
      if (have) {
        if (check(have.get())) return have;
        wrong = true;
      } else if (errno == ENOTDIR || errno == ELOOP) {
        wrong = true;  // a file or a symlink where the directory belongs
      } else if (errno != ENOENT) {
        return sys_error(errno);
      }

      // Build ours under a fresh name, locked so that remove_stale_temps leaves it alone.
      remove_stale_temps(dirfd, tmp_prefix, stale_temp_age_s, store_logger{});
      auto tmp_name = temp_name(tmp_prefix);
      if (!tmp_name) return tmp_name.error();
      if (::mkdirat(dirfd, tmp_name->c_str(), 0700) != 0) {
        if (errno == EEXIST) continue;
        return sys_error(errno);
      }
      unique_fd tmp(
          open_at(dirfd, tmp_name->c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
      auto drop = [&](boost::system::error_code ec) -> result<unique_fd> {
        tmp.reset();
        (void)remove_tree_at(dirfd, *tmp_name);
        return ec;
      };
      if (!tmp) return drop(sys_error(errno));
      (void)lock_fd(tmp.get(), LOCK_EX | LOCK_NB);
      if (auto b = build(tmp.get(), *tmp_name); !b) return drop(b.error());
      if (::fchmod(tmp.get(), mode) != 0) return drop(sys_error(errno));
      if (::fsync(tmp.get()) != 0) return drop(sys_error(errno));
      if (!check(tmp.get())) return drop(sys_error(EBADMSG));

      file_lock turn;
      if (wrong) {
        // Repairers take turns (the directory's repair lock) and look again: the entry may
        // have been repaired meanwhile (then ours is dropped), and only a repairer ever
        // removes or replaces a wrong entry, so what is there now stays until we act.
        auto t = file_lock::acquire(dirfd, repair_lock_name, true, true);
        if (!t) return drop(t.error());
        turn = std::move(*t);
        have.reset(open_at(dirfd, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
        if (have && check(have.get())) {
          (void)drop({});
          return have;
        }
        wrong = have || errno == ENOTDIR || errno == ELOOP;
        have.reset();
      }
      if (!wrong) {
        // Plain rename where RENAME_NOREPLACE is missing: a directory is never renamed over
        // a non-empty one (ENOTEMPTY), and a published one is never empty.
        int r = ::renameat2(dirfd, tmp_name->c_str(), dirfd, name.c_str(), RENAME_NOREPLACE);
        if (r != 0 && (errno == EINVAL || errno == ENOSYS)) {
          r = ::renameat(dirfd, tmp_name->c_str(), dirfd, name.c_str());
        }
        if (r != 0) {
          const int e = errno;
          (void)drop({});
          if (e == EEXIST || e == ENOTEMPTY) continue;  // another publisher won: check theirs
          return sys_error(e);
        }
      } else {
        if (::renameat2(dirfd, tmp_name->c_str(), dirfd, name.c_str(), RENAME_EXCHANGE) != 0) {
          return drop(sys_error(errno));
        }
        // The wrong one now has our temporary name.
        (void)remove_tree_at(dirfd, *tmp_name);
      }
      (void)::fsync(dirfd);
      (void)lock_fd(tmp.get(), LOCK_UN);
      return tmp;
    }
    return sys_error(EAGAIN);
  } catch (...) {
    return sys_error(ENOMEM);
  }
}

}  // namespace sandbox::detail
