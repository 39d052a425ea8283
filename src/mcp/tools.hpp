// Private: the MCP tools of `sandboxctl mcp` (docs/mcp.md): their input schemas, made from
// the host's own limits (the policy's source cap, the ticket's and policy's timeout and
// memory ceilings, the runtimes and registered tools the host has), the decoding of a
// call's arguments into a `run_request`, and the mapping of a `run_result` onto MCP content.
// Pure apart from the blob store it is handed: unit tested with an in-memory one.
#pragma once

#include <chrono>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "sandbox/admission.hpp"
#include "sandbox/blob_store.hpp"
#include "sandbox/interpreter.hpp"
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
  /// The configured runtimes whose interpreter is Python (`is_python_runtime`): those
  /// `run_cell` may open an interpreter session of, when their image is installed.
  std::vector<std::string> python_runtimes = {};
};

/// The `tools` array of a `tools/list` result: `run_code` (when the ticket grants
/// `code.execute` and a runtime is installed), `run_cell` (when it grants `code.execute` and
/// a Python runtime is installed), `run_tool` (when a registered tool is usable and granted),
/// `put_file`, `get_file`.
nlohmann::json list_tools(const tool_context& c);

/// The runtimes `run_cell` offers: the Python runtimes whose image is installed, sorted.
std::vector<std::string> cell_runtimes(const tool_context& c);

/// The secrets `run_code` offers: those the ticket grants (`ticket::secrets`) that the host
/// defines (`host_catalog::secrets`), sorted. Names only: values never reach this room.
std::vector<std::string> offered_secrets(const tool_context& c);

/// The runtime an interpreter session opens with when `run_cell` names none: "python3" when
/// offered, else the first offered; empty when none is.
std::string default_cell_runtime(const tool_context& c);

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

/// The arguments of one `run_cell` call, decoded.
struct cell_arguments {
  std::string code;  ///< the cell's Python source (at most the policy's `max_source_bytes`)
  /// 1..the timeout ceiling; unset: the interpreter's default (`run_request`'s, 2000 ms).
  std::optional<std::chrono::milliseconds> timeout;
  std::optional<std::string> runtime;  ///< one of `cell_runtimes`; unset: the session's own
  bool reset = false;                  ///< close the session first and start a fresh one
  bool operator==(const cell_arguments&) const = default;
};

/// Decodes `run_cell`'s arguments strictly, as its schema states: `code` (required, a string
/// of at most `max_source_bytes`), `timeout_ms` (1..ceiling), `runtime` (one of
/// `cell_runtimes`), `reset` (boolean). Anything else is `bad_arguments` naming the argument.
std::variant<cell_arguments, bad_arguments> decode_cell_arguments(const nlohmann::json& args,
                                                                  const tool_context& c);

/// Which interpreter session ran a cell, for its result's text.
struct cell_session_info {
  std::string runtime;     ///< the session's runtime, e.g. "python3"
  std::uint64_t cell = 0;  ///< the cell's number in its session, from 1
  bool fresh = false;      ///< the session was opened for this call
  /// Why there is a fresh session although there was one before (the previous one lost its
  /// state, ended by itself, or was reset); empty for the MCP session's first.
  std::string previous_ended;
  /// What happened to the previous call's cell when the client cancelled it (its result was
  /// never sent); empty when nothing was cancelled.
  std::string cancelled_before;
};

/**
 * The `tools/call` result of a `run_cell`: `content` and `isError` (true for every code other
 * than `ok`). The first item is text: the stable code (and message), `state: kept` or `state:
 * lost` (then that the session is over and the next call starts a fresh one), which session
 * ran it (fresh, and why the previous one is gone), exit code or signal when the interpreter
 * ended, wall time, the last expression's value, the exception's summary, stdout and stderr
 * summaries. Rich outputs and output files that are PNG or JPEG (by their magic bytes, within
 * the inline caps) become image content, all others resource links (with their MIME type
 * when the cell displayed them). The last item is the cell result's JSON (docs/protocol.md).
 */
nlohmann::json cell_call_result(const cell_result& r, const cell_session_info& s,
                                const blob_store& blobs, std::string_view tenant);

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
