// The table of the built-in levels (levels.hpp). Which backends were built into this library
// comes from CMake (src/CMakeLists.txt defines SANDBOX_HAS_<LEVEL>_BACKEND as 0 or 1 for this
// room alone); a level that was not built is still a row, so its status says so. Its
// factory then sits in a discarded `if constexpr` branch: never called, never linked.
#include "backends/levels.hpp"

#include <array>
#include <exception>
#include <utility>

#include "backends/microvm/microvm_backend.hpp"
#include "backends/oci/oci_backend.hpp"
#include "backends/process/process_backend.hpp"

namespace sandbox::detail {

namespace {

constexpr bool process_built = SANDBOX_HAS_PROCESS_BACKEND;
constexpr bool oci_built = SANDBOX_HAS_OCI_BACKEND;
constexpr bool microvm_built = SANDBOX_HAS_MICROVM_BACKEND;

/// Stands for a factory that was not built: `try_level` never calls it.
level_made not_built() { return std::string("not built into this library"); }

level_made make_process(const level_options& o) {
  if constexpr (process_built) {
    return make_process_backend(o.context);
  } else {
    return not_built();
  }
}

level_made make_oci(const level_options& o, const oci_backend_options& oci) {
  if constexpr (oci_built) {
    return make_oci_backend(o.context, oci);
  } else {
    (void)o;
    (void)oci;
    return not_built();
  }
}

level_made make_microvm(const level_options& o) {
  if constexpr (microvm_built) {
    return make_microvm_backend(o.context, o.microvm);
  } else {
    return not_built();
  }
}

constexpr std::array<builtin_level, 4> table{{
    {.isolation = isolation::process,
     .name = "process",
     .build_option = "SANDBOX_BACKEND_PROCESS",
     .built = process_built,
     .enabled_by = "runtime_options::process_backend",
     .on_by_default = true,
     .enabled = [](const level_options& o) { return o.process; },
     .backend_name = [](const level_options&) { return std::string("process"); },
     .make = make_process},
    {.isolation = isolation::container,
     .name = "container",
     .build_option = "SANDBOX_BACKEND_OCI",
     .built = oci_built,
     .enabled_by = "runtime_options::container.enabled",
     .on_by_default = false,
     .enabled = [](const level_options& o) { return o.container.enabled; },
     .backend_name = [](const level_options& o) { return o.container.runtime; },
     .make = [](const level_options& o) { return make_oci(o, o.container); }},
    {.isolation = isolation::gvisor,
     .name = "gvisor",
     .build_option = "SANDBOX_BACKEND_OCI",
     .built = oci_built,
     .enabled_by = "runtime_options::gvisor.enabled",
     .on_by_default = false,
     .enabled = [](const level_options& o) { return o.gvisor.enabled; },
     .backend_name = [](const level_options& o) { return o.gvisor.runtime; },
     .make = [](const level_options& o) { return make_oci(o, o.gvisor); }},
    {.isolation = isolation::microvm,
     .name = "microvm",
     .build_option = "SANDBOX_BACKEND_MICROVM",
     .built = microvm_built,
     .enabled_by = "runtime_options::microvm.enabled",
     .on_by_default = false,
     .enabled = [](const level_options& o) { return o.microvm.enabled; },
     .backend_name = [](const level_options&) { return std::string("microvm"); },
     .make = make_microvm},
}};

// One row per level, in the order of `sandbox::isolation`, named as `to_string` names it.
constexpr bool table_is_complete() {
  if (table.size() != isolation_names.size()) return false;
  for (std::size_t i = 0; i < table.size(); ++i) {
    if (static_cast<std::size_t>(table[i].isolation) != i) return false;
    if (table[i].name != isolation_names[i]) return false;
  }
  return true;
}
static_assert(table_is_complete(), "one row per sandbox::isolation, in its order");

}  // namespace

std::span<const builtin_level> builtin_levels() noexcept { return table; }

level_attempt try_level(const builtin_level& l, const level_options& o) {
  level_attempt a;
  a.status.isolation = l.isolation;
  a.status.name = l.backend_name(o);
  if (!l.built) {
    a.status.reason = "not built into this library (" + std::string(l.build_option) + "=OFF)";
    return a;
  }
  try {
    level_made made = l.make(o);
    if (auto* b = std::get_if<std::shared_ptr<backend>>(&made); b != nullptr && *b) {
      if ((*b)->isolation() != l.isolation) {
        // A runtime binary that is not what the level asks for (e.g. runc configured for
        // gvisor) serves no run at this level.
        a.status.reason = "runtime '" + a.status.name + "' does not provide this level";
        (*b)->shutdown();
      } else {
        a.status.registered = true;
        a.made = std::move(*b);
      }
    } else if (auto* why = std::get_if<std::string>(&made)) {
      a.status.reason = why->empty() ? "self-test failed" : std::move(*why);
    } else {
      a.status.reason = "the backend factory returned nothing";
    }
  } catch (const std::exception& e) {
    a.status.reason = std::string("self-test threw: ") + e.what();
  } catch (...) {
    a.status.reason = "self-test threw";
  }
  return a;
}

backend_status disabled_status(const builtin_level& l, const level_options& o) {
  return {.isolation = l.isolation,
          .name = l.backend_name(o),
          .registered = false,
          .reason = "disabled (" + std::string(l.enabled_by) + " is false)"};
}

}  // namespace sandbox::detail
