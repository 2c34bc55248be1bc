// JsonReader: string literals with every escape and surrogate pairs decoded,
// integers bounded to 64 bits, objects and skipped values with bounded
// nesting, and every malformed input an error from the caller's make_error
// with the position and line it was found at, never a read past the text.

#include "common/json_reader.h"

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace cohort {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Errors say "byte P line L: reason", so the tests can check all three.
JsonReader Reader(absl::string_view text) {
  return JsonReader(text, [](const JsonReader& json, absl::string_view reason) {
    return absl::InvalidArgumentError(
        absl::StrCat("byte ", json.pos(), " line ", json.line(), ": ", reason));
  });
}

absl::Status StringError(absl::string_view text) {
  JsonReader json = Reader(text);
  std::string out;
  return json.String(&out);
}

TEST(JsonReaderTest, DecodesEveryEscape) {
  JsonReader json = Reader(R"(  "a\"b\\c\/d\b\f\n\r\te" "\u0041\u00e9\u20AC" "")");
  std::string out;
  ASSERT_TRUE(json.String(&out).ok());
  EXPECT_EQ(out, "a\"b\\c/d\b\f\n\r\te");
  ASSERT_TRUE(json.String(&out).ok());
  EXPECT_EQ(out, "A\xC3\xA9\xE2\x82\xAC");  // one, two and three UTF-8 bytes
  ASSERT_TRUE(json.String(&out).ok());
  EXPECT_EQ(out, "");
  json.SkipSpace();
  EXPECT_TRUE(json.AtEnd());
}

TEST(JsonReaderTest, JoinsSurrogatePairs) {
  JsonReader json = Reader(R"("\ud83d\ude00 \uDBFF\uDFFF")");
  std::string out;
  ASSERT_TRUE(json.String(&out).ok());
  EXPECT_EQ(out, "\xF0\x9F\x98\x80 \xF4\x8F\xBF\xBF");  // U+1F600 and U+10FFFF
  // Bytes >= 0x80 pass through unchanged.
  JsonReader raw = Reader("\"caf\xC3\xA9\"");
  ASSERT_TRUE(raw.String(&out).ok());
  EXPECT_EQ(out, "caf\xC3\xA9");
}

TEST(JsonReaderTest, MalformedStringsSayWhy) {
  struct Case {
    std::string text;
    std::string message;
  } cases[] = {
      {"x", "byte 0 line 1: expected a string in double quotes"},
      {"", "expected a string in double quotes"},
      {"\"abc", "byte 4 line 1: unterminated string"},
      {"\"abc\\", "unterminated string"},
      {"\"a\tb\"", "control character 0x09 in a string (JSON escapes it)"},
      {"\"a\nb\"", "control character 0x0a in a string"},
      {"\"\\q\"", "unknown escape \\q"},
      {"\"\\\x01\"", "unknown escape: \\ and byte 0x01"},
      {"\"\\u12\"", "\\u needs four hex digits"},
      {"\"\\u12", "\\u needs four hex digits"},
      {"\"\\uzzzz\"", "\\u needs four hex digits"},
      {"\"\\ude00\"", "unpaired low surrogate \\uDE00"},
      {"\"\\ud83d\"", "high surrogate \\uD83D without a low one"},
      {"\"\\ud83dx\"", "high surrogate \\uD83D without a low one"},
      {"\"\\ud83d\\u0041\"", "high surrogate \\uD83D without a low one"},
      {"\"\\ud83d\\ud83d\"", "high surrogate \\uD83D without a low one"},
      {"\"\\ud83d\\u", "high surrogate \\uD83D without a low one"},
      {"\"\\ud83d\\ude0\"", "high surrogate \\uD83D without a low one"},
  };
  for (const Case& c : cases) {
    const absl::Status s = StringError(c.text);
    EXPECT_TRUE(absl::IsInvalidArgument(s)) << c.text << ": " << s;
    EXPECT_THAT(s.message(), HasSubstr(c.message)) << c.text;
  }
}

TEST(JsonReaderTest, CountsLinesBetweenTokens) {
  JsonReader json = Reader("{\n  \"a\"\r\n  :\n\n x");
  EXPECT_TRUE(json.Consume('{'));
  std::string key;
  ASSERT_TRUE(json.String(&key).ok());
  EXPECT_EQ(json.line(), 2);
  EXPECT_TRUE(json.Consume(':'));
  EXPECT_EQ(json.line(), 3);
  const absl::Status s = json.Expect(',');
  EXPECT_THAT(s.message(), HasSubstr("line 5: expected ','"));
  EXPECT_EQ(json.Peek(), 'x');
}

TEST(JsonReaderTest, UnsignedIntegersAreBounded) {
  JsonReader json = Reader(" [0, 7 ,18446744073709551615] []");
  std::vector<uint64_t> values;
  ASSERT_TRUE(json.UnsignedArray(&values).ok());
  EXPECT_THAT(values, ElementsAre(0u, 7u, UINT64_MAX));
  ASSERT_TRUE(json.UnsignedArray(&values).ok());
  EXPECT_TRUE(values.empty());

  struct Case {
    std::string text;
    std::string message;
  } cases[] = {
      {"18446744073709551616", "integer too large for 64 bits"},
      {"99999999999999999999", "integer too large for 64 bits"},
      {"-1", "expected a non-negative integer"},
      {"", "expected a non-negative integer"},
      {"01", "integer with a leading 0"},
      {"1.5", "expected an integer, not a fraction"},
      {"1e3", "expected an integer, not a fraction"},
  };
  for (const Case& c : cases) {
    JsonReader bad = Reader(c.text);
    uint64_t value = 0;
    const absl::Status s = bad.Unsigned(&value);
    EXPECT_THAT(s.message(), HasSubstr(c.message)) << c.text;
  }
  for (const char* text : {"[1,]", "[1", "[1 2]", "1"}) {
    JsonReader bad = Reader(text);
    EXPECT_FALSE(bad.UnsignedArray(&values).ok()) << text;
  }
}

TEST(JsonReaderTest, NumberTextTakesTheNumbersCharacters) {
  JsonReader json = Reader(" -1.5e+3, 12");
  EXPECT_EQ(json.NumberText(), "-1.5e+3");
  EXPECT_EQ(json.NumberText(), "");
  EXPECT_EQ(json.pos(), 8u);
  EXPECT_TRUE(json.Consume(','));
  EXPECT_EQ(json.NumberText(), "12");
  EXPECT_TRUE(json.AtEnd());
  // strchr would match a NUL byte as the terminator of its set.
  constexpr char kOneNulTwo[] = {'1', '\0', '2'};
  JsonReader nul = Reader(absl::string_view(kOneNulTwo, sizeof(kOneNulTwo)));
  EXPECT_EQ(nul.NumberText(), "1");
  EXPECT_EQ(nul.pos(), 1u);
}

TEST(JsonReaderTest, ObjectsCallBackForEachMember) {
  JsonReader json = Reader(R"({"a": "x", "b" : [1, 2], "c": {"d": [true, false, null, -1.5e3]}})");
  std::vector<std::string> keys;
  std::string a;
  std::vector<uint64_t> b;
  ASSERT_TRUE(json.Object([&](const std::string& key) {
                    keys.push_back(key);
                    if (key == "a") return json.String(&a);
                    if (key == "b") return json.UnsignedArray(&b);
                    return json.SkipValue();
                  })
                  .ok());
  EXPECT_THAT(keys, ElementsAre("a", "b", "c"));
  EXPECT_EQ(a, "x");
  EXPECT_THAT(b, ElementsAre(1u, 2u));
  EXPECT_TRUE(json.AtEnd());

  JsonReader empty = Reader(" { } ");
  EXPECT_TRUE(empty.Object([](const std::string&) { return absl::OkStatus(); }).ok());

  // The callback's error is passed through.
  JsonReader refused = Reader(R"({"a": 1})");
  const absl::Status s = refused.Object(
      [&](const std::string& key) { return refused.Error(absl::StrCat("no ", key)); });
  EXPECT_THAT(s.message(), HasSubstr("byte 5 line 1: no a"));
}

TEST(JsonReaderTest, MalformedObjectsAndValuesAreErrors) {
  const std::string cases[] = {
      "",         "[]",         "{",         R"({"a")",          R"({"a":)",   R"({"a":1,})",
      R"({a:1})", R"({"a" 1})", R"({"a":1)", R"({"a":1 "b":2})", R"({"a":x})", R"({"a":[1,]})",
  };
  for (const std::string& text : cases) {
    JsonReader json = Reader(text);
    const absl::Status s = json.Object([&](const std::string&) { return json.SkipValue(); });
    EXPECT_TRUE(absl::IsInvalidArgument(s)) << text << ": " << s;
  }
}

TEST(JsonReaderTest, SkipValueBoundsNesting) {
  const auto nested = [](int depth) {
    return std::string(static_cast<size_t>(depth), '[') +
           std::string(static_cast<size_t>(depth), ']');
  };
  // SkipValue(0) takes the outermost array at depth 0. (The reader keeps a
  // view: the texts must outlive it.)
  const std::string within_text = nested(kMaxJsonSkipDepth + 1);
  JsonReader within = Reader(within_text);
  EXPECT_TRUE(within.SkipValue().ok());
  EXPECT_TRUE(within.AtEnd());
  const std::string too_deep_text = nested(kMaxJsonSkipDepth + 2);
  JsonReader too_deep = Reader(too_deep_text);
  EXPECT_THAT(too_deep.SkipValue().message(), HasSubstr("values nested deeper than 32"));
  // Far deeper input fails the same way, without recursing further.
  const std::string far_text(1'000'000, '[');
  JsonReader far = Reader(far_text);
  EXPECT_THAT(far.SkipValue().message(), HasSubstr("values nested deeper than 32"));
  JsonReader objects = Reader(R"({"a":{"a":{"a":{"a":1}}}})");
  EXPECT_TRUE(objects.SkipValue(kMaxJsonSkipDepth - 4).ok());  // the 1 at the bound
  JsonReader deep_objects = Reader(R"({"a":{"a":{"a":{"a":1}}}})");
  EXPECT_FALSE(deep_objects.SkipValue(kMaxJsonSkipDepth - 3).ok());
}

}  // namespace
}  // namespace cohort
