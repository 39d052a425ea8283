// The run's passwd and group entries. See accounts.hpp; passwd(5) and group(5) for the format.
#include "wire/accounts.hpp"

#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace sandbox::detail {
namespace {

// Field `index` (0-based, ':'-separated) of `line` into `*out`; false when the line has fewer
// fields.
bool field(std::string_view line, std::size_t index, std::string_view* out) {
  std::size_t start = 0;
  for (std::size_t i = 0; i < index; ++i) {
    std::size_t colon = line.find(':', start);
    if (colon == std::string_view::npos) return false;
    start = colon + 1;
  }
  std::size_t end = line.find(':', start);
  *out = line.substr(start, end == std::string_view::npos ? line.size() - start : end - start);
  return true;
}

// `image` without the lines named `name` or whose field 2 (uid or gid) is `id`, each kept line
// ending in '\n'.
std::string without_run_lines(std::string_view image, std::string_view id) {
  std::string out;
  out.reserve(image.size() + 64);
  std::size_t pos = 0;
  while (pos < image.size()) {
    std::size_t nl = image.find('\n', pos);
    std::string_view line =
        image.substr(pos, nl == std::string_view::npos ? image.size() - pos : nl - pos);
    pos = nl == std::string_view::npos ? image.size() : nl + 1;
    std::string_view name, number;
    const bool has_name = field(line, 0, &name);
    const bool has_number = field(line, 2, &number);
    if ((has_name && name == run_account_name) || (has_number && number == id)) continue;
    out.append(line);
    out.push_back('\n');
  }
  return out;
}

}  // namespace

std::string passwd_with_run_account(std::string_view image, uid_t uid, gid_t gid) {
  const std::string u = std::to_string(uid);
  std::string out = without_run_lines(image, u);
  out.append(run_account_name).append(":x:").append(u).append(":").append(std::to_string(gid));
  out.append("::").append(run_account_home).append(":").append(run_account_shell).append("\n");
  return out;
}

std::string group_with_run_account(std::string_view image, gid_t gid) {
  const std::string g = std::to_string(gid);
  std::string out = without_run_lines(image, g);
  out.append(run_account_name).append(":x:").append(g).append(":\n");
  return out;
}

int read_image_etc_file(int root_fd, const char* name, std::string* out) {
  out->clear();
  int etc = openat(root_fd, "etc", O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (etc < 0) return -errno;
  int fd = openat(etc, name, O_RDONLY | O_NOFOLLOW | O_NOCTTY | O_NONBLOCK | O_CLOEXEC);
  int err = fd < 0 ? errno : 0;
  close(etc);
  if (fd < 0) return -err;
  struct stat st {};
  if (fstat(fd, &st) < 0) {
    err = errno;
    close(fd);
    return -err;
  }
  if (!S_ISREG(st.st_mode)) {  // a FIFO, device or directory named like the file
    close(fd);
    return -EINVAL;
  }
  out->resize(account_file_max_bytes + 1);
  std::size_t got = 0;
  while (got < out->size()) {
    ssize_t n = read(fd, out->data() + got, out->size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      err = errno;
      close(fd);
      out->clear();
      return -err;
    }
    if (n == 0) break;
    got += static_cast<std::size_t>(n);
  }
  close(fd);
  out->resize(got);
  if (got > account_file_max_bytes) {
    // Over the cap: the whole lines within it.
    std::size_t last = out->rfind('\n', account_file_max_bytes - 1);
    out->resize(last == std::string::npos ? 0 : last + 1);
  }
  return 0;
}

}  // namespace sandbox::detail
