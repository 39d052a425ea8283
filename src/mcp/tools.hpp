// Private: the MCP tools of `sandboxctl mcp` (docs/mcp.md): their input schemas, made from
// the host's own limits (the policy's source cap, the ticket's and policy's timeout and
// memory ceilings, the runtimes and registered tools the host has), the decoding of a
// call's arguments into a `run_request`, and the mapping of a `run_result` onto MCP content.
// Pure apart from the blob store it is handed: unit tested with an in-memory one.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <variant>

#include "sandbox/admission.hpp"
#include "sandbox/blob_store.hpp"
#include "sandbox/policy.hpp"
#include "sandbox/protocol.hpp"
#include "sandbox/ticket.hpp"

namespace sandbox::mcp {

/// "image/png" or "image/jpeg" when `bytes` start with that format's magic bytes (never the
/// file's name), else "".
std::string_view image_mime_type(std::string_view bytes);

/// The URI of a blob of the bound tenant in resource links: `urn:agent-sandbox:blob:<id>`.
/// `get_file` with the blob id (or the URI) returns its bytes.
std::string blob_uri(std::string_view blob_id);

/// What the tool schemas are made from: the host's limits as seen through the bound ticket.
struct tool_context {
  const sandbox::policy& policy;
  const host_catalog& catalog;
  const sandbox::ticket& ticket;
};

/// The `tools` array of a `tools/list` result: `run_code` (when the ticket grants
/// `code.execute` and a runtime is installed), `run_tool` (when a registered tool is usable
/// and granted), `put_file`, `get_file`.
nlohmann::json list_tools(const tool_context& c);

/// Arguments that do not fit a tool's input schema: answered as JSON-RPC invalid params.
struct bad_arguments {
  std::string message;  ///< names the argument, e.g. "source: expected a string"
};

/**
 * Decodes the arguments of `run_code` (or of `run_tool` when `tool` is true) into a request.
 * Input files given as text or base64 are stored as blobs of the ticket's tenant first
 * (those given by blob id are only referenced; admission checks they exist). Values over the
 * schema's maxima are refused here, as the schema tells the client; anything else is
 * admission's to judge, so the refusal carries a stable code.
 */
std::variant<run_request, bad_arguments> decode_run_arguments(const nlohmann::json& args,
                                                              const tool_context& c, bool tool,
                                                              blob_store& blobs);

/**
 * The `tools/call` result of a run: `content` and `isError` (true for every code other than
 * `ok`). The first content item is text that starts with the stable code ("ok", "timeout",
 * "approval_required: ..."), then the exit status, usage, stdout and stderr summaries; an
 * `approval_required` result names what a human must approve. Output files that are PNG or
 * JPEG (by their magic bytes) of at most `max_inline_image_bytes` (and
 * `max_inline_images_total` in all) become image content; all other output files resource
 * links to their blob. The last item is the result's JSON.
 */
nlohmann::json call_result(const run_result& r, const blob_store& blobs, std::string_view tenant);

/// Largest output image inlined as image content (base64), in bytes: 4 MiB. A larger one
/// is a resource link.
constexpr std::uint64_t max_inline_image_bytes = 4ULL << 20;
/// Most bytes of images one result inlines, in all: 16 MiB (keeps a response line within
/// what clients read comfortably). Images past it are resource links.
constexpr std::uint64_t max_inline_images_total = 16ULL << 20;

/// A tool error result (`isError` true) whose text is `text`.
nlohmann::json error_result(std::string text);

/// The `put_file` tool: stores `text` or `base64` as a blob of the tenant; the result's
/// text is the blob id (and its size). Store failures are tool errors.
std::variant<nlohmann::json, bad_arguments> put_file(const nlohmann::json& args, blob_store& blobs,
                                                     std::string_view tenant,
                                                     std::uint64_t max_bytes);

/// The `get_file` tool: a blob of the tenant by `blob_id` (or its URI): image content for
/// PNG/JPEG, text for valid UTF-8, else an embedded resource with base64 bytes. An absent
/// blob is a tool error "blob_not_found: ...".
std::variant<nlohmann::json, bad_arguments> get_file(const nlohmann::json& args,
                                                     const blob_store& blobs,
                                                     std::string_view tenant);

}  // namespace sandbox::mcp
