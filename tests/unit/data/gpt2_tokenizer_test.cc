// Gpt2Tokenizer and GPT-2's pre-tokenizer: hand-checked splits and merges,
// the file checks, and ids equal to an independent Python implementation
// (tests/reference/gpt2_bpe_reference.py) on tricky texts, with a vocabulary
// the test learns from a sample text.
//
// Needs python3 (standard library only). Without it the comparison fails,
// saying so: a silently skipped comparison would hide regressions.

#include "worker/data/gpt2_tokenizer.h"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "common/log.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/files.h"
#include "tests/testing/gpt2_byte_alphabet.h"
#include "tests/testing/paths.h"
#include "tests/testing/subprocess.h"
#include "worker/data/gpt2_pretokenizer.h"

namespace cohort::data {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::string Spell(const std::string& bytes) {
  std::string out;
  for (const char c : bytes) out += testing::Gpt2ByteChar(static_cast<unsigned char>(c));
  return out;
}

// A JSON string literal; `escape_all` writes every non-ASCII character as
// \uXXXX (as GPT-2's encoder.json does) and '/' as "\/".
std::string JsonString(const std::string& utf8, bool escape_all) {
  std::string out = "\"";
  for (size_t i = 0; i < utf8.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(utf8[i]);
    if (c == '"' || c == '\\') {
      out += std::string("\\") + static_cast<char>(c);
    } else if (c == '/' && escape_all) {
      out += "\\/";
    } else if (c >= 0x80 && escape_all) {  // two-byte sequences only: the alphabet ends at U+0143
      const int code_point = ((c & 0x1F) << 6) | (static_cast<unsigned char>(utf8[++i]) & 0x3F);
      out += absl::StrFormat("\\u%04x", code_point);
    } else {
      out.push_back(static_cast<char>(c));
    }
  }
  return out + "\"";
}

struct VocabFiles {
  std::string encoder_json;
  std::string merges;
  std::map<std::string, int> ids;  // token bytes -> id
};

// encoder.json and vocab.bpe for `tokens` (byte strings, in id order) and
// `merges` (pairs of byte strings, in rank order).
VocabFiles WriteVocab(const std::vector<std::string>& tokens,
                      const std::vector<std::pair<std::string, std::string>>& merges) {
  VocabFiles files;
  std::vector<std::string> entries;
  for (size_t id = 0; id < tokens.size(); ++id) {
    files.ids[tokens[id]] = static_cast<int>(id);
    entries.push_back(absl::StrCat(JsonString(Spell(tokens[id]), id % 2 == 0), ": ", id));
  }
  // One entry per line, to give the parser's line count something to do.
  files.encoder_json = absl::StrCat("{\n  ", absl::StrJoin(entries, ",\n  "), "\n}\n");
  files.merges = "#version: 0.2\n";
  for (const auto& [a, b] : merges) absl::StrAppend(&files.merges, Spell(a), " ", Spell(b), "\n");
  return files;
}

// The 256 byte tokens in GPT-2's order (printable bytes first).
std::vector<std::string> ByteTokens() {
  std::vector<std::string> tokens;
  for (int pass = 0; pass < 2; ++pass) {
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      if (printable == (pass == 0)) tokens.push_back(std::string(1, static_cast<char>(b)));
    }
  }
  return tokens;
}

// Learns `num_merges` BPE merges from `corpus` (most frequent pair, ties to
// the smallest pair), the way GPT-2's vocabulary was made, only smaller.
VocabFiles LearnVocab(const std::string& corpus, int num_merges) {
  std::map<std::string, int> word_counts;
  for (std::string_view piece : Gpt2PreTokenize(corpus)) ++word_counts[std::string(piece)];
  std::vector<std::pair<std::vector<std::string>, int>> words;
  for (const auto& [word, count] : word_counts) {
    std::vector<std::string> symbols;
    for (const char c : word) symbols.push_back(std::string(1, c));
    words.emplace_back(std::move(symbols), count);
  }
  std::vector<std::string> tokens = ByteTokens();
  std::map<std::string, int> known;
  for (const std::string& t : tokens) known[t] = 1;
  std::vector<std::pair<std::string, std::string>> merges;
  for (int m = 0; m < num_merges; ++m) {
    std::map<std::pair<std::string, std::string>, int> pair_counts;
    for (const auto& [symbols, count] : words) {
      for (size_t i = 0; i + 1 < symbols.size(); ++i)
        pair_counts[{symbols[i], symbols[i + 1]}] += count;
    }
    const std::pair<std::string, std::string>* best = nullptr;
    int best_count = 1;
    for (const auto& [pair, count] : pair_counts) {
      if (count > best_count) best = &pair, best_count = count;
    }
    if (best == nullptr) break;
    const auto [a, b] = *best;
    merges.emplace_back(a, b);
    if (known[a + b]++ == 0) tokens.push_back(a + b);
    for (auto& [symbols, count] : words) {
      std::vector<std::string> merged;
      for (size_t i = 0; i < symbols.size(); ++i) {
        if (i + 1 < symbols.size() && symbols[i] == a && symbols[i + 1] == b) {
          merged.push_back(a + b);
          ++i;
        } else {
          merged.push_back(symbols[i]);
        }
      }
      symbols = std::move(merged);
    }
  }
  tokens.push_back("<|endoftext|>");
  return WriteVocab(tokens, merges);
}

Gpt2Tokenizer MustLoad(const VocabFiles& files) {
  absl::StatusOr<Gpt2Tokenizer> tokenizer =
      Gpt2Tokenizer::FromContents(files.encoder_json, files.merges);
  CHECK(tokenizer.ok()) << tokenizer.status();
  return *std::move(tokenizer);
}

std::vector<std::string> Pieces(std::string_view text) {
  std::vector<std::string> pieces;
  for (std::string_view p : Gpt2PreTokenize(text)) pieces.emplace_back(p);
  return pieces;
}

TEST(Gpt2PreTokenizerTest, SplitsLikeGpt2sPattern) {
  EXPECT_THAT(Pieces("Hello  world"), ElementsAre("Hello", " ", " world"));
  // A run of spaces leaves its last one to the next word ("\s+(?!\S)").
  EXPECT_THAT(Pieces("a  \n b"), ElementsAre("a", "  \n", " b"));
  EXPECT_THAT(Pieces("a \tb"), ElementsAre("a", " ", "\t", "b"));
  EXPECT_THAT(Pieces("x   "), ElementsAre("x", "   "));
  EXPECT_THAT(Pieces("I'm I'M 's"), ElementsAre("I", "'m", " I", "'", "M", " '", "s"));
  EXPECT_THAT(Pieces("they'll we've you're it'd"),
              ElementsAre("they", "'ll", " we", "'ve", " you", "'re", " it", "'d"));
  EXPECT_THAT(Pieces("123abc 4.5"), ElementsAre("123", "abc", " 4", ".", "5"));
  EXPECT_THAT(Pieces(" !!?x"), ElementsAre(" !!?", "x"));
  // No-break space is White_Space; U+001C..U+001F are not (the regex
  // module's \s, unlike re's).
  EXPECT_THAT(Pieces("a \u00a0b"), ElementsAre("a", " ", "\u00a0", "b"));
  EXPECT_THAT(Pieces("\x1c\x1f ab"), ElementsAre("\x1c\x1f", " ab"));
  // Letters of any script; a combining mark is not a letter.
  EXPECT_THAT(Pieces("caf\u00e9 \u65e5\u672c e\u0301"),
              ElementsAre("caf\u00e9", " \u65e5\u672c", " e", "\u0301"));
  // Invalid bytes are one-byte "other" characters.
  EXPECT_THAT(Pieces("ab\xff\xfe!cd \xc3"), ElementsAre("ab", "\xff\xfe!", "cd", " \xc3"));
  EXPECT_THAT(Pieces(""), ElementsAre());
}

// Random texts of atoms that stress the classes; text[:k] and text[k:]
// pre-tokenize like the whole at every cut Gpt2SafeCut finds.
std::string RandomText(std::mt19937* rng, int atoms) {
  static const std::vector<std::string> kAtoms = {"a",
                                                  "Z",
                                                  "the",
                                                  " the",
                                                  "ing",
                                                  "Hello",
                                                  "\u00e9",
                                                  "\u03a9",
                                                  "\u0436",
                                                  "\u65e5",
                                                  "\u8a9e",
                                                  "\u0627",
                                                  "1",
                                                  "42",
                                                  "\u0663",
                                                  "\u216b",
                                                  "\u00bd",
                                                  " ",
                                                  "  ",
                                                  "\n",
                                                  "\t",
                                                  "\r\n",
                                                  "\u00a0",
                                                  "\u3000",
                                                  "\u2028",
                                                  "\u0085",
                                                  "'",
                                                  "'s",
                                                  "'ll",
                                                  "'RE",
                                                  "!",
                                                  "...",
                                                  "-",
                                                  "\xf0\x9f\x98\x80",
                                                  "\u0301",
                                                  "\u200b",
                                                  "\x1c",
                                                  "\x1f",
                                                  "\xff",
                                                  "\xc3",
                                                  "\xe6\x97",
                                                  "\xed\xa0\x80",
                                                  "\xf4\x90\x80\x80",
                                                  "\xc1\x81",
                                                  std::string(1, '\0'),
                                                  "\x7f"};
  std::string text;
  std::uniform_int_distribution<size_t> pick(0, kAtoms.size() - 1);
  for (int i = 0; i < atoms; ++i) text += kAtoms[pick(*rng)];
  return text;
}

TEST(Gpt2PreTokenizerTest, SafeCutsKeepThePieces) {
  std::mt19937 rng(7);
  int cuts = 0;
  for (int t = 0; t < 300; ++t) {
    const std::string text = RandomText(&rng, 1 + t % 60);
    const std::vector<std::string> whole = Pieces(text);
    std::string_view rest = text;
    std::vector<std::string> parts;  // pieces of the parts, last part first
    while (const size_t k = Gpt2SafeCut(rest)) {
      ASSERT_GT(k, 0u);
      ASSERT_LT(k, rest.size());
      std::vector<std::string> tail = Pieces(rest.substr(k));
      parts.insert(parts.begin(), tail.begin(), tail.end());
      rest = rest.substr(0, k);
      ++cuts;
    }
    std::vector<std::string> head = Pieces(rest);
    parts.insert(parts.begin(), head.begin(), head.end());
    ASSERT_EQ(parts, whole) << absl::CHexEscape(text);
  }
  EXPECT_GT(cuts, 1000);
  EXPECT_EQ(Gpt2SafeCut("abc def"), 3u);
  EXPECT_EQ(Gpt2SafeCut("abc"), 0u);
  EXPECT_EQ(Gpt2SafeCut("ab  "), 2u);
  EXPECT_EQ(Gpt2SafeCut("don't"), 3u);  // not between ' and t
  // A text that ends inside a character: no cut before it, since the bytes
  // after it may complete a letter.
  EXPECT_EQ(Gpt2SafeCut("ab\xe6\x97"), 0u);
  EXPECT_EQ(Gpt2SafeCut("ab.\xe6\x97"), 2u);
}

// A vocabulary written by hand: bytes, then "ab", "aba" and "aa".
VocabFiles SmallVocab(const std::vector<std::pair<std::string, std::string>>& merges) {
  std::vector<std::string> tokens = ByteTokens();
  for (const char* t : {"ab", "aba", "aa"}) tokens.push_back(t);
  return WriteVocab(tokens, merges);
}

TEST(Gpt2TokenizerTest, MergesTheLowestRankEverywhereFirst) {
  // (ab, a) ranks below (a, b), but only exists once (a, b) merged: GPT-2
  // merges every (a, b) before it looks at the pairs that made.
  const VocabFiles files = SmallVocab({{"ab", "a"}, {"a", "b"}, {"a", "a"}});
  const Gpt2Tokenizer tokenizer = MustLoad(files);
  const int a = files.ids.at("a"), ab = files.ids.at("ab"), aba = files.ids.at("aba"),
            aa = files.ids.at("aa");
  EXPECT_THAT(*tokenizer.Encode("abab"), ElementsAre(ab, ab));
  // Left to right, without overlap.
  EXPECT_THAT(*tokenizer.Encode("aaa"), ElementsAre(aa, a));
  // ab a ab, then (ab, a) merges.
  EXPECT_THAT(*tokenizer.Encode("abaab"), ElementsAre(aba, ab));
  EXPECT_EQ(tokenizer.num_merges(), 3);
  EXPECT_EQ(tokenizer.vocab_size(), 259);
}

TEST(Gpt2TokenizerTest, DecodeNamesAnUnknownId) {
  const Gpt2Tokenizer tokenizer = MustLoad(SmallVocab({}));
  const std::vector<int32_t> ids = {70, 300};
  absl::StatusOr<std::string> text = tokenizer.Decode(ids);
  EXPECT_EQ(text.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(text.status().message(), HasSubstr("token 1 has id 300"));
  const std::vector<int32_t> negative = {-1};
  EXPECT_THAT(tokenizer.Decode(negative).status().message(), HasSubstr("token 0 has id -1"));
  const std::vector<uint16_t> fine = {static_cast<uint16_t>(SmallVocab({}).ids.at("ab"))};
  EXPECT_EQ(*tokenizer.Decode(fine), "ab");
}

TEST(Gpt2TokenizerTest, RoundTripsAnyBytes) {
  const Gpt2Tokenizer tokenizer = MustLoad(LearnVocab("the cat sat on the mat, the end", 20));
  std::mt19937 rng(3);
  for (int t = 0; t < 200; ++t) {
    std::string text = RandomText(&rng, t % 40);
    for (int i = 0; i < t % 7; ++i) text.push_back(static_cast<char>(rng()));
    absl::StatusOr<std::vector<uint16_t>> ids = tokenizer.Encode(text);
    ASSERT_TRUE(ids.ok()) << ids.status();
    EXPECT_EQ(*tokenizer.Decode(*ids), text);
  }
}

TEST(Gpt2TokenizerTest, CacheClearingKeepsTheIds) {
  const Gpt2Tokenizer tokenizer = MustLoad(LearnVocab("1 12 123 1234 12345 2 23 234", 20));
  std::string text;
  for (int i = 0; i < 70'000; ++i) absl::StrAppend(&text, " ", i * 7);  // > 65536 pieces
  const std::vector<uint16_t> cold = *tokenizer.Encode(text);
  const std::vector<uint16_t> warm = *tokenizer.Encode(text);
  EXPECT_EQ(cold, warm);
  std::vector<uint16_t> piecewise;
  for (std::string_view piece : Gpt2PreTokenize(text)) {
    ASSERT_TRUE(tokenizer.EncodeAppend(piece, &piecewise).ok());
  }
  EXPECT_EQ(piecewise, cold);
}

struct BadFile {
  std::string encoder_json;
  std::string merges;
  std::string message;
};

TEST(Gpt2TokenizerTest, MalformedFilesNameLineAndReason) {
  const VocabFiles good = SmallVocab({{"a", "b"}});
  const std::string bytes = good.encoder_json.substr(0, good.encoder_json.rfind('}'));
  const std::vector<BadFile> cases = {
      {"[]", "", "encoder.json line 1: expected a JSON object"},
      {"{\"a\": 1,}", "", "line 1: entry 2: expected a token in double quotes"},
      {"{\"a\" 1}", "", "entry 1 \"a\": expected ':'"},
      {"{\"a\": 1.5}", "", "token \"a\": id \"1.5\" is not an integer in [0, 65535]"},
      {"{\"a\": 65536}", "",
       "id \"65536\" is not an integer in [0, 65535] (shard tokens are uint16)"},
      {"{\"a\": -1}", "", "id \"-1\" is not an integer"},
      {"{\"a\": 01}", "", "id \"01\" is not an integer"},
      {"{\"a\": }", "", "id (missing)"},
      {"{\n\"a\": 1\n\"b\": 2}", "", "encoder.json line 3: expected ',' or '}' after entry 1"},
      {"{\"a\": 1} x", "", "unexpected text after the object"},
      {"{\"a\tb\": 1}", "", "control character 0x09 in a string"},
      {"{\"a\\q\": 1}", "", "unknown escape \\q"},
      {"{\"\\ud83d\": 1}", "", "high surrogate \\uD83D without a low one"},
      {"{\"\\ude00\": 1}", "", "unpaired low surrogate \\uDE00"},
      {"{\"\\ud83d\\ude00\": 1}", "",
       "token \"\xf0\x9f\x98\x80\" has U+1F600, which is not in GPT-2's byte alphabet"},
      {"{\"\\u0020\": 1}", "", "has U+0020, which is not in GPT-2's byte alphabet"},
      {"{\"\": 1}", "", "empty token"},
      {"{\"\xff\": 1}", "", "is not valid UTF-8 at byte 0"},
      {"{\"a\": 1, \"\\u0061\": 2}", "", "token \"a\" appears twice"},
      {"{\"a\": 1,\n \"b\": 1}", "",
       "line 2: id 1 is given to \"b\" and already to \"a\" (line 1)"},
      {"{\"a\": 1", "", "expected ',' or '}' after entry 1"},
      {"{\"a", "", "unterminated string"},
      {"{}", "", "encoder.json has no token for byte 0x00"},
      {bytes + "}", "#version: 0.2\na\n",
       "vocab.bpe line 2: expected two tokens separated by one space, got \"a\""},
      {bytes + "}", "a  b\n", "vocab.bpe line 1: expected two tokens"},
      {bytes + "}", "a b c\n", "expected two tokens"},
      {bytes + "}", "\na b\nb z\n",
       "vocab.bpe line 3: the merge of \"b z\" is not in encoder.json"},
      {bytes + "}", "ab abc\n", "vocab.bpe line 1: \"abc\" is not in encoder.json"},
      {bytes + "}", "a b\r\n\r\na b\r\n", "vocab.bpe line 3: repeats the merge of line 1"},
      {bytes + "}", "a \x01\n", "has U+0001, which is not in GPT-2's byte alphabet"},
  };
  for (const BadFile& c : cases) {
    absl::StatusOr<Gpt2Tokenizer> tokenizer = Gpt2Tokenizer::FromContents(c.encoder_json, c.merges);
    EXPECT_EQ(tokenizer.status().code(), absl::StatusCode::kInvalidArgument) << c.message;
    EXPECT_THAT(tokenizer.status().message(), HasSubstr(c.message));
  }
  // The good files, with CRLF line ends and no "#version" line, load.
  EXPECT_TRUE(Gpt2Tokenizer::FromContents(good.encoder_json, "a b\r\n").ok());
}

TEST(Gpt2TokenizerTest, LoadChecksTheFiles) {
  const std::string dir = testing::MakeTempDir("gpt2");
  const VocabFiles files = SmallVocab({{"a", "b"}});
  testing::WriteFile(dir + "/encoder.json", files.encoder_json);
  testing::WriteFile(dir + "/vocab.bpe", files.merges);
  absl::StatusOr<Gpt2Tokenizer> tokenizer =
      Gpt2Tokenizer::Load(dir + "/encoder.json", dir + "/vocab.bpe");
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  EXPECT_THAT(*tokenizer->Encode("ab"), ElementsAre(files.ids.at("ab")));

  absl::StatusOr<Gpt2Tokenizer> missing =
      Gpt2Tokenizer::Load(dir + "/nope.json", dir + "/vocab.bpe");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr(dir + "/nope.json does not exist"));

  // Named by path in the errors of their contents.
  testing::WriteFile(dir + "/bad.bpe", "a\n");
  EXPECT_THAT(Gpt2Tokenizer::Load(dir + "/encoder.json", dir + "/bad.bpe").status().message(),
              HasSubstr(dir + "/bad.bpe line 1: expected two tokens"));

  // Over 64 MiB: refused before reading (a sparse file costs no disk).
  std::filesystem::resize_file(dir + "/bad.bpe", kMaxGpt2FileBytes + 1);
  absl::StatusOr<Gpt2Tokenizer> big = Gpt2Tokenizer::Load(dir + "/encoder.json", dir + "/bad.bpe");
  EXPECT_EQ(big.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(big.status().message(), HasSubstr("is 67108865 bytes, over the limit of 67108864"));
}

// Texts for the comparison with the Python reference.
std::vector<std::string> TrickyTexts() {
  std::vector<std::string> texts = {
      "Hello world! It's a test; we've got 'quotes' and they'll say I'm here, you'd agree.",
      "IT'S DON'T 'S 'Re 's's's ''s '' 'x",
      "  multiple   spaces   and trailing spaces   ",
      "newlines\n\n\nand\ttabs\t\t here\r\n windows\r\n",
      "digits 1234567890 3.14159 1,000,000 and 42nd abc123def",
      "punctuation!!! ??? ... --- *** ''' \"\"\" (()) [[]] {{}} <<>> @@##$$%%^^&&",
      "na\u00efve caf\u00e9 \u0395\u03bb\u03bb\u03b7\u03bd\u03b9\u03ba\u03ac \u65e5\u672c\u8a9e "
      "\u041f\u0440\u0438\u0432\u0435\u0442 \u043c\u0438\u0440",
      "emoji \xf0\x9f\x98\x80\xf0\x9f\x91\x8d\xf0\x9f\x8f\xbd family "
      "\xf0\x9f\x91\xa8\u200d\xf0\x9f\x91\xa9\u200d\xf0\x9f\x91\xa7 flag "
      "\xf0\x9f\x87\xa9\xf0\x9f\x87\xaa",
      "bad \xff\xfe bytes \xc3 and \xe6\x97 truncated \xed\xa0\x80 surrogate \xc0\xaf overlong "
      "\xf4\x90\x80\x80 too big \x80\x80 lone x\xc1\x81y \xe0\x81\x81z overlong letters",
      "a\u00a0b\u3000c\u2028d\u0085e \u200b f\x1c g\x1f h \u00a0 \u2003 i",
      "numbers \u0663\u0664\u0665 \u216b \u00bd \u00b2 e\u0301 \u0915\u093f",
      "end with newline\n",
      " ",
      "",
      "\n\n",
      " \t \n ",
      "x",
      std::string("nul \0 byte \x7f del", sizeof("nul \0 byte \x7f del") - 1),
      std::string(3000, '-') + std::string(500, ' ') + "z",
  };
  std::mt19937 rng(11);
  for (int t = 0; t < 40; ++t) texts.push_back(RandomText(&rng, 1 + t * 3));
  return texts;
}

// Sentences of English, Greek, Russian and Japanese words, numbers and
// code, varied enough to learn a few hundred merges from.
std::string SampleCorpus() {
  static const std::vector<std::string> kWords = {
      "the",
      "quick",
      "brown",
      "fox",
      "jumps",
      "over",
      "lazy",
      "dog",
      "it's",
      "they'll",
      "we've",
      "I'm",
      "you'd",
      "there",
      "their",
      "these",
      "those",
      "thinking",
      "running",
      "walking",
      "talking",
      "nation",
      "national",
      "station",
      "information",
      "tokenizer",
      "training",
      "language",
      "model",
      "models",
      "data",
      "shard",
      "shards",
      "byte",
      "bytes",
      "caf\u00e9",
      "na\u00efve",
      "r\u00e9sum\u00e9",
      "\u0395\u03bb\u03bb\u03b7\u03bd\u03b9\u03ba\u03ac",
      "\u03ba\u03b1\u03bb\u03b7\u03bc\u03ad\u03c1\u03b1",
      "\u65e5\u672c\u8a9e",
      "\u65e5\u672c",
      "\u6771\u4eac",
      "\u041f\u0440\u0438\u0432\u0435\u0442",
      "\u043c\u0438\u0440",
      "1234",
      "2024",
      "3.14159",
      "42",
      "(x)",
      "{",
      "}",
      "return",
      "x + 1;",
      "--",
      "...",
      "!",
      "?",
      ",",
      "\"quoted\"",
      "'single'"};
  std::mt19937 rng(5);
  std::uniform_int_distribution<size_t> pick(0, kWords.size() - 1);
  std::string corpus;
  for (int i = 0; i < 4000; ++i) {
    absl::StrAppend(&corpus, kWords[pick(rng)],
                    i % 13 == 12  ? ".\n"
                    : i % 29 == 0 ? "\n    "
                                  : " ");
  }
  return corpus;
}

TEST(Gpt2TokenizerTest, EqualsThePythonReference) {
  const std::string dir = testing::MakeTempDir("gpt2ref");
  const VocabFiles files = LearnVocab(SampleCorpus(), 300);
  ASSERT_GT(files.ids.size(), 256u + 250u) << "the sample should yield about 300 merges";
  testing::WriteFile(dir + "/encoder.json", files.encoder_json);
  testing::WriteFile(dir + "/vocab.bpe", files.merges);
  absl::StatusOr<Gpt2Tokenizer> tokenizer =
      Gpt2Tokenizer::Load(dir + "/encoder.json", dir + "/vocab.bpe");
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();

  std::vector<std::string> texts = TrickyTexts();
  texts.push_back(SampleCorpus());
  std::vector<std::string> args = {
      std::string(COHORT_SOURCE_DIR) + "/tests/reference/gpt2_bpe_reference.py",
      dir + "/encoder.json", dir + "/vocab.bpe", dir + "/ids.txt"};
  for (size_t i = 0; i < texts.size(); ++i) {
    args.push_back(absl::StrFormat("%s/text_%03d.txt", dir, i));
    testing::WriteFile(args.back(), texts[i]);
  }
  absl::StatusOr<testing::CommandResult> run =
      testing::RunCommand(testing::PythonPath(), args, absl::Seconds(60));
  ASSERT_TRUE(run.ok()) << run.status() << "\nNeeds " << testing::PythonPath() << " (set $COHORT_PYTHON)";
  ASSERT_EQ(run->exit_code, 0) << run->output;
  std::ifstream in(dir + "/ids.txt");
  std::string line;
  size_t merged_tokens = 0;
  for (size_t i = 0; i < texts.size(); ++i) {
    ASSERT_TRUE(std::getline(in, line)) << "the reference wrote " << i << " lines";
    std::vector<uint16_t> expected;
    for (absl::string_view id : absl::StrSplit(line, ' ', absl::SkipEmpty())) {
      expected.push_back(static_cast<uint16_t>(std::stoi(std::string(id))));
    }
    absl::StatusOr<std::vector<uint16_t>> ids = tokenizer->Encode(texts[i]);
    ASSERT_TRUE(ids.ok()) << ids.status();
    EXPECT_EQ(*ids, expected) << "text " << i << ": " << absl::CHexEscape(texts[i]);
    EXPECT_EQ(*tokenizer->Decode(*ids), texts[i]) << "text " << i;
    for (const uint16_t id : *ids) merged_tokens += id >= 256 ? 1 : 0;
  }
  // The comparison means something only if merges apply, non-ASCII ones too.
  EXPECT_GT(merged_tokens, 1000u);
  const std::vector<uint16_t> japanese = *tokenizer->Encode(" \u65e5\u672c\u8a9e");
  EXPECT_LT(japanese.size(), 10u) << "the 9 bytes should merge";
}

}  // namespace
}  // namespace cohort::data
