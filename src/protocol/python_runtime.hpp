// Private: which language runtimes are Python — the ones an interpreter session can run (its
// driver is Python). One rule for the runtime's `async_open_interpreter` and for the MCP
// server's `run_cell`, which lists them.
#pragma once

#include "sandbox/registry.hpp"

namespace sandbox::detail {

/// Whether `r`'s interpreter is Python: the file name of `argv[0]` starts with "python"
/// ("python3", "python3.11"). False when `argv` is empty.
bool is_python_runtime(const runtime_spec& r) noexcept;

}  // namespace sandbox::detail
