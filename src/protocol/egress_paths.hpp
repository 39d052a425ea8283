// Path checks shared by the L7 egress rules' validation (protocol/egress.cpp: a rule's path
// prefixes) and the proxy's judgement of request paths (core/egress/l7_rules.cpp): a rule may
// not name what a request to a host with rules may not hold.
#pragma once

#include <string_view>

namespace sandbox::detail {

/// True when `path` (a path starting with `/`, without query) has a segment that is `.` or
/// starts with `..` or `.;` (a dot segment, also one with path parameters, which some servers
/// strip before resolving it; RFC 3986, 5.2.4).
bool has_dot_segment(std::string_view path) noexcept;

}  // namespace sandbox::detail
