// Error codes for fallible *setup* calls (creating a runtime, opening a store, loading an
// image) and the `sandbox::result<T>` alias they return.
//
// How a sandboxed run ended is never an error here: that is data (`run_result.code`). These
// codes are for the library's own operations, modelled on Boost.URL's `error_types.hpp`.
#pragma once

#include <boost/system/error_category.hpp>
#include <boost/system/error_code.hpp>
#include <boost/system/result.hpp>
#include <string>
#include <type_traits>

namespace sandbox {

/// Failures of setup calls. Stable values; new ones are appended.
enum class errc {
  success = 0,
  invalid_argument = 1,      ///< a caller-supplied value is malformed (blob id, tenant, path)
  not_found = 2,             ///< a blob, image or file does not exist (for this tenant)
  already_exists = 3,        ///< creating something that is already there
  quota_exceeded = 4,        ///< a tenant's blob-store quota would be exceeded
  too_large = 5,             ///< an input is over a size cap
  digest_mismatch = 6,       ///< content does not hash to the digest that names it
  corrupt = 7,               ///< on-disk data is malformed (image layout, manifest, store)
  io_error = 8,              ///< a filesystem call failed; details in host logs
  unsupported = 9,           ///< the host lacks a kernel feature or tool the call needs
  permission_denied = 10,    ///< the host process lacks a privilege the call needs
  backend_unavailable = 11,  ///< no backend could be registered for the requested level
  shutting_down = 12,        ///< the runtime is being destroyed
  busy = 13,                 ///< a lock or resource is held by someone else
};

/// The category of `sandbox::errc` ("sandbox").
const boost::system::error_category& error_category() noexcept;

/// Makes an error code of the "sandbox" category.
inline boost::system::error_code make_error_code(errc e) noexcept {
  return {static_cast<int>(e), error_category()};
}

/// Result of a fallible setup call: a value or an error code. Expected failures never throw.
template <class T>
using result = boost::system::result<T, boost::system::error_code>;

}  // namespace sandbox

namespace boost::system {
template <>
struct is_error_code_enum<::sandbox::errc> : std::true_type {};
}  // namespace boost::system
