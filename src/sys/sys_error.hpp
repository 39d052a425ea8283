// The system error codes of the syscall layer's fallible calls (private to src/).
#pragma once

#include <boost/system/error_code.hpp>
#include <cerrno>

namespace sandbox::detail {

/// A system-category error code for `errno` value `e` (EIO for 0: a failure always has a
/// code).
inline boost::system::error_code sys_error(int e) noexcept {
  return {e == 0 ? EIO : e, boost::system::system_category()};
}

}  // namespace sandbox::detail
