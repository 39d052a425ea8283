#include "core/run/workspace.hpp"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace sandbox::detail {
namespace {

// Removes the contents of directory `dfd` (depth-limited), then nothing else.
void remove_contents(int dfd, dev_t dev, int depth) {
  if (depth > 32) return;
  DIR* d = fdopendir(dup(dfd));
  if (d == nullptr) return;
  std::vector<std::string> names;
  while (dirent* e = readdir(d)) {
    std::string_view n = e->d_name;
    if (n != "." && n != "..") names.emplace_back(n);
  }
  closedir(d);
  for (const auto& n : names) {
    struct stat st {};
    if (fstatat(dfd, n.c_str(), &st, AT_SYMLINK_NOFOLLOW) < 0) continue;
    if (S_ISDIR(st.st_mode)) {
      if (st.st_dev != dev) continue;  // a mount point: never cross it
      int sub = openat(dfd, n.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
      if (sub >= 0) {
        fchmod(sub, 0700);
        remove_contents(sub, dev, depth + 1);
        close(sub);
      }
      unlinkat(dfd, n.c_str(), AT_REMOVEDIR);
    } else {
      unlinkat(dfd, n.c_str(), 0);
    }
  }
}

// The OS error behind the failed call just made (`errno`), so that the host log says
// "No space left on device" rather than a generic I/O error.
boost::system::error_code os_error() {
  return {errno != 0 ? errno : EIO, boost::system::system_category()};
}

// Removes the half-made workspace `dir` and returns the error `e` (captured first: the
// removal changes errno).
boost::system::error_code undo(const std::filesystem::path& dir, boost::system::error_code e) {
  remove_tree(dir);
  return e;
}

}  // namespace

void remove_tree(const std::filesystem::path& path) noexcept {
  int fd = open(path.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) {
    unlink(path.c_str());
    return;
  }
  struct stat st {};
  if (fstat(fd, &st) == 0) {
    fchmod(fd, 0700);
    remove_contents(fd, st.st_dev, 0);
  }
  close(fd);
  rmdir(path.c_str());
}

result<run_workspace> create_workspace(const std::filesystem::path& runs_dir,
                                       const std::string& run_id, const std::string& source_name) {
  std::error_code ec;
  std::filesystem::create_directories(runs_dir, ec);
  if (ec) return boost::system::error_code(ec.value(), boost::system::system_category());
  run_workspace ws;
  ws.dir = runs_dir / run_id;
  ws.inputs = ws.dir / "in";
  ws.staging = ws.dir / "root";
  ws.source = ws.dir / source_name;
  if (mkdir(ws.dir.c_str(), 0700) < 0) return os_error();
  if (mkdir(ws.inputs.c_str(), 0755) < 0 || mkdir(ws.staging.c_str(), 0755) < 0) {
    return undo(ws.dir, os_error());
  }
  int sfd = open(ws.source.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (sfd < 0) return undo(ws.dir, os_error());
  close(sfd);
  return ws;
}

result<void> stage_workspace(const run_workspace& ws, std::string_view source,
                             const std::vector<input_file>& files_in, const blob_store& blobs,
                             std::string_view tenant, std::size_t* missing_blob) {
  // The source: written into the existing inode (the sandbox's bind of it sees the content).
  int sfd = open(ws.source.c_str(), O_WRONLY | O_TRUNC | O_NOFOLLOW | O_CLOEXEC);
  if (sfd < 0) return os_error();
  std::size_t off = 0;
  while (off < source.size()) {
    ssize_t n = write(sfd, source.data() + off, source.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const auto e = n < 0 ? os_error() : make_error_code(errc::io_error);
      close(sfd);
      return e;
    }
    off += static_cast<std::size_t>(n);
  }
  // Times are "now", not when the workspace was made: a warm-pool instance may have waited
  // long, and how long must not be visible inside (nor when the pool's previous run was).
  fchmod(sfd, 0444);
  futimens(sfd, nullptr);
  close(sfd);
  int dfd = open(ws.inputs.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (dfd < 0) return os_error();
  for (std::size_t i = 0; i < files_in.size(); ++i) {
    // A blob named twice is copied once; later names are hard links to the first copy.
    std::size_t first = 0;
    while (first < i && files_in[first].blob != files_in[i].blob) ++first;
    if (first < i) {
      if (linkat(dfd, files_in[first].name.c_str(), dfd, files_in[i].name.c_str(), 0) == 0) {
        continue;
      }
      const auto e = os_error();
      close(dfd);
      return e;
    }
    auto copied = blobs.copy_to(tenant, files_in[i].blob, dfd, files_in[i].name);
    if (!copied) {
      close(dfd);
      if (copied.error() == make_error_code(errc::not_found)) {
        if (missing_blob != nullptr) *missing_blob = i;
        return make_error_code(errc::not_found);
      }
      if (copied.error() == make_error_code(errc::digest_mismatch)) {
        if (missing_blob != nullptr) *missing_blob = i;
        return make_error_code(errc::digest_mismatch);
      }
      return copied.error();
    }
  }
  fchmod(dfd, 0555);
  futimens(dfd, nullptr);
  close(dfd);
  return {};
}

result<void> add_inputs(const run_workspace& ws, const std::vector<input_file>& files,
                        const blob_store& blobs, std::string_view tenant, std::size_t* failed) {
  int dfd = open(ws.inputs.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (dfd < 0) return make_error_code(errc::io_error);
  // (Writable for the copy only: an unprivileged host owns it but is no superuser.)
  fchmod(dfd, 0755);
  std::size_t done = 0;
  boost::system::error_code err;
  for (; done < files.size(); ++done) {
    auto copied = blobs.copy_to(tenant, files[done].blob, dfd, files[done].name);
    if (copied) continue;
    const auto e = copied.error();
    err = e == make_error_code(errc::not_found) || e == make_error_code(errc::digest_mismatch) ||
                  e == make_error_code(errc::already_exists)
              ? e
              : make_error_code(errc::io_error);
    if (failed != nullptr) *failed = done;
    break;
  }
  if (err) {
    for (std::size_t i = 0; i < done; ++i) unlinkat(dfd, files[i].name.c_str(), 0);
  }
  fchmod(dfd, 0555);
  futimens(dfd, nullptr);
  close(dfd);
  if (err) return err;
  return {};
}

}  // namespace sandbox::detail
