// UTF-8 decoding, one sequence at a time: the one decoder behind the
// config reader's check of its input (FindInvalidUtf8), the escaping of
// messages (EscapeControlBytes) and the naming of a character a parser
// stopped at.
//
// Thread safety: pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace gridsync {

// The length of the well-formed UTF-8 sequence at text[i] (RFC 3629's
// table: no overlong forms, no surrogates, nothing past U+10FFFF), and its
// code point in *code_point; 0 when the bytes there are not one (an ASCII
// byte included: callers handle those first).
size_t Utf8Sequence(std::string_view text, size_t i, uint32_t* code_point);

// "U+00A0", four hex digits at least.
std::string CodePointName(uint32_t code_point);

}  // namespace gridsync
