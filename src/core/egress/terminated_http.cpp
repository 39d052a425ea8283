// HTTP/1.1 inside a terminated TLS tunnel (terminated_http.hpp).
#include "core/egress/terminated_http.hpp"

#include <algorithm>
#include <cctype>
#include <functional>

#include "core/egress/parsers.hpp"
#include "sandbox/egress.hpp"

namespace sandbox::detail {

namespace {

constexpr std::uint64_t max_chunk_bytes = 1ULL << 40;
constexpr std::size_t max_chunk_line_bytes = 4096;  // a response's size line, extensions too
constexpr std::size_t max_trailer_bytes = 16384;    // a response's trailer section

bool iequals(std::string_view a, std::string_view b) noexcept {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) ==
                  std::tolower(static_cast<unsigned char>(y));
         });
}

std::string fill_template(std::string_view tmpl, std::string_view with) {
  std::string out(tmpl);
  const auto at = out.find("{value}");
  if (at != std::string::npos) out.replace(at, 7, with);
  return out;
}

// 1*HEXDIG within `max_chunk_bytes`, nothing else.
std::optional<std::uint64_t> parse_chunk_size(std::string_view s) noexcept {
  if (s.empty() || s.size() > 11) return std::nullopt;
  std::uint64_t v = 0;
  for (const char c : s) {
    int d = 0;
    if (c >= '0' && c <= '9') {
      d = c - '0';
    } else if (c >= 'a' && c <= 'f') {
      d = c - 'a' + 10;
    } else if (c >= 'A' && c <= 'F') {
      d = c - 'A' + 10;
    } else {
      return std::nullopt;
    }
    v = v * 16 + static_cast<std::uint64_t>(d);
  }
  if (v > max_chunk_bytes) return std::nullopt;
  return v;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Redaction

stream_replacer::stream_replacer(std::string needle, std::string replacement)
    : needle_(std::move(needle)), replacement_(std::move(replacement)) {}

void stream_replacer::feed(std::string_view in, std::string& out) {
  if (needle_.empty()) {
    out.append(in);
    return;
  }
  held_.append(in);
  const std::boyer_moore_horspool_searcher searcher(needle_.begin(), needle_.end());
  std::size_t from = 0;
  for (;;) {
    const auto it =
        std::search(held_.begin() + static_cast<std::ptrdiff_t>(from), held_.end(), searcher);
    if (it == held_.end()) break;
    const auto at = static_cast<std::size_t>(it - held_.begin());
    out.append(held_, from, at - from);
    out.append(replacement_);
    from = at + needle_.size();
  }
  // Hold back a tail shorter than the needle: it may be the start of an occurrence.
  const std::size_t keep = std::min(held_.size() - from, needle_.size() - 1);
  out.append(held_, from, held_.size() - from - keep);
  held_.erase(0, held_.size() - keep);
}

void stream_replacer::finish(std::string& out) {
  out.append(held_);
  held_.clear();
}

echo_redactor::echo_redactor(const std::vector<secret_injection>& secrets) {
  for (const auto& s : secrets) {
    if (s.value && !s.value->empty()) stages_.emplace_back(*s.value, s.placeholder);
  }
}

void echo_redactor::feed(std::string_view in, std::string& out) {
  std::string cur(in);
  for (auto& s : stages_) {
    std::string next;
    s.feed(cur, next);
    cur = std::move(next);
  }
  out.append(cur);
}

void echo_redactor::finish(std::string& out) {
  std::string cur;
  for (auto& s : stages_) {
    std::string next;
    s.feed(cur, next);
    s.finish(next);
    cur = std::move(next);
  }
  out.append(cur);
}

// ---------------------------------------------------------------------------------------------
// Requests

terminated_http::terminated_http(std::string host, std::vector<secret_injection> secrets,
                                 l7_rules* rules)
    : host_(std::move(host)), secrets_(std::move(secrets)), rules_(rules) {
  std::vector<std::string> placeholders;
  for (const auto& s : secrets_) placeholders.push_back(s.placeholder);
  marks_ = placeholder_marks(placeholders);
}

std::optional<http_refusal> terminated_http::refuse(unsigned status, std::string_view reason,
                                                    std::string rule, std::string advice) {
  rq_ = req_state::refused;
  rq_buf_.clear();
  return http_refusal{status, std::string(reason), std::move(rule), std::move(advice)};
}

std::optional<http_refusal> terminated_http::scan_body(std::string_view data) {
  if (rq_scan_ && rq_scan_->feed(data)) {
    refused_in_body_ = true;
    return refuse(403, secret_misuse_reason);
  }
  return std::nullopt;
}

std::optional<http_refusal> terminated_http::relay_body_bytes(std::string& out) {
  const auto n = static_cast<std::size_t>(std::min<std::uint64_t>(rq_left_, rq_buf_.size()));
  if (auto r = scan_body(std::string_view(rq_buf_).substr(0, n))) return r;
  // A body of unknown length under a rule: counted as it goes, refused where it crosses the
  // rule's byte budget (nothing of that piece goes upstream).
  if (rq_count_body_ && rules_->take_bytes(rq_rule_, n) < n) {
    refused_in_body_ = true;
    return refuse(403, budget_exhausted_reason, rules_->rule(rq_rule_).name,
                  rules_->spent_advice(rq_rule_));
  }
  up(std::string_view(rq_buf_).substr(0, n), out);
  rq_buf_.erase(0, n);
  rq_left_ -= n;
  return std::nullopt;
}

bool terminated_http::awaiting_response() const noexcept {
  return !pending_.empty() ||
         (rs_ != resp_state::head && rs_ != resp_state::done && rs_ != resp_state::failed);
}

bool terminated_http::can_answer_refusal() const noexcept {
  return rs_ == resp_state::head && rs_buf_.empty() &&
         pending_.size() <= (refused_in_body_ ? 1U : 0U);
}

void terminated_http::up(std::string_view data, std::string& out) {
  if (!holding_) {
    out.append(data);
    return;
  }
  held_up_.append(data);
  if (held_up_.size() > max_judged_request_bytes) release(out);  // judged as it goes on
}

void terminated_http::release(std::string& out) {
  out += held_up_;
  held_up_.clear();
  holding_ = false;
}

std::optional<http_refusal> terminated_http::request_head(std::string& out) {
  auto [status, head] = parse_http_request_head(rq_buf_, max_terminated_head_bytes);
  switch (status) {
    case http_head_status::need_more:
      return std::nullopt;
    case http_head_status::malformed:
      return refuse(400, "malformed request");
    case http_head_status::too_large:
      return refuse(431, "malformed request");
    case http_head_status::complete:
      break;
  }
  // A placeholder in the request line is never where its value goes.
  if (holds_placeholder(head.method, marks_) || holds_placeholder(head.target, marks_)) {
    return refuse(403, secret_misuse_reason);
  }
  std::string rebuilt = head.method + " " + head.target + " " + head.version + "\r\n";
  for (const auto& [name, value] : head.headers) {
    std::string v = value;
    if (holds_placeholder(name, marks_)) return refuse(403, secret_misuse_reason);
    if (holds_placeholder(v, marks_)) {
      bool injected = false;
      for (const auto& s : secrets_) {
        if (!iequals(name, s.header_name) || !egress_allowed(s.domains, host_)) continue;
        if (v == fill_template(s.header_template, s.placeholder)) {
          v = fill_template(s.header_template, *s.value);
          injected = true;
          break;
        }
      }
      if (!injected) return refuse(403, secret_misuse_reason);
    }
    rebuilt += name;
    rebuilt += ": ";
    rebuilt += v;
    rebuilt += "\r\n";
  }
  rebuilt += "\r\n";
  if (head.version != "HTTP/1.1") return refuse(501, "unsupported request");
  if (head.method == "CONNECT") return refuse(501, "unsupported request");
  if (!(head.target.starts_with("/") || (head.method == "OPTIONS" && head.target == "*"))) {
    return refuse(400, "malformed request");
  }
  const std::string* host_field = head.find("Host");
  const auto auth = host_field ? parse_authority(*host_field, 443) : std::nullopt;
  if (!auth || auth->ip_literal || !same_host(auth->host, host_)) {
    return refuse(400, "malformed request");
  }
  if (head.find("Upgrade") != nullptr) return refuse(501, "unsupported request");
  const std::string* te = head.find("Transfer-Encoding");
  const std::string* cl = head.find("Content-Length");
  std::uint64_t length = 0;  // without Transfer-Encoding
  if (te != nullptr) {
    if (!iequals(*te, "chunked")) return refuse(501, "unsupported request");
  } else if (cl != nullptr) {
    const auto n = parse_content_length(*cl);
    if (!n) return refuse(400, "malformed request");
    length = *n;
  }
  // L7 rules: judged on the head as sent, before anything of the request goes upstream.
  rq_rule_ = no_rule;
  rq_count_body_ = false;
  if (rules_ != nullptr && rules_->applies(host_)) {
    const auto body = te != nullptr ? std::nullopt : std::optional<std::uint64_t>(length);
    l7_verdict v = rules_->admit(host_, head.method, head.target, body);
    judged_.push_back(judged_request{.method = display_target(head.method),
                                     .path = display_target(target_path(head.target)),
                                     .rule = v.rule_names,
                                     .allowed = v.allowed,
                                     .reason = v.reason});
    if (!v.allowed) {
      return refuse(v.status, v.reason, std::move(v.rule_names), std::move(v.advice));
    }
    rq_rule_ = v.rule;
    rq_count_body_ = te != nullptr;
  }
  rq_buf_.erase(0, head.head_bytes);
  rq_scan_.emplace(marks_);
  if (te != nullptr) {
    rq_ = req_state::chunk_size;
  } else {
    rq_left_ = length;
    rq_ = rq_left_ > 0 ? req_state::body : req_state::head;
  }
  pending_.push_back(pending_response{.head = head.method == "HEAD", .rule = rq_rule_});
  // Held back with the start of its body: a body that fits is judged whole before anything
  // of the request goes upstream.
  held_up_ = std::move(rebuilt);
  holding_ = true;
  if (rq_ == req_state::head) release(out);
  return std::nullopt;
}

std::optional<http_refusal> terminated_http::from_client(std::string_view in, std::string& out) {
  if (rq_ == req_state::refused) return http_refusal{400, "malformed request"};
  rq_buf_.append(in);
  for (;;) {
    switch (rq_) {
      case req_state::refused:
        return http_refusal{400, "malformed request"};
      case req_state::head: {
        if (rq_buf_.empty()) return std::nullopt;
        // Parse only once the head's end arrived (no quadratic re-parsing of a slow client).
        if (rq_buf_.find("\r\n\r\n") == std::string::npos) {
          if (rq_buf_.size() > max_terminated_head_bytes) return refuse(431, "malformed request");
          return std::nullopt;
        }
        const std::size_t before = pending_.size();
        if (auto r = request_head(out)) return r;
        if (pending_.size() == before) return std::nullopt;  // need more
        break;
      }
      case req_state::body: {
        if (rq_buf_.empty()) return std::nullopt;
        if (auto r = relay_body_bytes(out)) return r;
        if (rq_left_ == 0) {
          rq_ = req_state::head;
          release(out);
        }
        break;
      }
      case req_state::chunk_size: {
        const auto eol = rq_buf_.find("\r\n");
        if (eol == std::string::npos) {
          if (rq_buf_.size() > 16) return refuse(400, "malformed request");
          return std::nullopt;
        }
        const auto size = parse_chunk_size(std::string_view(rq_buf_).substr(0, eol));
        if (!size) return refuse(400, "malformed request");
        up(std::string_view(rq_buf_).substr(0, eol + 2), out);
        rq_buf_.erase(0, eol + 2);
        rq_left_ = *size;
        rq_ = *size == 0 ? req_state::trailer : req_state::chunk_data;
        break;
      }
      case req_state::chunk_data: {
        if (rq_buf_.empty()) return std::nullopt;
        if (auto r = relay_body_bytes(out)) return r;
        if (rq_left_ == 0) rq_ = req_state::chunk_crlf;
        break;
      }
      case req_state::chunk_crlf:
      case req_state::trailer: {
        // After chunk data, and after the last chunk (no trailer fields): exactly CRLF.
        if (rq_buf_.size() < 2) {
          if (!rq_buf_.empty() && rq_buf_[0] != '\r') return refuse(400, "malformed request");
          return std::nullopt;
        }
        if (rq_buf_[0] != '\r' || rq_buf_[1] != '\n') return refuse(400, "malformed request");
        up("\r\n", out);
        rq_buf_.erase(0, 2);
        if (rq_ == req_state::trailer) {
          rq_ = req_state::head;
          release(out);
        } else {
          rq_ = req_state::chunk_size;
        }
        break;
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Responses

void terminated_http::emit_chunk(std::string_view data, std::string& out) {
  if (data.empty()) return;
  static constexpr char hex[] = "0123456789abcdef";
  std::string size;
  for (std::size_t n = data.size(); n > 0; n /= 16) size.insert(size.begin(), hex[n % 16]);
  out += size;
  out += "\r\n";
  out.append(data);
  out += "\r\n";
}

bool terminated_http::emit_body(std::string_view data, std::string& out) {
  bool cut = false;
  if (rs_rule_ != no_rule && rules_ != nullptr) {
    const auto granted = static_cast<std::size_t>(rules_->take_bytes(rs_rule_, data.size()));
    cut = granted < data.size();
    data = data.substr(0, granted);
  }
  std::string piece;
  rs_redact_->feed(data, piece);
  emit_chunk(piece, out);
  return !cut;
}

void terminated_http::end_response(std::string& out) {
  std::string tail;
  if (rs_redact_) rs_redact_->finish(tail);
  emit_chunk(tail, out);
  out += "0\r\n\r\n";
  rs_redact_.reset();
  rs_ = resp_state::head;
}

// Reads a complete response head from rs_buf_ (false: need more, or failed: rs_ says).
bool terminated_http::response_head(std::string& out) {
  const auto end = rs_buf_.find("\r\n\r\n");
  if (end == std::string::npos) {
    if (rs_buf_.size() > max_terminated_head_bytes) rs_ = resp_state::failed;
    return false;
  }
  const std::size_t head_bytes = end + 4;
  if (head_bytes > max_terminated_head_bytes) {
    rs_ = resp_state::failed;
    return false;
  }
  const auto line_end = rs_buf_.find("\r\n");
  const std::string_view line(rs_buf_.data(), line_end);
  // status-line = HTTP-version SP 3DIGIT SP [ reason-phrase ]
  if (line.size() < 12 || !line.starts_with("HTTP/1.") || line[8] != ' ' || line[12] != ' ' ||
      !std::isdigit(static_cast<unsigned char>(line[9])) ||
      !std::isdigit(static_cast<unsigned char>(line[10])) ||
      !std::isdigit(static_cast<unsigned char>(line[11])) ||
      std::any_of(line.begin(), line.end(), [](char c) {
        return (static_cast<unsigned char>(c) < 0x20 && c != '\t') || c == 0x7F;
      })) {
    rs_ = resp_state::failed;
    return false;
  }
  const unsigned code =
      static_cast<unsigned>((line[9] - '0') * 100 + (line[10] - '0') * 10 + (line[11] - '0'));
  // The fields, read by the request-head parser's strict rules under a stand-in request line.
  const std::string fields =
      "GET / HTTP/1.1\r\n" + rs_buf_.substr(line_end + 2, head_bytes - line_end - 2);
  auto [status, head] = parse_http_request_head(fields, max_terminated_head_bytes + 32);
  if (status != http_head_status::complete || pending_.empty() || code == 101 || code < 100) {
    rs_ = resp_state::failed;
    return false;
  }
  std::string status_line(line);
  rs_buf_.erase(0, head_bytes);
  std::string raw;  // the head as it goes to the client, before redaction
  const bool informational = code < 200;
  const bool no_body = informational || pending_.front().head || code == 204 || code == 304;
  raw = status_line + "\r\n";
  const std::string* te = head.find("Transfer-Encoding");
  const std::string* cl = head.find("Content-Length");
  for (const auto& [name, value] : head.headers) {
    if (!no_body && (iequals(name, "Content-Length") || iequals(name, "Transfer-Encoding"))) {
      continue;
    }
    raw += name + ": " + value + "\r\n";
  }
  if (!no_body) raw += "Transfer-Encoding: chunked\r\n";
  raw += "\r\n";
  echo_redactor head_redact(secrets_);
  head_redact.feed(raw, out);
  head_redact.finish(out);
  if (informational) return true;  // the final response is still to come
  rs_rule_ = pending_.front().rule;
  pending_.pop_front();
  if (no_body) {
    rs_ = resp_state::head;
    return true;
  }
  rs_redact_.emplace(secrets_);
  if (te != nullptr) {
    if (!iequals(*te, "chunked")) {
      rs_ = resp_state::failed;
      return false;
    }
    rs_ = resp_state::chunk_size;
  } else if (cl != nullptr) {
    const auto n = parse_content_length(*cl);
    if (!n) {
      rs_ = resp_state::failed;
      return false;
    }
    rs_left_ = *n;
    if (rs_left_ == 0) {
      end_response(out);
    } else {
      rs_ = resp_state::body_length;
    }
  } else {
    rs_ = resp_state::body_close;
    close_after_ = true;
  }
  return true;
}

std::optional<http_refusal> terminated_http::from_origin(std::string_view in, std::string& out) {
  const auto failed = [this] {
    rs_ = resp_state::failed;
    return http_refusal{502, "malformed response"};
  };
  // The response crossed its rule's byte budget: what fit was handed over, the rest is cut.
  const auto cut = [this] {
    rs_ = resp_state::failed;
    return http_refusal{403, std::string(budget_exhausted_reason), rules_->rule(rs_rule_).name,
                        rules_->spent_advice(rs_rule_)};
  };
  if (rs_ == resp_state::failed || rs_ == resp_state::done) return failed();
  rs_buf_.append(in);
  for (;;) {
    switch (rs_) {
      case resp_state::failed:
      case resp_state::done:
        return failed();
      case resp_state::head:
        if (rs_buf_.empty()) return std::nullopt;
        if (!response_head(out)) {
          if (rs_ == resp_state::failed) return failed();
          return std::nullopt;
        }
        break;
      case resp_state::body_close: {
        const bool whole = emit_body(rs_buf_, out);
        rs_buf_.clear();
        if (!whole) return cut();
        return std::nullopt;
      }
      case resp_state::body_length:
      case resp_state::chunk_data: {
        if (rs_buf_.empty()) return std::nullopt;
        const auto n = static_cast<std::size_t>(std::min<std::uint64_t>(rs_left_, rs_buf_.size()));
        if (!emit_body(std::string_view(rs_buf_).substr(0, n), out)) return cut();
        rs_buf_.erase(0, n);
        rs_left_ -= n;
        if (rs_left_ == 0) {
          if (rs_ == resp_state::body_length) {
            end_response(out);
          } else {
            rs_ = resp_state::chunk_crlf;
          }
        }
        break;
      }
      case resp_state::chunk_size: {
        const auto eol = rs_buf_.find("\r\n");
        if (eol == std::string::npos) {
          if (rs_buf_.size() > max_chunk_line_bytes) return failed();
          return std::nullopt;
        }
        std::string_view line(rs_buf_.data(), eol);
        line = line.substr(0, line.find(';'));  // extensions are dropped
        while (!line.empty() && (line.back() == ' ' || line.back() == '\t')) line.remove_suffix(1);
        const auto size = parse_chunk_size(line);
        if (!size) return failed();
        rs_buf_.erase(0, eol + 2);
        rs_left_ = *size;
        rs_ = *size == 0 ? resp_state::trailer : resp_state::chunk_data;
        break;
      }
      case resp_state::chunk_crlf:
        if (rs_buf_.size() < 2) return std::nullopt;
        if (rs_buf_[0] != '\r' || rs_buf_[1] != '\n') return failed();
        rs_buf_.erase(0, 2);
        rs_ = resp_state::chunk_size;
        break;
      case resp_state::trailer: {
        // Trailer fields are dropped (the client gets a bare last chunk).
        const auto end = rs_buf_.starts_with("\r\n") ? std::size_t{0} : rs_buf_.find("\r\n\r\n");
        if (end == std::string::npos) {
          if (rs_buf_.size() > max_trailer_bytes) return failed();
          return std::nullopt;
        }
        rs_buf_.erase(0, end == 0 ? 2 : end + 4);
        end_response(out);
        break;
      }
    }
  }
}

bool terminated_http::origin_closed(std::string& out) {
  if (rs_ == resp_state::body_close) {
    end_response(out);
    rs_ = resp_state::done;
    return true;
  }
  return rs_ == resp_state::head && rs_buf_.empty() && pending_.empty();
}

}  // namespace sandbox::detail
