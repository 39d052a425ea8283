// One MCP session: dispatch, tools and runs (session.hpp).
#include "mcp/session.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/bind_executor.hpp>
#include <boost/asio/error.hpp>
#include <iostream>
#include <utility>
#include <vector>

#include "mcp/server.hpp"
#include "mcp/tools.hpp"

namespace sandbox::mcp {
namespace {

using json = nlohmann::json;

tool_context context_of(const server_context& c, const host_catalog& catalog) {
  return {.policy = c.runtime.policy(),
          .catalog = catalog,
          .ticket = c.ticket,
          .python_runtimes = c.python_runtimes};
}

}  // namespace

session::session(const server_context& context) : c_(context), interpreter_(context) {}

session::~session() = default;

void session::handle_line(std::string_view line, reply_handler reply) {
  if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
  if (line.find_first_not_of(" \t") == std::string_view::npos) {  // blank line
    reply(std::nullopt);
    return;
  }
  auto parsed = parse_line(line);
  if (auto* r = std::get_if<refusal>(&parsed)) {
    reply(std::move(r->line));
    return;
  }
  handle(std::get<message>(parsed), std::move(reply));
}

void session::handle(const message& m, reply_handler reply) {
  if (closing_ || m.is_response) {  // the server sends no requests: nothing to match
    reply(std::nullopt);
    return;
  }
  if (m.is_notification) {
    handle_notification(m);
    reply(std::nullopt);
    return;
  }
  if (m.method == "initialize") {
    initialize(m, reply);
    return;
  }
  if (m.method == "ping") {
    reply(result_line(m.id, json::object()));
    return;
  }
  if (!initialized_) {
    reply(error_line(m.id, rpc_error::invalid_request,
                     "invalid request: not initialized (send \"initialize\" first)"));
    return;
  }
  if (m.method == "tools/list") {
    auto catalog = c_.runtime.catalog();
    reply(result_line(m.id, {{"tools", list_tools(context_of(c_, catalog))}}));
  } else if (m.method == "tools/call") {
    call(m, std::move(reply));
  } else {
    reply(error_line(m.id, rpc_error::method_not_found,
                     "method not found: " + m.method.substr(0, 128)));
  }
}

void session::handle_notification(const message& m) {
  if (m.method == "notifications/cancelled") {
    if (auto id = m.params.find("requestId"); id != m.params.end()) cancel(*id);
  }
  // notifications/initialized and any other notification: nothing to do.
}

bool session::cancel(const json& id) {
  auto it = in_flight_.find(id.dump());
  if (it == in_flight_.end()) return false;
  std::cerr << "sandboxctl: mcp: request " << it->first << " cancelled by the client\n";
  cancelled_.insert(it->first);
  // A copy: the completion may run inside emit() (a fake backend) and erase the entry.
  auto signal = it->second;
  signal->emit(boost::asio::cancellation_type::terminal);
  return true;
}

void session::async_close(std::function<void()> done) {
  if (closing_) return;
  closing_ = true;
  closed_ = std::move(done);
  // A copy: a completion may erase its entry while the others are being cancelled.
  std::vector<std::shared_ptr<boost::asio::cancellation_signal>> signals;
  for (auto& [key, signal] : in_flight_) signals.push_back(signal);
  for (auto& signal : signals) signal->emit(boost::asio::cancellation_type::terminal);
  // Last (its completion may come inside this call, and `done` may destroy this session).
  interpreter_.async_close([this] {
    interpreter_closed_ = true;
    settle_if_closed();
  });
}

void session::settle_if_closed() {
  if (!closing_ || !in_flight_.empty() || !interpreter_closed_ || !closed_) return;
  // Last: `done` may destroy this session.
  auto done = std::exchange(closed_, nullptr);
  done();
}

void session::initialize(const message& m, reply_handler& reply) {
  std::string asked;
  if (auto v = m.params.find("protocolVersion"); v != m.params.end() && v->is_string()) {
    asked = v->get<std::string>();
  } else {
    reply(error_line(m.id, rpc_error::invalid_params,
                     "invalid params: \"protocolVersion\" must be a string"));
    return;
  }
  initialized_ = true;
  reply(result_line(
      m.id, {{"protocolVersion", is_known_revision(asked) ? asked : std::string(protocol_revision)},
             {"capabilities", {{"tools", {{"listChanged", false}}}}},
             {"serverInfo", {{"name", "agent-sandbox"}, {"version", SANDBOX_PROJECT_VERSION}}},
             {"instructions",
              "Runs code in a sandbox under the host's ticket. Non-ok outcomes are tool "
              "errors whose text starts with the stable code."}}));
}

void session::call(const message& m, reply_handler reply) {
  auto name = m.params.find("name");
  if (name == m.params.end() || !name->is_string()) {
    reply(error_line(m.id, rpc_error::invalid_params, "invalid params: \"name\" is required"));
    return;
  }
  json args = json::object();
  if (auto a = m.params.find("arguments"); a != m.params.end()) {
    if (!a->is_object()) {
      reply(error_line(m.id, rpc_error::invalid_params,
                       "invalid params: \"arguments\" must be an object"));
      return;
    }
    args = *a;
  }
  const auto tool = name->get<std::string>();
  auto& rt = c_.runtime;
  auto catalog = rt.catalog();
  const auto ctx = context_of(c_, catalog);
  auto tools = list_tools(ctx);
  const bool listed =
      std::any_of(tools.begin(), tools.end(), [&](const json& t) { return t["name"] == tool; });
  if (!listed) {
    reply(error_line(m.id, rpc_error::invalid_params,
                     "invalid params: unknown tool " +
                         json(tool).dump(-1, ' ', false, json::error_handler_t::replace)));
    return;
  }
  auto blobs = rt.blobs();
  auto answer = [&](std::variant<json, bad_arguments> r) {
    if (auto* e = std::get_if<bad_arguments>(&r)) {
      reply(error_line(m.id, rpc_error::invalid_params, "invalid params: " + e->message));
    } else {
      reply(result_line(m.id, std::get<json>(std::move(r))));
    }
  };
  if (tool == "put_file") {
    answer(put_file(args, *blobs, c_.ticket.tenant(), rt.policy().max_input_bytes));
    return;
  }
  if (tool == "get_file") {
    answer(get_file(args, *blobs, c_.ticket.tenant()));
    return;
  }
  if (tool == "run_cell") {
    run_cell(m, args, std::move(reply));
    return;
  }
  auto req = decode_run_arguments(args, ctx, tool == "run_tool", *blobs);
  if (auto* e = std::get_if<bad_arguments>(&req)) {
    reply(error_line(m.id, rpc_error::invalid_params, "invalid params: " + e->message));
    return;
  }
  auto signal = admit(m, reply);
  if (!signal) return;
  // The completion runs on the session's executor whatever thread the runtime completes on.
  rt.async_run(
      std::get<run_request>(std::move(req)), c_.ticket,
      boost::asio::bind_cancellation_slot(
          signal->slot(),
          boost::asio::bind_executor(
              c_.executor, [this, id = m.id, signal, reply = std::move(reply)](
                               boost::system::error_code ec, sandbox::run_result r) {
                const auto key = id.dump();
                if (ec == boost::asio::error::operation_aborted) {
                  std::cerr << "sandboxctl: mcp: run " << r.run_id << " of request " << key
                            << " killed and gone\n";
                }
                finish(key, reply,
                       result_line(id, call_result(r, *c_.runtime.blobs(), c_.ticket.tenant())));
              })));
}

std::shared_ptr<boost::asio::cancellation_signal> session::admit(const message& m,
                                                                 reply_handler& reply) {
  const auto key = m.id.dump();
  if (in_flight_.count(key) != 0) {
    reply(error_line(m.id, rpc_error::invalid_request,
                     "invalid request: a request with this id is in flight"));
    return nullptr;
  }
  if (in_flight_.size() >= c_.max_in_flight) {
    reply(result_line(
        m.id, error_result(fmt::format("capacity: {} calls of this client are in flight already",
                                       c_.max_in_flight))));
    return nullptr;
  }
  auto signal = std::make_shared<boost::asio::cancellation_signal>();
  in_flight_.emplace(key, signal);
  return signal;
}

void session::finish(const std::string& key, const reply_handler& reply,
                     std::optional<std::string> answer) {
  in_flight_.erase(key);
  const bool by_client = cancelled_.erase(key) != 0;
  // A request the client cancelled is never answered (MCP, "Cancellation"); nor is any once
  // the session is closing (the client is gone).
  reply(by_client || closing_ ? std::nullopt : std::move(answer));
  settle_if_closed();
}

}  // namespace sandbox::mcp

namespace sandbox::mcp {

void session::run_cell(const message& m, const json& args, reply_handler reply) {
  auto catalog = c_.runtime.catalog();
  const auto ctx = context_of(c_, catalog);
  auto call = decode_cell_arguments(args, ctx);
  if (auto* e = std::get_if<bad_arguments>(&call)) {
    reply(error_line(m.id, rpc_error::invalid_params, "invalid params: " + e->message));
    return;
  }
  auto signal = admit(m, reply);
  if (!signal) return;
  interpreter_.run(
      std::get<cell_arguments>(call), ctx, signal->slot(),
      [this, id = m.id, signal, reply = std::move(reply)](std::optional<json> result) {
        // (nullopt: the interpreter's own answer to a cancelled cell, none)
        finish(id.dump(), reply,
               result ? std::optional(result_line(id, std::move(*result))) : std::nullopt);
      });
}

}  // namespace sandbox::mcp
