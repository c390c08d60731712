// Text helpers shared by the classifier's source files (not a public header):
// UTF-8 boundaries and bounded copies of untrusted text.
#ifndef MINERU_HEALTH_SRC_TEXT_FORMS_H_
#define MINERU_HEALTH_SRC_TEXT_FORMS_H_

#include <cstddef>
#include <string>

namespace mineru_health::text {

// Length of the valid UTF-8 sequence starting at text[i], or 0 when the bytes
// there are not one.
std::size_t utf8_sequence_length(const std::string& text, std::size_t i);

// Moves `pos` back to the start of the UTF-8 sequence it falls in; `text`
// must be valid UTF-8.
std::size_t floor_to_boundary(const std::string& text, std::size_t pos);

// At most `max_bytes` of `text`, from its start.
std::string truncated_copy(const std::string& text, std::size_t max_bytes);

// At most about `max_bytes` of `message`: when longer, its head and tail
// halves joined by a line "...", so that no pattern using '.' spans the cut.
// An exception's type tends to be echoed at the start of its message and its
// root cause at the end.
std::string head_and_tail(const std::string& message, std::size_t max_bytes);

// A window of at most `max_bytes` of valid UTF-8 around [begin, end) of
// `sanitized`.
std::string window_excerpt(const std::string& sanitized, std::size_t begin,
                           std::size_t end, std::size_t max_bytes);

// The first `max_bytes` of `sanitized`, cut on a character boundary.
std::string head_excerpt(const std::string& sanitized, std::size_t max_bytes);

}  // namespace mineru_health::text

#endif  // MINERU_HEALTH_SRC_TEXT_FORMS_H_
