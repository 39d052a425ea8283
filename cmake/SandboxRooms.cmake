# The rooms of src/ (docs/architecture.md, "Rooms"): each is one layer, compiled as one
# OBJECT library, and may include only the rooms listed after it in SANDBOX_ROOM_RULES (the
# arrows point down). The rules are checked on every build (cmake/check_includes.cmake): a
# file that includes a room above its own, a level that includes another level, or a lower
# room that includes the facade's header fails the build with the file, the line and the rule.
#
# Each rule: <room> <directory or file under src/, ...> : <rooms it may include>.
# Public headers (include/sandbox) may be included everywhere, except those named in
# SANDBOX_ROOM_BANNED_PUBLIC for the rooms below the facade.
set(SANDBOX_ROOM_RULES
  "sys:sys:"
  "wire:wire:sys"
  "protocol:protocol:wire,sys"
  "store:store:protocol,wire,sys"
  "core:core:store,protocol,wire,sys"
  "backend_process:backends/process:core,store,protocol,wire,sys"
  "backend_oci:backends/oci:core,store,protocol,wire,sys"
  "backend_microvm:backends/microvm:core,store,protocol,wire,sys"
  "levels:backends/levels.hpp,backends/levels.cpp:backend_process,backend_oci,backend_microvm,core,store,protocol,wire,sys"
  "runtime:runtime:levels,core,store,protocol,wire,sys"
  "service:service:runtime,levels,core,store,protocol,wire,sys"
  "mcp:mcp:service,runtime,levels,core,store,protocol,wire,sys"
  "cli:cli:service,mcp,runtime,levels,core,store,protocol,wire,sys"
  "testing:testing:protocol,wire,sys"
  "helpers:helpers:wire,sys"
)
# The facade's headers: the rooms below it never include them (they once did, only to get
# option structs, which now live in sandbox/backend_options.hpp).
set(SANDBOX_ROOM_BANNED_PUBLIC
  "sys:sandbox/runtime.hpp,sandbox/sandbox.hpp"
  "wire:sandbox/runtime.hpp,sandbox/sandbox.hpp"
  "store:sandbox/runtime.hpp,sandbox/sandbox.hpp"
  "core:sandbox/runtime.hpp,sandbox/sandbox.hpp"
  "backend_process:sandbox/runtime.hpp,sandbox/sandbox.hpp"
  "backend_oci:sandbox/runtime.hpp,sandbox/sandbox.hpp"
  "backend_microvm:sandbox/runtime.hpp,sandbox/sandbox.hpp"
  "levels:sandbox/runtime.hpp,sandbox/sandbox.hpp"
)
