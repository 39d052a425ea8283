// The requests that read or write the blob store (service/blob_requests.hpp).
#include "service/blob_requests.hpp"

#include <fmt/format.h>

#include "protocol/base64url.hpp"
#include "sandbox/error.hpp"
#include "sandbox/record.hpp"

namespace sandbox::service {

std::string answer_blob_put(sandbox::blob_store* blobs, const std::string& id,
                            const blob_put_line& put, const sandbox::log_sink& log) {
  try {
    auto r = blobs
                 ? blobs->put(put.tenant, put.data)
                 : sandbox::result<std::string>(sandbox::make_error_code(sandbox::errc::io_error));
    if (r) return answer_line(id, "blob", json_string(*r));
    if (r.error() == sandbox::make_error_code(sandbox::errc::quota_exceeded)) {
      return error_line(id, "quota_exceeded", "the tenant's blob quota is exhausted");
    }
    if (r.error() == sandbox::make_error_code(sandbox::errc::invalid_argument)) {
      return error_line(id, "invalid_request", "blob_put.tenant: invalid tenant name");
    }
    log(sandbox::log_level::error,
        "serve: blob put for " + put.tenant + ": " + r.error().message());
    return error_line(id, "internal", "the blob could not be stored");
  } catch (const std::exception&) {
    return error_line(id, "internal", "internal error");
  }
}

std::string answer_blob_get(const sandbox::blob_store* blobs, const std::string& id,
                            const blob_get_line& get, const service_limits& limits,
                            std::atomic<std::size_t>& unwritten_total, std::size_t& reserved,
                            const sandbox::log_sink& log) {
  using sandbox::errc;
  using sandbox::make_error_code;
  const std::size_t cap = limits.max_blob_get_bytes;
  reserved = 0;
  try {
    auto fail = [&](const boost::system::error_code& ec) {
      if (ec == make_error_code(errc::not_found)) {
        // Also for another tenant's blob: its existence is not revealed.
        return error_line(id, "blob_not_found", "no such blob for this tenant");
      }
      if (ec == make_error_code(errc::invalid_argument)) {
        return error_line(id, "invalid_request", "blob_get: invalid tenant or blob id");
      }
      log(sandbox::log_level::error,
          "serve: blob get " + get.blob + " for " + get.tenant + ": " + ec.message());
      return error_line(id, "internal", "the blob could not be read");
    };
    if (!blobs) return fail(make_error_code(errc::io_error));
    auto size = blobs->size(get.tenant, get.blob);
    if (!size) return fail(size.error());
    if (*size > cap) {
      return error_line(
          id, "too_large",
          fmt::format("the blob has {} bytes; blob_get returns at most {}", *size, cap));
    }
    reserved = *size / 3 * 4 + 4096 + id.size();
    if (unwritten_total.fetch_add(reserved) + reserved > limits.max_total_output_bytes) {
      // Every connection's unwritten answers together stay within the daemon-wide budget,
      // so clients that do not read cannot grow the daemon without bound.
      return error_line(id, "capacity",
                        "the daemon holds too many unread answers; retry after reading yours");
    }
    auto bytes = blobs->get(get.tenant, get.blob);
    if (!bytes) return fail(bytes.error());
    if (bytes->size() > cap) {  // replaced between size() and get()
      return error_line(id, "too_large", fmt::format("blob_get returns at most {} bytes", cap));
    }
    return answer_line(id, "data_b64", "\"" + detail::base64_encode(*bytes) + "\"");
  } catch (const std::exception&) {
    return error_line(id, "internal", "internal error");
  }
}

std::string answer_replay(const sandbox::blob_store* blobs, const std::string& id,
                          const replay_line& replay) {
  try {
    auto r = blobs ? sandbox::replay_run(*blobs, replay.record, replay.ticket)
                   : boost::system::result<sandbox::run_result, sandbox::rejection>(
                         sandbox::rejection{sandbox::code::internal, "no blob store"});
    return result_line(id, r ? *r : sandbox::rejected_result(r.error()));
  } catch (const std::exception&) {
    return error_line(id, "internal", "internal error");
  }
}

}  // namespace sandbox::service
