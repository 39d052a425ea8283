// The MCP tools of `sandboxctl mcp` (tools.hpp): schemas from the host's limits, argument
// decoding, result mapping.
#include "mcp/tools.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>

#include "protocol/base64url.hpp"
#include "sandbox/json.hpp"
#include "sandbox/secrets.hpp"
#include "service/line_protocol.hpp"

namespace sandbox::mcp {
namespace {

using json = nlohmann::json;

// The prefix of `blob_uri`.
constexpr std::string_view blob_uri_prefix = "urn:agent-sandbox:blob:";

// The longest timeout (ms) and largest memory limit (bytes) a call may ask for: the smaller
// of the ticket's and the policy's, exactly as admission clamps (protocol/admission.cpp).
std::int64_t timeout_ceiling_ms(const tool_context& c) {
  return std::min(c.ticket.max_timeout(), c.policy.max_timeout).count();
}
std::uint64_t memory_ceiling_bytes(const tool_context& c) {
  return std::min(c.ticket.max_memory_bytes(), c.policy.max_memory_bytes);
}

// The `files` property, shared by run_code and run_tool.
json files_schema(const sandbox::policy& p) {
  return {{"type", "object"},
          {"description",
           fmt::format("input files by name (at most {}), each given as {{\"text\": UTF-8}}, "
                       "{{\"base64\": bytes}} or {{\"blob_id\": id from put_file}}",
                       p.max_input_files)},
          {"maxProperties", p.max_input_files},
          {"additionalProperties",
           {{"type", "object"},
            {"properties",
             {{"text", {{"type", "string"}}},
              {"base64", {{"type", "string"}, {"contentEncoding", "base64"}}},
              {"blob_id", {{"type", "string"}}}}},
            {"minProperties", 1},
            {"maxProperties", 1},
            {"additionalProperties", false}}}};
}

// The `timeout_ms` and `memory_bytes` properties.
void add_limits(json& props, const tool_context& c) {
  const auto timeout = timeout_ceiling_ms(c);
  const auto memory = memory_ceiling_bytes(c);
  props["timeout_ms"] = {{"type", "integer"},
                         {"minimum", 1},
                         {"maximum", timeout},
                         {"default", std::min<std::int64_t>(2000, timeout)},
                         {"description", "wall-clock limit of the code, in milliseconds"}};
  props["memory_bytes"] = {{"type", "integer"},
                           {"minimum", 1},
                           {"maximum", memory},
                           {"description", "memory limit of the whole run, in bytes"}};
}

// A string argument, or bad_arguments naming it.
std::optional<bad_arguments> get_string(const json& args, const char* name, std::string& out,
                                        bool required) {
  auto it = args.find(name);
  if (it == args.end()) {
    if (required) return bad_arguments{fmt::format("{}: required", name)};
    return std::nullopt;
  }
  if (!it->is_string()) return bad_arguments{fmt::format("{}: expected a string", name)};
  out = it->get<std::string>();
  return std::nullopt;
}

// A positive integer argument no larger than `max`.
std::optional<bad_arguments> get_count(const json& args, const char* name,
                                       std::optional<std::uint64_t>& out, std::uint64_t max) {
  auto it = args.find(name);
  if (it == args.end()) return std::nullopt;
  if (!it->is_number_unsigned() && !it->is_number_integer()) {
    return bad_arguments{fmt::format("{}: expected an integer", name)};
  }
  if (it->is_number_integer() && it->get<std::int64_t>() < 1) {
    return bad_arguments{fmt::format("{}: must be at least 1", name)};
  }
  auto v = it->get<std::uint64_t>();
  if (v > max) return bad_arguments{fmt::format("{}: must be at most {}", name, max)};
  out = v;
  return std::nullopt;
}

// The bytes of a {"text"} or {"base64"} object (put_file's arguments, a run's file).
std::variant<std::string, bad_arguments> bytes_of(const json& v, const std::string& what) {
  if (auto t = v.find("text"); t != v.end()) {
    if (!t->is_string()) return bad_arguments{what + ".text: expected a string"};
    return t->get<std::string>();
  }
  if (auto b = v.find("base64"); b != v.end()) {
    if (!b->is_string()) return bad_arguments{what + ".base64: expected a string"};
    auto bytes = sandbox::detail::base64_decode(b->get_ref<const std::string&>());
    if (!bytes) return bad_arguments{what + ".base64: not valid base64"};
    return std::move(*bytes);
  }
  return bad_arguments{what + ": expected \"text\" or \"base64\""};
}

// Text of a stream's summary section, or nothing when it is empty.
std::string stream_text(const char* name, const stream_capture& s) {
  if (s.total_bytes == 0) return {};
  return fmt::format("--- {} ({} bytes{}) ---\n{}{}", name, s.total_bytes,
                     s.truncated ? ", truncated" : "", s.summary,
                     s.summary.empty() || s.summary.back() == '\n' ? "" : "\n");
}

// Appends a blob of the tenant to `content`: image content when its bytes are PNG or JPEG
// (by their magic bytes) and within the inline caps (`inlined` counts what this result
// inlined so far), else a resource link named `name` (with `mime_type` when known).
void add_blob(json& content, const blob_store& blobs, std::string_view tenant,
              const std::string& name, const std::string& blob, std::uint64_t bytes,
              std::string_view what, std::string_view mime_type, std::uint64_t& inlined) {
  if (bytes <= max_inline_image_bytes && inlined + bytes <= max_inline_images_total) {
    if (auto got = blobs.get(tenant, blob)) {
      if (auto mime = image_mime_type(*got); !mime.empty()) {
        inlined += got->size();
        content.push_back({{"type", "image"},
                           {"data", sandbox::detail::base64_encode(*got)},
                           {"mimeType", mime}});
        return;
      }
    }
  }
  json link = {
      {"type", "resource_link"},
      {"uri", blob_uri(blob)},
      {"name", name},
      {"description", fmt::format("{} '{}', {} bytes (get_file {})", what, name, bytes, blob)},
      {"size", bytes}};
  // (The interpreter's MIME types are the cell's words: only a plain type/subtype is kept.)
  const bool plain = !mime_type.empty() && mime_type.size() <= 127 &&
                     std::count(mime_type.begin(), mime_type.end(), '/') == 1 &&
                     std::all_of(mime_type.begin(), mime_type.end(), [](char ch) {
                       return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
                              (ch >= '0' && ch <= '9') || ch == '/' || ch == '.' || ch == '+' ||
                              ch == '-';
                     });
  if (plain) link["mimeType"] = mime_type;
  content.push_back(std::move(link));
}

// Whether `name` is a registered tool that run_tool's enum lists: installed, usable, granted.
bool is_listed_tool(const tool_context& c, const std::string& name) {
  auto it = c.catalog.tools.find(name);
  return it != c.catalog.tools.end() && it->second.digest && it->second.unusable.empty() &&
         c.ticket.allows_tool(name);
}

}  // namespace

std::string_view image_mime_type(std::string_view bytes) {
  if (bytes.starts_with(std::string_view("\x89PNG\r\n\x1a\n", 8))) return "image/png";
  if (bytes.starts_with("\xff\xd8\xff")) return "image/jpeg";
  return {};
}

std::string blob_uri(std::string_view blob_id) {
  return std::string(blob_uri_prefix) + std::string(blob_id);
}

std::vector<std::string> cell_runtimes(const tool_context& c) {
  std::vector<std::string> out;
  for (const auto& name : c.python_runtimes) {
    auto it = c.catalog.runtimes.find(name);
    if (it != c.catalog.runtimes.end() && it->second) out.push_back(name);
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

std::vector<std::string> offered_secrets(const tool_context& c) {
  std::vector<std::string> out;
  for (const auto& name : c.ticket.secrets()) {
    if (c.catalog.secrets.count(name)) out.push_back(name);
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

std::string default_cell_runtime(const tool_context& c) {
  const auto offered = cell_runtimes(c);
  if (offered.empty()) return {};
  if (std::find(offered.begin(), offered.end(), "python3") != offered.end()) return "python3";
  return offered.front();
}

json list_tools(const tool_context& c) {
  json tools = json::array();
  json runtimes = json::array();
  for (const auto& [name, digest] : c.catalog.runtimes) {
    if (digest) runtimes.push_back(name);
  }
  if (c.ticket.allows(action::code_execute) && !runtimes.empty()) {
    json props = {
        {"runtime", {{"type", "string"}, {"enum", runtimes}, {"description", "the language"}}},
        {"source",
         {{"type", "string"},
          {"maxLength", c.policy.max_source_bytes},
          {"description",
           fmt::format("the program text (UTF-8, at most {} bytes)", c.policy.max_source_bytes)}}},
        {"files", files_schema(c.policy)},
        {"network",
         {{"type", "boolean"},
          {"default", false},
          {"description",
           "the code needs the network (only the egress hosts); needs a grant the "
           "server's ticket may lack, and then a human's approval"}}},
        {"egress",
         {{"type", "array"},
          {"items", {{"type", "string"}}},
          {"description", "host names (or *.suffix) a network run may reach"}}}};
    if (const auto secrets = offered_secrets(c); !secrets.empty()) {
      // Names, the environment variable, the header and the domains: never a value.
      std::string each;
      for (const auto& name : secrets) {
        const auto& d = c.catalog.secrets.at(name);
        const auto colon = d.header.find(':');
        std::string domains;
        for (const auto& dom : d.domains) domains += (domains.empty() ? "" : ", ") + dom;
        each += fmt::format("; {}: ${} in the {} header to {}", name, secret_env_name(name),
                            d.header.substr(0, colon), domains);
      }
      props["secrets"] = {
          {"type", "array"},
          {"items", {{"type", "string"}, {"enum", secrets}}},
          {"uniqueItems", true},
          {"description",
           "host-held secrets the program may use (a network run): inside it sees only a "
           "placeholder, in an environment variable; the egress proxy accepts it only in the "
           "secret's header to the secret's domains and refuses it anywhere else" +
               each}};
    }
    add_limits(props, c);
    tools.push_back(
        {{"name", "run_code"},
         {"title", "Run code in a sandbox"},
         {"description",
          "Runs a program in a fresh sandbox and returns its exit status, stdout and stderr. "
          "Input files are in the directory $SANDBOX_INPUT_DIR; files the program writes to "
          "$SANDBOX_OUTPUT_DIR come back (PNG/JPEG as images, others as links for get_file). "
          "A non-ok outcome is an error whose text starts with its code (timeout, oom, "
          "action_denied, approval_required, ...)."},
         {"inputSchema",
          {{"type", "object"},
           {"properties", props},
           {"required", {"runtime", "source"}},
           {"additionalProperties", false}}}});
  }
  if (const auto python = cell_runtimes(c);
      c.ticket.allows(action::code_execute) && !python.empty()) {
    json props = {
        {"code",
         {{"type", "string"},
          {"maxLength", c.policy.max_source_bytes},
          {"description",
           fmt::format("the cell's Python source (UTF-8, at most {} bytes); the value of its "
                       "last expression comes back",
                       c.policy.max_source_bytes)}}},
        {"runtime",
         {{"type", "string"},
          {"enum", python},
          {"default", default_cell_runtime(c)},
          {"description",
           "the Python runtime of the interpreter session; fixed when the session opens "
           "(give reset to change it)"}}},
        {"reset",
         {{"type", "boolean"},
          {"default", false},
          {"description",
           "end the current interpreter session first (its state is lost) and run the cell "
           "in a fresh one"}}}};
    add_limits(props, c);
    props.erase("memory_bytes");  // the session's memory limit is the host's, not a cell's
    props["timeout_ms"]["description"] =
        "wall-clock limit of this cell, in milliseconds: past it the cell is interrupted "
        "(KeyboardInterrupt; the state is kept) or, when it does not yield, the interpreter is "
        "killed (the state is lost)";
    tools.push_back(
        {{"name", "run_cell"},
         {"title", "Run a cell in a Python interpreter session"},
         {"description",
          "Runs Python code in an interpreter session bound to this MCP session, as a notebook "
          "cell: variables, imports and files persist from one call to the next. Returns the "
          "value of the last expression, stdout and stderr; matplotlib figures come back as "
          "images, files written to $SANDBOX_OUTPUT_DIR as images or links for get_file. The "
          "first call opens the session. A result saying 'state: lost' means the session "
          "ended (the next call starts a fresh one and says so). One cell at a time: a call "
          "while a cell runs is refused with 'capacity'. A non-ok outcome is an error whose "
          "text starts with its code (error, timeout, oom, ...)."},
         {"inputSchema",
          {{"type", "object"},
           {"properties", props},
           {"required", {"code"}},
           {"additionalProperties", false}}}});
  }
  json names = json::array();
  for (const auto& [name, t] : c.catalog.tools) {
    if (is_listed_tool(c, name)) names.push_back(name);
  }
  if (!names.empty()) {
    json props = {
        {"tool", {{"type", "string"}, {"enum", names}, {"description", "the registered tool"}}},
        {"stdin",
         {{"type", "string"},
          {"maxLength", c.policy.max_stdin_bytes},
          {"description", "the tool's standard input (UTF-8)"}}},
        {"files", files_schema(c.policy)}};
    add_limits(props, c);
    tools.push_back({{"name", "run_tool"},
                     {"title", "Run a registered tool"},
                     {"description",
                      "Runs one of the host's registered tools (fixed program and arguments) "
                      "on the given standard input and files, in a sandbox."},
                     {"inputSchema",
                      {{"type", "object"},
                       {"properties", props},
                       {"required", {"tool"}},
                       {"additionalProperties", false}}}});
  }
  tools.push_back(
      {{"name", "put_file"},
       {"title", "Store a file"},
       {"description",
        "Stores bytes as a blob; returns its blob id, for run_code's files ({\"blob_id\"})."},
       {"inputSchema",
        {{"type", "object"},
         {"properties",
          {{"text", {{"type", "string"}}},
           {"base64", {{"type", "string"}, {"contentEncoding", "base64"}}}}},
         {"minProperties", 1},
         {"maxProperties", 1},
         {"additionalProperties", false}}}});
  tools.push_back(
      {{"name", "get_file"},
       {"title", "Fetch a file"},
       {"description",
        "Returns a blob's bytes (an output file's resource link, or a put_file id): images as "
        "image content, UTF-8 as text, other bytes as an embedded base64 resource."},
       {"inputSchema",
        {{"type", "object"},
         {"properties",
          {{"blob_id",
            {{"type", "string"},
             {"description", "sha256:<hex>, or the urn:agent-sandbox:blob: URI of a link"}}}}},
         {"required", {"blob_id"}},
         {"additionalProperties", false}}}});
  return tools;
}

std::variant<run_request, bad_arguments> decode_run_arguments(const json& args,
                                                              const tool_context& c, bool tool,
                                                              blob_store& blobs) {
  run_request req;
  const std::array<std::string_view, 8> code_keys{
      "runtime", "source", "files", "network", "egress", "secrets", "timeout_ms", "memory_bytes"};
  const std::array<std::string_view, 5> tool_keys{"tool", "stdin", "files", "timeout_ms",
                                                  "memory_bytes"};
  for (const auto& [key, value] : args.items()) {
    const bool known = tool ? std::find(tool_keys.begin(), tool_keys.end(), key) != tool_keys.end()
                            : std::find(code_keys.begin(), code_keys.end(), key) != code_keys.end();
    if (!known) {
      return bad_arguments{fmt::format("{}: not an argument of this tool", key)};
    }
  }
  if (tool) {
    if (auto e = get_string(args, "tool", req.tool, true)) return *e;
    if (!is_listed_tool(c, req.tool)) {
      return bad_arguments{
          fmt::format("tool: not one of the tools listed ({})",
                      json(req.tool).dump(-1, ' ', false, json::error_handler_t::replace))};
    }
    std::string in;
    if (args.contains("stdin")) {
      if (auto e = get_string(args, "stdin", in, false)) return *e;
      req.std_in = std::move(in);
    }
  } else {
    if (auto e = get_string(args, "runtime", req.runtime, true)) return *e;
    if (auto it = c.catalog.runtimes.find(req.runtime);
        it == c.catalog.runtimes.end() || !it->second) {
      return bad_arguments{
          fmt::format("runtime: not one of the runtimes listed ({})",
                      json(req.runtime).dump(-1, ' ', false, json::error_handler_t::replace))};
    }
    if (auto e = get_string(args, "source", req.source, true)) return *e;
    if (auto n = args.find("network"); n != args.end()) {
      if (!n->is_boolean()) return bad_arguments{"network: expected a boolean"};
      req.network = n->get<bool>();
    }
    if (auto eg = args.find("egress"); eg != args.end()) {
      if (!eg->is_array()) return bad_arguments{"egress: expected an array of strings"};
      for (const auto& h : *eg) {
        if (!h.is_string()) return bad_arguments{"egress: expected an array of strings"};
        req.egress.push_back(h.get<std::string>());
      }
    }
    if (auto sc = args.find("secrets"); sc != args.end()) {
      // Outside the enum the schema states: refused here (admission checks them again).
      const auto offered = offered_secrets(c);
      if (!sc->is_array()) return bad_arguments{"secrets: expected an array of strings"};
      for (const auto& n : *sc) {
        if (!n.is_string()) return bad_arguments{"secrets: expected an array of strings"};
        const auto name = n.get<std::string>();
        if (std::find(offered.begin(), offered.end(), name) == offered.end()) {
          return bad_arguments{
              fmt::format("secrets: not one of the secrets listed ({})",
                          json(name).dump(-1, ' ', false, json::error_handler_t::replace))};
        }
        if (std::find(req.secrets.begin(), req.secrets.end(), name) != req.secrets.end()) {
          return bad_arguments{fmt::format("secrets: {} named twice", json(name).dump())};
        }
        req.secrets.push_back(name);
      }
    }
  }
  std::optional<std::uint64_t> timeout, memory;
  if (auto e = get_count(args, "timeout_ms", timeout,
                         static_cast<std::uint64_t>(timeout_ceiling_ms(c)))) {
    return *e;
  }
  if (auto e = get_count(args, "memory_bytes", memory, memory_ceiling_bytes(c))) return *e;
  if (timeout) req.timeout = std::chrono::milliseconds(static_cast<std::int64_t>(*timeout));
  if (memory) req.memory_limit_bytes = *memory;
  if (auto f = args.find("files"); f != args.end()) {
    if (!f->is_object()) return bad_arguments{"files: expected an object of name to file"};
    if (f->size() > c.policy.max_input_files) {
      return bad_arguments{fmt::format("files: at most {} files", c.policy.max_input_files)};
    }
    for (const auto& [name, v] : f->items()) {
      const std::string what = "files." + name;
      if (!v.is_object() || v.size() != 1) {
        return bad_arguments{what + ": expected one of \"text\", \"base64\", \"blob_id\""};
      }
      if (auto id = v.find("blob_id"); id != v.end()) {
        if (!id->is_string()) return bad_arguments{what + ".blob_id: expected a string"};
        auto s = id->get<std::string>();
        if (s.starts_with(blob_uri_prefix)) s.erase(0, blob_uri_prefix.size());
        req.files_in.push_back({.name = name, .blob = std::move(s)});
        continue;
      }
      auto bytes = bytes_of(v, what);
      if (auto* e = std::get_if<bad_arguments>(&bytes)) return *e;
      auto& b = std::get<std::string>(bytes);
      if (b.size() > c.policy.max_input_bytes) {
        return bad_arguments{
            fmt::format("{}: larger than {} bytes", what, c.policy.max_input_bytes)};
      }
      auto id = blobs.put(c.ticket.tenant(), b);
      if (!id) return bad_arguments{fmt::format("{}: not stored: {}", what, id.error().message())};
      req.files_in.push_back({.name = name, .blob = *id});
    }
  }
  return req;
}

std::variant<cell_arguments, bad_arguments> decode_cell_arguments(const json& args,
                                                                  const tool_context& c) {
  static constexpr std::array<std::string_view, 4> keys{"code", "timeout_ms", "runtime", "reset"};
  for (const auto& [key, value] : args.items()) {
    if (std::find(keys.begin(), keys.end(), key) == keys.end()) {
      return bad_arguments{fmt::format("{}: not an argument of this tool", key)};
    }
  }
  cell_arguments out;
  if (auto e = get_string(args, "code", out.code, true)) return *e;
  if (out.code.size() > c.policy.max_source_bytes) {
    return bad_arguments{fmt::format("code: longer than {} bytes", c.policy.max_source_bytes)};
  }
  std::optional<std::uint64_t> timeout;
  if (auto e = get_count(args, "timeout_ms", timeout,
                         static_cast<std::uint64_t>(timeout_ceiling_ms(c)))) {
    return *e;
  }
  if (timeout) out.timeout = std::chrono::milliseconds(static_cast<std::int64_t>(*timeout));
  if (args.contains("runtime")) {
    std::string name;
    if (auto e = get_string(args, "runtime", name, false)) return *e;
    const auto offered = cell_runtimes(c);
    if (std::find(offered.begin(), offered.end(), name) == offered.end()) {
      return bad_arguments{
          fmt::format("runtime: not one of the Python runtimes listed ({})",
                      json(name).dump(-1, ' ', false, json::error_handler_t::replace))};
    }
    out.runtime = std::move(name);
  }
  if (auto r = args.find("reset"); r != args.end()) {
    if (!r->is_boolean()) return bad_arguments{"reset: expected a boolean"};
    out.reset = r->get<bool>();
  }
  return out;
}

json cell_call_result(const cell_result& r, const cell_session_info& s, const blob_store& blobs,
                      std::string_view tenant) {
  std::string text(to_string(r.code));
  if (!r.message.empty()) text += ": " + r.message;
  text += "\n";
  if (r.state == interpreter_state::kept) {
    text += "state: kept\n";
  } else {
    text +=
        "state: lost (the interpreter session is over: its variables, imports and files are "
        "gone; the next run_cell starts a fresh session)\n";
  }
  if (!s.cancelled_before.empty()) text += "previous call: " + s.cancelled_before + "\n";
  if (s.fresh) {
    text += fmt::format("session: fresh ({}){}\n", s.runtime,
                        s.previous_ended.empty() ? "" : ": " + s.previous_ended);
  } else {
    text += fmt::format("session: {}, cell {}\n", s.runtime, s.cell);
  }
  if (r.exit_code) text += fmt::format("exit code: {}\n", *r.exit_code);
  if (r.signal) text += fmt::format("signal: {}\n", *r.signal);
  text += fmt::format("wall {} ms\n", r.usage.wall.count());
  if (!r.value.empty()) {
    text += fmt::format("--- value{} ---\n{}\n", r.value_truncated ? " (truncated)" : "", r.value);
  }
  if (!r.error.empty()) {
    text += fmt::format("--- error ---\n{}{}", r.error, r.error.back() == '\n' ? "" : "\n");
  }
  text += stream_text("stdout", r.std_out);
  text += stream_text("stderr", r.std_err);
  if (r.outputs_truncated) text += "some outputs or files were over a cap and dropped\n";
  if (r.frames_dropped != 0) {
    text += fmt::format("{} frame(s) of the interpreter's channel dropped\n", r.frames_dropped);
  }
  json content = json::array({{{"type", "text"}, {"text", std::move(text)}}});
  std::uint64_t inlined = 0;
  for (std::size_t i = 0; i < r.outputs.size(); ++i) {
    const auto& o = r.outputs[i];
    add_blob(content, blobs, tenant, fmt::format("output-{}", i + 1), o.blob, o.bytes,
             "displayed output", o.mime_type, inlined);
  }
  for (const auto& f : r.files_out) {
    add_blob(content, blobs, tenant, f.name, f.blob, f.bytes, "output file", {}, inlined);
  }
  content.push_back({{"type", "text"}, {"text", service::encode_cell_result(r)}});
  return {{"content", std::move(content)}, {"isError", r.code != code::ok}};
}

json error_result(std::string text) {
  return {{"content", json::array({{{"type", "text"}, {"text", std::move(text)}}})},
          {"isError", true}};
}

json call_result(const run_result& r, const blob_store& blobs, std::string_view tenant) {
  std::string text(to_string(r.code));
  if (!r.message.empty()) text += ": " + r.message;
  text += "\n";
  if (r.code == code::approval_required && r.approval) {
    const auto& a = *r.approval;
    std::string domains;
    for (const auto& d : a.domains) domains += (domains.empty() ? "" : ", ") + d;
    text += fmt::format(
        "A human must approve network access to [{}] for ticket '{}' (tenant '{}', {} ms, "
        "source sha256 {}). This server never grants it itself: the operator approves it "
        "(the result's \"approval\" object, below, is the request for sandboxctl ticket "
        "derive --approval) and restarts the server bound to the derived ticket; then call "
        "again with the same arguments.\n",
        domains, a.ticket_id, a.tenant, a.timeout.count(), a.source_sha256);
  }
  if (r.exit_code) text += fmt::format("exit code: {}\n", *r.exit_code);
  if (r.signal) text += fmt::format("signal: {}\n", *r.signal);
  if (!r.backend.empty()) {
    text += fmt::format("wall {} ms, cpu {} ms, peak memory {} bytes, {} (timeout {} ms{})\n",
                        r.usage.wall.count(), r.usage.cpu.count(), r.usage.peak_memory_bytes,
                        to_string(r.isolation), r.timeout.count(),
                        r.timeout_clamped ? ", clamped" : "");
  }
  text += stream_text("stdout", r.std_out);
  text += stream_text("stderr", r.std_err);
  for (const auto& d : r.files_dropped) {
    text += fmt::format("output '{}' dropped: {}\n", d.name_display, to_string(d.reason));
  }
  json content = json::array({{{"type", "text"}, {"text", std::move(text)}}});
  std::uint64_t inlined = 0;
  for (const auto& f : r.files_out) {
    add_blob(content, blobs, tenant, f.name, f.blob, f.bytes, "output file", {}, inlined);
  }
  content.push_back({{"type", "text"}, {"text", encode(r)}});
  return {{"content", std::move(content)}, {"isError", r.code != code::ok}};
}

std::variant<json, bad_arguments> put_file(const json& args, blob_store& blobs,
                                           std::string_view tenant, std::uint64_t max_bytes) {
  for (const auto& [key, v] : args.items()) {
    if (key != "text" && key != "base64") {
      return bad_arguments{fmt::format("{}: not an argument of this tool", key)};
    }
  }
  if (args.size() != 1) return bad_arguments{"give exactly one of \"text\" or \"base64\""};
  auto bytes = bytes_of(args, "file");
  if (auto* e = std::get_if<bad_arguments>(&bytes)) return *e;
  const auto& b = std::get<std::string>(bytes);
  if (b.size() > max_bytes) return error_result(fmt::format("too_large: over {} bytes", max_bytes));
  auto id = blobs.put(tenant, b);
  if (!id) return error_result("blob_store: " + id.error().message());
  return json{{"content", json::array({{{"type", "text"}, {"text", *id}}})}, {"isError", false}};
}

std::variant<json, bad_arguments> get_file(const json& args, const blob_store& blobs,
                                           std::string_view tenant) {
  for (const auto& [key, v] : args.items()) {
    if (key != "blob_id")
      return bad_arguments{fmt::format("{}: not an argument of this tool", key)};
  }
  std::string id;
  if (auto e = get_string(args, "blob_id", id, true)) return *e;
  if (id.starts_with(blob_uri_prefix)) id.erase(0, blob_uri_prefix.size());
  auto bytes = blobs.get(tenant, id);
  if (!bytes)
    return error_result(fmt::format("blob_not_found: {}: {}", id, bytes.error().message()));
  json item;
  if (auto mime = image_mime_type(*bytes); !mime.empty()) {
    item = {
        {"type", "image"}, {"data", sandbox::detail::base64_encode(*bytes)}, {"mimeType", mime}};
  } else if (is_valid_utf8(*bytes)) {
    item = {{"type", "text"}, {"text", *bytes}};
  } else {
    item = {{"type", "resource"},
            {"resource",
             {{"uri", blob_uri(id)},
              {"mimeType", "application/octet-stream"},
              {"blob", sandbox::detail::base64_encode(*bytes)}}}};
  }
  return json{{"content", json::array({item})}, {"isError", false}};
}

}  // namespace sandbox::mcp
