// UTF-8 decoding (utf8.h).
#include "common/utf8.h"

#include <fmt/format.h>

namespace gridsync {

size_t Utf8Sequence(std::string_view text, size_t i, uint32_t* code_point) {
  const auto at = [&](size_t k) { return static_cast<unsigned char>(text[i + k]); };
  if (i >= text.size()) return 0;
  const unsigned char lead = at(0);
  size_t length = 0;
  unsigned char lo = 0x80, hi = 0xbf;  // the second byte's range
  if (lead >= 0xc2 && lead <= 0xdf) {
    length = 2;
  } else if (lead >= 0xe0 && lead <= 0xef) {
    length = 3;
    if (lead == 0xe0) lo = 0xa0;  // overlong below
    if (lead == 0xed) hi = 0x9f;  // surrogates above
  } else if (lead >= 0xf0 && lead <= 0xf4) {
    length = 4;
    if (lead == 0xf0) lo = 0x90;  // overlong below
    if (lead == 0xf4) hi = 0x8f;  // past U+10FFFF above
  } else {
    return 0;
  }
  if (i + length > text.size()) return 0;
  if (at(1) < lo || at(1) > hi) return 0;
  for (size_t k = 2; k < length; ++k) {
    if (at(k) < 0x80 || at(k) > 0xbf) return 0;
  }
  uint32_t cp = lead & (0x7f >> length);
  for (size_t k = 1; k < length; ++k) cp = (cp << 6) | (at(k) & 0x3f);
  *code_point = cp;
  return length;
}

std::string CodePointName(uint32_t code_point) { return fmt::format("U+{:04X}", code_point); }

}  // namespace gridsync
