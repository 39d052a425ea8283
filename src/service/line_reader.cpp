// Splitting a client's byte stream into request lines (service/line_reader.hpp).
#include "service/line_reader.hpp"

#include <algorithm>
#include <utility>

#include "service/line_protocol.hpp"

namespace sandbox::service {
namespace {

line_event too_long(std::optional<std::string> id) {
  line_event e;
  e.what = line_event::kind::too_long;
  e.id = std::move(id);
  return e;
}

}  // namespace

line_reader::line_reader(std::size_t max_line_bytes, std::size_t max_id_bytes,
                         std::size_t compact_bytes)
    : max_line_(max_line_bytes), max_id_(max_id_bytes), compact_bytes_(compact_bytes) {}

void line_reader::append(std::string_view bytes) { buf_.append(bytes); }

void line_reader::end_input() {
  if (buf_.size() > pos_ || discarding_) buf_ += '\n';
}

line_event line_reader::next() {
  for (;;) {
    if (discarding_) {
      const auto nl = buf_.find('\n', pos_);
      if (nl == std::string::npos) {
        buf_.clear();
        pos_ = scan_ = 0;
        return {};
      }
      pos_ = scan_ = nl + 1;
      discarding_ = false;
      return too_long(std::exchange(discard_id_, std::nullopt));
    }
    const auto nl = buf_.find('\n', std::max(scan_, pos_));
    if (nl == std::string::npos) {
      if (buf_.size() - pos_ > max_line_) {
        // Never buffer an over-long line: drop what we have and the rest up to its newline
        // (keeping only its leading id, for the answer).
        discard_id_ = leading_id(std::string_view(buf_).substr(pos_), max_id_);
        discarding_ = true;
        buf_.clear();
        pos_ = scan_ = 0;
        continue;
      }
      scan_ = buf_.size();
      return {};
    }
    const std::string_view line(buf_.data() + pos_, nl - pos_);
    pos_ = scan_ = nl + 1;
    if (line.size() > max_line_) return too_long(leading_id(line, max_id_));
    line_event e;
    e.what = line_event::kind::line;
    e.text = line;
    return e;
  }
}

void line_reader::compact() {
  if (pos_ > 0 && (pos_ >= buf_.size() || pos_ >= compact_bytes_)) {
    buf_.erase(0, pos_);
    scan_ = scan_ > pos_ ? scan_ - pos_ : 0;
    pos_ = 0;
  }
}

void line_reader::clear() {
  buf_.clear();
  buf_.shrink_to_fit();
  pos_ = scan_ = 0;
  discarding_ = false;
  discard_id_.reset();
}

}  // namespace sandbox::service
