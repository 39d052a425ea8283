#include "store/gunzip.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>

#include "store/store_io.hpp"

namespace sandbox::detail {

result<std::unique_ptr<gunzip_source>> gunzip_source::start(int input_fd) noexcept {
  try {
    const std::string gzip = find_program({"/usr/bin/gzip", "/bin/gzip"});
    if (gzip.empty()) return store_error(errc::unsupported);
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) return sys_error(errno);
    unique_fd read_end(fds[0]), write_end(fds[1]);
    int mfd = ::memfd_create("agent-sandbox-gzip-stderr", MFD_CLOEXEC);
    if (mfd < 0) return sys_error(errno);
    std::unique_ptr<gunzip_source> src(new gunzip_source());
    src->errors_.reset(mfd);
    spawn_spec spec{.argv = {gzip, "-dc"},
                    .env = minimal_tool_env(),
                    .stdin_fd = input_fd,
                    .stdout_fd = write_end.get(),
                    .stderr_fd = mfd};
    auto child = child_process::spawn(spec);
    if (!child) return child.error();
    src->child_ = std::move(*child);
    src->out_ = std::move(read_end);
    return src;  // write_end closes here, so we see EOF when gzip exits
  } catch (...) {
    return sys_error(ENOMEM);
  }
}

gunzip_source::~gunzip_source() {
  out_.reset();  // a gzip blocked on a full pipe gets EPIPE and the kill finds it quickly
  child_.kill_and_reap();
}

result<std::size_t> gunzip_source::read(void* buf, std::size_t n) {
  if (finished_) return std::size_t{0};
  auto r = read_full(out_.get(), buf, n);
  if (!r) return r.error();
  if (*r > 0) return r;
  finished_ = true;
  auto status = child_.wait(std::chrono::seconds(60));
  if (!status) return status.error();
  if (!WIFEXITED(*status) || WEXITSTATUS(*status) != 0) return store_error(errc::corrupt);
  return std::size_t{0};
}

std::string gunzip_source::diagnostics() const {
  try {
    return read_tail(errors_.get(), 4096);
  } catch (...) {
    return {};
  }
}

}  // namespace sandbox::detail
