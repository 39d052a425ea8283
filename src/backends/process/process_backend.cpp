// Temporary stub: replaced by the real process backend.
#include "backends/process/process_backend.hpp"

namespace sandbox::detail {

std::variant<std::shared_ptr<backend>, std::string> make_process_backend(
    const process_backend_context&) {
  return std::string{"process backend not built yet"};
}

}  // namespace sandbox::detail
