#include "run_python_tool.hpp"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/json.hpp>
#include <boost/json/src.hpp>  // Boost.JSON header-only: this example links only sandbox::testing
#include <exception>
#include <string>
#include <tuple>

namespace example {

namespace json = boost::json;
using namespace std::string_literals;

run_python_tool::run_python_tool(sandbox::runtime& rt, sandbox::ticket ticket, options opts)
    : rt_(rt), ticket_(std::move(ticket)), opts_(opts) {}

std::variant<sandbox::run_request, std::string> run_python_tool::build_request(
    std::string_view arguments_json) const {
  auto bad = [](std::string what) { return "Error: invalid tool arguments: " + what; };
  boost::system::error_code ec;
  json::value args = json::parse(arguments_json, ec);
  if (ec) return bad("not valid JSON");
  const json::object* obj = args.if_object();
  if (obj == nullptr) return bad("expected a JSON object");

  sandbox::run_request req;
  req.runtime = "python3";
  req.timeout = opts_.default_timeout;
  bool has_code = false;
  for (const auto& [key, value] : *obj) {
    if (key == "code") {
      if (!value.is_string()) return bad("'code' must be a string");
      req.source = std::string(value.get_string());
      has_code = true;
    } else if (key == "timeout_seconds") {
      if (!value.is_number()) return bad("'timeout_seconds' must be a number");
      json::error_code nec;
      auto seconds = value.to_number<double>(nec);
      if (nec || !(seconds >= 1 && seconds <= 3600)) {
        return bad("'timeout_seconds' must be between 1 and 3600");
      }
      req.timeout = std::chrono::milliseconds(static_cast<long long>(seconds * 1000));
    } else if (key == "files") {
      const json::object* files = value.if_object();
      if (files == nullptr) return bad("'files' must be an object of name: content");
      for (const auto& [name, content] : *files) {
        if (!content.is_string()) return bad("files['" + std::string(name) + "'] must be a string");
        // Files reach the sandbox only as blobs of the ticket's tenant.
        auto id = rt_.blobs()->put(ticket_.tenant(), content.get_string());
        if (!id)
          return "Error: the input files could not be stored ("s + id.error().message() + ")";
        req.files_in.push_back({.name = std::string(name), .blob = *id});
      }
    } else {
      return bad("unknown field '" + std::string(key) + "'");
    }
  }
  if (!has_code) return bad("'code' is required");
  return req;
}

std::string run_python_tool::format_reply(const sandbox::run_result& r) {
  using sandbox::code;
  std::string out;
  auto streams = [&] {
    if (!r.std_out.summary.empty()) out += "stdout:\n" + r.std_out.summary;
    if (r.std_out.truncated) {
      out += "\n(stdout cut: " + std::to_string(r.std_out.total_bytes) + " bytes written)";
    }
    if (!r.std_err.summary.empty()) {
      if (!out.empty() && out.back() != '\n') out += '\n';
      out += "stderr:\n" + r.std_err.summary;
    }
  };
  switch (r.code) {
    case code::ok:
      if (r.exit_code) {
        out = "exit code " + std::to_string(*r.exit_code) + "\n";
      } else if (r.signal) {
        out = "killed by signal " + std::to_string(*r.signal) + "\n";
      }
      streams();
      for (const auto& f : r.files_out) {
        if (!out.empty() && out.back() != '\n') out += '\n';
        out += "output file " + f.name + " (" + std::to_string(f.bytes) + " bytes)\n";
      }
      if (!r.files_dropped.empty()) {
        out += std::to_string(r.files_dropped.size()) + " output file(s) not returned\n";
      }
      return out;
    case code::timeout:
      out = "Error: the code ran longer than " + std::to_string(r.timeout.count()) +
            " ms and was stopped. Make it faster or do less per call.\n";
      streams();
      return out;
    case code::oom:
      out = "Error: the code ran out of memory (limit " +
            std::to_string(r.memory_limit_bytes >> 20) + " MiB) and was stopped.\n";
      streams();
      return out;
    case code::pids_limit:
      out = "Error: the code started too many processes and was stopped. Use fewer.\n";
      streams();
      return out;
    case code::network_disabled: {
      out = "Error: network access is disabled in this sandbox";
      if (!r.egress_attempts.empty()) {
        const auto& e = r.egress_attempts.front();
        out += "; the code tried to reach " + (e.host.empty() ? e.address : e.host);
        if (e.port != 0) out += ":" + std::to_string(e.port);
      }
      out += ". Work only with the files provided.\n";
      streams();
      return out;
    }
    case code::seccomp_violation:
      return "Error: the code used a forbidden operation (" + r.violation.value_or("unknown") +
             ") and was stopped.\n";
    case code::invalid_request:
    case code::source_too_large:
      return "Error: the request was rejected: " + r.message + "\n";
    case code::blob_not_found:
      return "Error: an input file is missing: " + r.message + "\n";
    case code::action_denied:
    case code::approval_denied:
      return "Error: running code is not allowed here.\n";
    case code::approval_required:
      return "Error: this needs approval from the user first.\n";
    case code::output_limit:
      return "Error: the code produced more output than allowed.\n";
    case code::queue_timeout:
    case code::capacity:
      return "Error: the sandbox is busy; try again shortly.\n";
    case code::runtime_unavailable:
    case code::digest_mismatch:
    case code::internal:
    case code::error:  // an interpreter cell's code; never a run's
      break;
  }
  return "Error: the sandbox is unavailable (" + std::string(sandbox::to_string(r.code)) + ").\n";
}

std::string run_python_tool::call(std::string_view arguments_json) const {
  try {
    auto req = build_request(arguments_json);
    if (auto* err = std::get_if<std::string>(&req)) return *err;
    return format_reply(rt_.run(std::move(std::get<sandbox::run_request>(req)), ticket_));
  } catch (const std::exception&) {
    return "Error: the tool failed.\n";
  }
}

boost::asio::awaitable<std::string> run_python_tool::async_call(std::string arguments_json) const {
  auto req = build_request(arguments_json);
  if (auto* err = std::get_if<std::string>(&req)) co_return *err;
  auto [ec, result] =
      co_await rt_.async_run(std::move(std::get<sandbox::run_request>(req)), ticket_,
                             boost::asio::as_tuple(boost::asio::use_awaitable));
  if (ec == boost::asio::error::operation_aborted) co_return "Error: the run was cancelled.\n";
  co_return format_reply(result);
}

}  // namespace example
