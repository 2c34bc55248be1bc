#pragma once
// JsonReader: a cursor over JSON text, for the small hand-written parsers of
// files Cohort reads from outside (a safetensors header, GPT-2's
// encoder.json). It reads the pieces (whitespace, punctuation, string
// literals with all of JSON's escapes, non-negative integers, objects, any
// value to skip) and leaves the document's shape to its caller, which knows
// what each field means and how an error in its file should read.
//
// The text is untrusted (conventions: Crash policy): its size is the
// caller's to bound before it gets here; SkipValue, the only recursion,
// refuses nesting deeper than kMaxJsonSkipDepth; integers are checked for
// overflow; every read is checked against the end of the text.
//
// Errors: every one is the caller's `make_error(reader, reason)`, with a
// reason such as "unterminated string", so that the caller names its file,
// picks the status code and says where: pos() (a byte offset) or line().
//
// Not thread-safe (a cursor). It keeps a view of the text, which must
// outlive it.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace cohort {

// Nesting SkipValue accepts in the values it skips (a key the caller does
// not know may hold anything, but not a stack overflow).
inline constexpr int kMaxJsonSkipDepth = 32;

class JsonReader {
 public:
  // Turns a reason into the caller's error; `reader` is where it was found.
  using MakeError = std::function<absl::Status(const JsonReader& reader, absl::string_view reason)>;

  JsonReader(absl::string_view text, MakeError make_error)
      : text_(text), make_error_(std::move(make_error)) {}

  // The byte the cursor is at, and the total size, in bytes.
  size_t pos() const { return pos_; }
  size_t size() const { return text_.size(); }
  // The line of pos(), from 1: the newlines skipped so far (JSON has them
  // only between tokens) plus one.
  int line() const { return line_; }

  // The caller's error for `reason` at the current position.
  absl::Status Error(absl::string_view reason) const { return make_error_(*this, reason); }

  // Skips spaces, tabs, carriage returns and newlines (counting lines).
  void SkipSpace();
  bool AtEnd() const { return pos_ >= text_.size(); }
  // The next byte, or '\0' at the end.
  char Peek() const { return AtEnd() ? '\0' : text_[pos_]; }

  // Consumes `c` (after whitespace) when it is next.
  bool Consume(char c);
  // Consumes `c` (after whitespace), or the error "expected 'c'".
  absl::Status Expect(char c);

  // A string literal (after whitespace), decoded into `out` as UTF-8: JSON's
  // escapes \" \\ \/ \b \f \n \r \t and \uXXXX, a surrogate pair as one code
  // point. Refuses an unescaped control character, an unknown escape and an
  // unpaired surrogate.
  absl::Status String(std::string* out);

  // A non-negative integer (after whitespace) without sign, fraction,
  // exponent or leading zero, that fits in 64 bits.
  absl::Status Unsigned(uint64_t* out);
  // [n, n, ...] of non-negative integers.
  absl::Status UnsignedArray(std::vector<uint64_t>* out);

  // The run of characters JSON numbers are made of (digits, + - . e E)
  // after whitespace, consumed but not checked: for callers that check the
  // number's form themselves and name it in their error. Empty when none.
  absl::string_view NumberText();

  // {"key": value, ...}: calls on_member(key) with the cursor before each
  // value, which on_member must consume.
  absl::Status Object(const std::function<absl::Status(const std::string& key)>& on_member);

  // Any value, discarded; `depth` is the nesting it is found at.
  absl::Status SkipValue(int depth = 0);

 private:
  // Four hex digits of a \u escape into `out`, consumed; false (nothing
  // consumed) when the next four bytes are not that.
  bool Hex4(uint32_t* out);

  absl::string_view text_;
  MakeError make_error_;
  size_t pos_ = 0;
  int line_ = 1;
};

}  // namespace cohort
