// The two text forms rules are matched on (sanitized UTF-8 and the compact
// form), and bounded, boundary-safe copies of untrusted text.
#include "text_forms.h"

#include <algorithm>
#include <array>

#include "mineru_health/classifier.h"

namespace mineru_health {

namespace text {

std::size_t utf8_sequence_length(const std::string& text, std::size_t i) {
  const auto byte = [&](std::size_t k) {
    return static_cast<unsigned char>(text[k]);
  };
  const unsigned char b0 = byte(i);
  if (b0 < 0x80) return 1;
  // Overlong forms, surrogates (such as Python's 'surrogatepass' writes) and
  // code points above U+10FFFF are not valid sequences.
  std::size_t length = 0;
  unsigned char lo = 0x80;
  unsigned char hi = 0xBF;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    length = 2;
  } else if (b0 == 0xE0) {
    length = 3;
    lo = 0xA0;
  } else if (b0 == 0xED) {
    length = 3;
    hi = 0x9F;  // D800..DFFF are surrogates
  } else if (b0 >= 0xE1 && b0 <= 0xEF) {
    length = 3;
  } else if (b0 == 0xF0) {
    length = 4;
    lo = 0x90;
  } else if (b0 >= 0xF1 && b0 <= 0xF3) {
    length = 4;
  } else if (b0 == 0xF4) {
    length = 4;
    hi = 0x8F;
  } else {
    return 0;
  }
  if (i + length > text.size()) return 0;
  const unsigned char b1 = byte(i + 1);
  if (b1 < lo || b1 > hi) return 0;
  for (std::size_t k = 2; k < length; ++k) {
    const unsigned char b = byte(i + k);
    if (b < 0x80 || b > 0xBF) return 0;
  }
  return length;
}

std::size_t floor_to_boundary(const std::string& text, std::size_t pos) {
  if (pos >= text.size()) return text.size();
  while (pos > 0 && (static_cast<unsigned char>(text[pos]) & 0xC0) == 0x80) {
    --pos;
  }
  return pos;
}

std::string truncated_copy(const std::string& text, std::size_t max_bytes) {
  return text.size() <= max_bytes ? text : text.substr(0, max_bytes);
}

std::string head_and_tail(const std::string& message, std::size_t max_bytes) {
  if (message.size() <= max_bytes) return message;
  const std::size_t half = max_bytes / 2;
  std::string out;
  out.reserve(max_bytes + 8);
  out.append(message, 0, half);
  out.append("\n...\n");
  out.append(message, message.size() - half, half);
  return out;
}

std::string head_excerpt(const std::string& sanitized, std::size_t max_bytes) {
  if (sanitized.size() <= max_bytes) return sanitized;
  return sanitized.substr(0, floor_to_boundary(sanitized, max_bytes));
}

std::string window_excerpt(const std::string& sanitized, std::size_t begin,
                           std::size_t end, std::size_t max_bytes) {
  if (sanitized.size() <= max_bytes) return sanitized;
  const std::size_t match_length = end - begin;
  std::size_t start = 0;
  if (match_length >= max_bytes) {
    start = begin;
  } else {
    const std::size_t context = (max_bytes - match_length) / 2;
    start = begin > context ? begin - context : 0;
  }
  start = std::min(start, sanitized.size() - max_bytes);
  start = floor_to_boundary(sanitized, start);
  const std::size_t stop = floor_to_boundary(sanitized, start + max_bytes);
  return sanitized.substr(start, stop - start);
}

}  // namespace text

std::string sanitize_utf8(const std::string& input) {
  static constexpr char kReplacement[] = "\xEF\xBF\xBD";
  std::string out;
  out.reserve(input.size());
  const std::size_t size = input.size();
  std::size_t i = 0;
  std::size_t run_start = 0;  // start of the valid bytes not yet copied
  bool in_invalid_run = false;
  while (i < size) {
    // Runs of ASCII are the common case: skip them without decoding.
    while (i < size && static_cast<unsigned char>(input[i]) < 0x80) ++i;
    if (i == size) break;
    const std::size_t length = text::utf8_sequence_length(input, i);
    if (length > 0) {
      i += length;
      continue;
    }
    out.append(input, run_start, i - run_start);
    // One U+FFFD per run of bad bytes keeps the output no larger than twice
    // the input whatever the bytes are.
    if (!in_invalid_run || run_start != i) out.append(kReplacement, 3);
    in_invalid_run = true;
    ++i;
    run_start = i;
  }
  out.append(input, run_start, size - run_start);
  return out;
}

std::string compact_form(const std::string& input) {
  // 0: drop; 1: keep as is (ASCII lower case, digits, non-ASCII);
  // 2: lower-case.
  static const auto kAction = [] {
    std::array<unsigned char, 256> table{};
    for (int c = 0; c < 256; ++c) {
      if (c >= 0x80 || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9')) {
        table[static_cast<std::size_t>(c)] = 1;
      } else if (c >= 'A' && c <= 'Z') {
        table[static_cast<std::size_t>(c)] = 2;
      }
    }
    return table;
  }();
  std::string out(input.size(), '\0');
  char* const begin = out.data();
  char* dst = begin;
  for (char c : input) {
    const unsigned char u = static_cast<unsigned char>(c);
    const unsigned char action = kAction[u];
    // Branch-free: always write, advance only past kept bytes. Adding 32
    // lower-cases an ASCII capital.
    *dst = static_cast<char>(u + (action == 2 ? 32 : 0));
    dst += action != 0;
  }
  out.resize(static_cast<std::size_t>(dst - begin));
  return out;
}

}  // namespace mineru_health
