// Splitting a client's byte stream into request lines (private to the service room). Pure:
// bytes in, lines out, no I/O, so it is unit-tested on its own.
//
// Memory stays bounded whatever the client sends: a line longer than the limit is never
// buffered. Its bytes are dropped as they stream in, up to its newline, and it comes out as
// one `too_long` event carrying only the id its first bytes named (`leading_id`), for the
// error answer.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

namespace sandbox::service {

/// What `line_reader::next` found.
struct line_event {
  enum class kind {
    none,      ///< no complete line yet: read more
    line,      ///< `text` is one line, without its newline
    too_long,  ///< a line over the limit was dropped; `id` is its leading id, if any
  };
  kind what = kind::none;
  /// The line (`kind::line`): a view into the reader's buffer, valid until the next call
  /// that changes the reader (`append`, `end_input`, `next`, `compact`, `clear`).
  std::string_view text;
  std::optional<std::string> id;  ///< `kind::too_long`: the dropped line's `leading_id`
};

/// A client's unconsumed input and where the next line starts. Not thread-safe (one
/// connection's strand uses it).
class line_reader {
 public:
  /// Lines longer than `max_line_bytes` (without the newline) come out as `too_long`;
  /// `max_id_bytes` bounds the id read from such a line. Consumed bytes are dropped from
  /// the buffer once they are all consumed or at least `compact_bytes` (`compact`).
  line_reader(std::size_t max_line_bytes, std::size_t max_id_bytes, std::size_t compact_bytes);

  /// Adds bytes read from the client.
  void append(std::string_view bytes);
  /// The client's input ended: a last line without its newline still counts, and an
  /// over-long line being dropped ends (and is reported).
  void end_input();
  /// The next line or over-long line, or `kind::none` when no newline is buffered.
  line_event next();
  /// Drops consumed bytes once they are all consumed or the consumed prefix is large.
  void compact();
  /// Drops everything buffered and frees the buffer (no more requests will be read).
  void clear();
  /// True when buffered bytes are not consumed yet (part of a line, or lines `next` has not
  /// returned). The bytes of an over-long line being dropped are not buffered.
  bool has_pending() const noexcept { return pos_ < buf_.size(); }

 private:
  std::size_t max_line_;
  std::size_t max_id_;
  std::size_t compact_bytes_;
  std::string buf_;                        ///< bytes read and not yet consumed, from `pos_`
  std::size_t pos_ = 0;                    ///< start of the first unconsumed line
  std::size_t scan_ = 0;                   ///< where the search for the next newline resumes
  bool discarding_ = false;                ///< inside an over-long line: dropping its bytes
  std::optional<std::string> discard_id_;  ///< that line's leading id, if any
};

}  // namespace sandbox::service
