// The daemon's line protocol (private to the service room; docs/protocol.md, "Service
// mode"): reading one request line into what it asks for, and writing the answer lines.
// Pure — no I/O, no daemon state beyond what is passed in — so every refusal and its exact
// answer is unit-tested here.
//
// A line is read in two steps, in the order the answers depend on:
//   1. `read_request_line`: the envelope — strict JSON (duplicate keys, invalid UTF-8,
//      trailing garbage refused, as for every protocol document), an object, a valid `id`,
//      exactly one operation and no unknown member, an id not already in flight. A line
//      refused here is answered by the returned `answer`.
//   2. `read_<operation>`: the operation's own members (and, for runs, replays and session
//      opens, the ticket and the document they carry). Refused: the `answer` to write.
// The strict JSON reader and the field helpers come from the protocol room
// (protocol/json_strict.hpp); only this file's implementation uses them.
#pragma once

#include <cstddef>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <variant>

#include "sandbox/interpreter.hpp"
#include "sandbox/protocol.hpp"
#include "sandbox/record.hpp"
#include "sandbox/session.hpp"
#include "sandbox/signed_ticket.hpp"
#include "sandbox/ticket.hpp"
#include "service/service.hpp"

namespace sandbox::service {

// --- reading ---------------------------------------------------------------------------------

/// One answer line, newline included, ready to write to the client.
struct answer {
  std::string line;
  bool operator==(const answer&) const = default;
};

/// A line that carries no request (empty, or only blanks): it is not answered.
struct blank_line {
  bool operator==(const blank_line&) const = default;
};

/// What a request line asks for.
enum class request_kind {
  run,                  ///< `{"id","ticket","request"[,"record"]}`
  blob_put,             ///< `{"id","blob_put":{"tenant","data_b64"}}`
  blob_get,             ///< `{"id","blob_get":{"tenant","blob"}}`
  replay,               ///< `{"id","replay":{"ticket","record"}}`
  session_open,         ///< `{"id","session_open":{"ticket","request"}}`
  session_write,        ///< `{"id","session_write":{"session","data_b64"|"text"}}`
  session_close_stdin,  ///< `{"id","session_close_stdin":{"session"}}`
  session_close,        ///< `{"id","session_close":{"session"}}`
  service_stats,        ///< `{"id","service_stats":{}}`
  interp_open,  ///< `{"id","interp_open":{"ticket","runtime"[,"max_lifetime_ms","idle_timeout_ms"]}}`
  interp_execute,  ///< `{"id","interp_execute":{"session","code"[,"timeout_ms","files_in"]}}`
  interp_close,    ///< `{"id","interp_close":{"session"}}`
};

/// A request line whose envelope is well-formed (step 1).
struct request_line {
  std::string id;  ///< 1..max_id_bytes bytes, not in flight when read
  request_kind kind = request_kind::run;
  /// `run`: the line's object itself (its `ticket` and `request` members are present);
  /// every other kind: the value of the operation's member, not checked yet.
  nlohmann::json body;
  bool record = false;  ///< `run` only: `"record": true` (answer with the run's record too)
};

/**
 * Step 1: reads the envelope of one line (without its newline). `in_flight` holds the ids
 * of this connection's requests in flight: a line reusing one is refused with `"id": null`
 * (under its own id, a client that matches answers by id would hand the error to the
 * request in flight). A line that cannot be parsed is answered with the id its first bytes
 * name (`leading_id`) unless that id is in flight; with two ids, with none.
 *
 * Throws only `std::bad_alloc` (the caller answers `internal`).
 */
std::variant<blank_line, request_line, answer> read_request_line(
    std::string_view line, const service_limits& limits, const std::set<std::string>& in_flight);

/**
 * The id of a line that could not be parsed (malformed JSON, too deep, too long, ...), when
 * it can be read without parsing: the line starts, after optional whitespace, with
 * `{"id":"<id>"` (JSON whitespace allowed between the tokens), and <id> is a valid id
 * (1..max_id_bytes bytes of valid UTF-8) written without escapes or control characters. Its
 * error answer then carries that id (docs/protocol.md, "Service mode"), so a client that
 * matches answers by id learns which request failed.
 */
std::optional<std::string> leading_id(std::string_view line, std::size_t max_id_bytes = 128);

/// A ticket as a line carries it (`ticket` member): verified against `trusted_keys` when
/// there are any (then only a signed document is a ticket: an unsigned one is
/// `action_denied`), else decoded as a plain ticket, trusted as sent. Rejections' messages
/// start with "ticket: ".
boost::system::result<sandbox::ticket, sandbox::rejection> read_ticket(
    const nlohmann::json& ticket_doc, const sandbox::ticket_verifier& trusted_keys);

/// A run line's ticket and request. Refused (a `result` answer with the rejected result):
/// a ticket that is not one, a request that does not decode ("request: ..." messages).
struct run_line {
  sandbox::ticket ticket;
  sandbox::run_request request;
};
std::variant<run_line, answer> read_run(const request_line& line,
                                        const sandbox::ticket_verifier& trusted_keys);

/// `blob_put`: the tenant and the decoded bytes. Refused: `invalid_request` (shape, base64,
/// tenant name) or `too_large` (over `max_blob_put_bytes` decoded).
struct blob_put_line {
  std::string tenant;
  std::string data;
};
std::variant<blob_put_line, answer> read_blob_put(const request_line& line,
                                                  const service_limits& limits);

/// `blob_get`: the tenant and blob id. Refused: `invalid_request` (shape, tenant name, id).
struct blob_get_line {
  std::string tenant;
  std::string blob;
};
std::variant<blob_get_line, answer> read_blob_get(const request_line& line);

/// `replay`: the ticket and the run record. Refused: `invalid_request` for the shape; a
/// `result` answer with the rejected result for the ticket, or a record that does not
/// decode ("replay.record: ...").
struct replay_line {
  sandbox::ticket ticket;
  sandbox::run_record record;
};
std::variant<replay_line, answer> read_replay(const request_line& line,
                                              const sandbox::ticket_verifier& trusted_keys);

/// `session_open`: the ticket and the session request. Refused: `invalid_request` for the
/// shape or the request ("session_open.request: ..."), the ticket's rejection code for the
/// ticket ("session_open.ticket: ...").
struct session_open_line {
  sandbox::ticket ticket;
  sandbox::session_request request;
};
std::variant<session_open_line, answer> read_session_open(
    const request_line& line, const sandbox::ticket_verifier& trusted_keys);

/// `session_write`: the session and the bytes for its server's stdin (`data_b64` decoded, or
/// `text` as is). Refused: `invalid_request`.
struct session_write_line {
  std::string session;
  std::string data;
};
std::variant<session_write_line, answer> read_session_write(const request_line& line);

/// `session_close_stdin` and `session_close`: the session named. Refused: `invalid_request`.
std::variant<std::string, answer> read_session_ref(const request_line& line);

/// `interp_open`: the ticket and the interpreter request. Refused: `invalid_request` for the
/// shape ("interp_open.runtime: ..."), the ticket's rejection code for the ticket.
struct interp_open_line {
  sandbox::ticket ticket;
  sandbox::interpreter_request request;
};
std::variant<interp_open_line, answer> read_interp_open(
    const request_line& line, const sandbox::ticket_verifier& trusted_keys);

/// `interp_execute`: the interpreter named and one cell. Refused: `invalid_request`.
struct interp_execute_line {
  std::string session;
  sandbox::cell_request cell;
};
std::variant<interp_execute_line, answer> read_interp_execute(const request_line& line);

/// `interp_close`: the interpreter named. Refused: `invalid_request`.
std::variant<std::string, answer> read_interp_close(const request_line& line);

/// A cell's result as the `cell_result` answer's JSON object (docs/protocol.md).
std::string encode_cell_result(const sandbox::cell_result& r);

/// `service_stats`: an empty object. Refused: `invalid_request`.
std::optional<answer> read_service_stats(const request_line& line);

// --- writing ---------------------------------------------------------------------------------

/// `s` as a JSON string (invalid UTF-8 replaced).
std::string json_string(std::string_view s);

/// `{"id":<id or null>,"<key>":<value_json>}` and a newline.
std::string answer_line(const std::optional<std::string>& id, std::string_view key,
                        std::string_view value_json);

/// `{"id":…,"error":{"code":…,"message":…}}` and a newline.
std::string error_line(const std::optional<std::string>& id, std::string_view code,
                       std::string_view message);

/// `{"id":…,"result":{…}}` and a newline.
std::string result_line(const std::string& id, const sandbox::run_result& r);

/// `{"id":…,"result":{…},"record":{…}}` and a newline: the record (made from the request and
/// ticket the run was started with) embeds the same result, for the client to checkpoint.
std::string result_with_record_line(const std::string& id, const sandbox::run_result& r,
                                    const sandbox::run_request& request,
                                    const sandbox::ticket& ticket);

/// The answer to a line over `max_line_bytes` (id: the line's leading id, if to be echoed).
std::string line_too_long_line(const std::optional<std::string>& id, std::size_t max_line_bytes);

/// `{"session":S,"stdout":B64}` and a newline: stdout bytes of a session's server.
std::string session_stdout_event(std::string_view session, std::string_view bytes);
/// `{"session":S,"eof":true}` and a newline: the server's stdout ended.
std::string session_eof_event(std::string_view session);

/// `'id'` for a message about a request id (quoted, cut to 64 bytes, display-safe).
std::string quote_id(std::string_view id);

}  // namespace sandbox::service
