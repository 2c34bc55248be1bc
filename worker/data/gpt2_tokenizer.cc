#include "worker/data/gpt2_tokenizer.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <queue>
#include <system_error>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "common/json_reader.h"
#include "worker/data/gpt2_pretokenizer.h"

namespace cohort::data {

// Pieces repeat (" the", "\n"), so their tokens are kept. The cache is
// cleared when full: simpler than LRU, and refilling is cheap.
struct Gpt2Tokenizer::Cache {
  absl::Mutex mu;
  absl::flat_hash_map<std::string, std::vector<uint16_t>> pieces ABSL_GUARDED_BY(mu);
};

namespace {

// This Abseil is built with its own string_view; the public interface is
// std's.
absl::string_view Absl(std::string_view s) { return absl::string_view(s.data(), s.size()); }

constexpr size_t kMaxCachedPieceBytes = 256;
constexpr size_t kMaxCacheEntries = size_t{1} << 16;
constexpr int64_t kMaxId = 65535;

// GPT-2's byte alphabet (bytes_to_unicode): printable Latin-1 bytes stand
// for themselves, the other 68 bytes, in increasing order, for U+0100 on.
constexpr char32_t kAlphabetEnd = 0x100 + 68;
struct ByteAlphabet {
  int16_t char_to_byte[kAlphabetEnd];  // -1: not in the alphabet
};
constexpr ByteAlphabet MakeByteAlphabet() {
  ByteAlphabet alphabet{};
  for (char32_t c = 0; c < kAlphabetEnd; ++c) alphabet.char_to_byte[c] = -1;
  int next = 0;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    alphabet.char_to_byte[printable ? b : 0x100 + next++] = static_cast<int16_t>(b);
  }
  return alphabet;
}
constexpr ByteAlphabet kByteAlphabet = MakeByteAlphabet();

// A token for an error message: control bytes escaped, at most 64 bytes.
std::string Quote(absl::string_view s) {
  std::string out = "\"";
  for (size_t i = 0; i < s.size() && i < 64; ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c < 0x20 || c == 0x7F) {
      absl::StrAppendFormat(&out, "\\x%02x", c);
    } else if (c == '"' || c == '\\') {
      absl::StrAppend(&out, "\\", std::string(1, static_cast<char>(c)));
    } else {
      out.push_back(static_cast<char>(c));
    }
  }
  return absl::StrCat(out, s.size() > 64 ? "...\"" : "\"");
}

// The code point of the well-formed UTF-8 sequence at s[*i] (advancing *i),
// or -1 (advancing one byte).
int32_t NextCodePoint(absl::string_view s, size_t* i) {
  const unsigned b0 = static_cast<unsigned char>(s[*i]);
  if (b0 < 0x80) {
    ++*i;
    return static_cast<int32_t>(b0);
  }
  const size_t length = b0 < 0xC2 ? 0 : b0 < 0xE0 ? 2 : b0 < 0xF0 ? 3 : b0 < 0xF5 ? 4 : 0;
  if (length == 0 || *i + length > s.size()) {
    ++*i;
    return -1;
  }
  int32_t c = static_cast<int32_t>(b0 & (0xFF >> (length + 1)));
  for (size_t k = 1; k < length; ++k) {
    const unsigned b = static_cast<unsigned char>(s[*i + k]);
    if ((b & 0xC0) != 0x80) {
      ++*i;
      return -1;
    }
    c = (c << 6) | static_cast<int32_t>(b & 0x3F);
  }
  constexpr int32_t kMin[] = {0, 0, 0x80, 0x800, 0x10000};  // shortest form only
  if (c < kMin[length] || c > 0x10FFFF || (c >= 0xD800 && c <= 0xDFFF)) {
    ++*i;
    return -1;
  }
  *i += length;
  return c;
}

// The bytes a token string spells in the byte alphabet, or an error naming
// the first character outside it.
absl::StatusOr<std::string> TokenBytes(absl::string_view token) {
  if (token.empty()) return absl::InvalidArgumentError("empty token");
  std::string bytes;
  for (size_t i = 0; i < token.size();) {
    const size_t at = i;
    const int32_t c = NextCodePoint(token, &i);
    if (c < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("token ", Quote(token), " is not valid UTF-8 at byte ", at));
    }
    if (c >= static_cast<int32_t>(kAlphabetEnd) || kByteAlphabet.char_to_byte[c] < 0) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "token %s has U+%04X, which is not in GPT-2's byte alphabet", Quote(token), c));
    }
    bytes.push_back(static_cast<char>(kByteAlphabet.char_to_byte[c]));
  }
  return bytes;
}

struct VocabEntry {
  std::string token;  // as written, UTF-8
  int64_t id;
  int line;
};

// encoder.json: one JSON object of string -> non-negative integer, its
// strings decoded by JsonReader; other values are refused. Errors name the
// file and the line.
class EncoderJsonParser {
 public:
  EncoderJsonParser(absl::string_view text, absl::string_view name)
      : json_(text, [name](const JsonReader& json, absl::string_view reason) {
          return absl::InvalidArgumentError(
              absl::StrCat(name, " line ", json.line(), ": ", reason));
        }) {}

  absl::Status Parse(std::vector<VocabEntry>* entries) {
    if (!json_.Consume('{')) {
      return json_.Error("expected a JSON object of token -> id, starting with '{'");
    }
    if (!json_.Consume('}')) {
      while (true) {
        json_.SkipSpace();
        if (entries->size() > static_cast<size_t>(kMaxId)) {
          return json_.Error("more than 65536 entries (ids must fit in uint16)");
        }
        const int entry = static_cast<int>(entries->size()) + 1;
        if (json_.Peek() != '"') {
          return json_.Error(absl::StrCat("entry ", entry, ": expected a token in double quotes"));
        }
        VocabEntry e{.token = "", .id = 0, .line = json_.line()};
        if (absl::Status s = json_.String(&e.token); !s.ok()) return s;
        if (!json_.Consume(':')) {
          return json_.Error(absl::StrCat("entry ", entry, " ", Quote(e.token), ": expected ':'"));
        }
        if (absl::Status s = ParseId(e.token, &e.id); !s.ok()) return s;
        entries->push_back(std::move(e));
        if (json_.Consume('}')) break;
        if (!json_.Consume(',')) {
          return json_.Error(absl::StrCat("expected ',' or '}' after entry ", entry));
        }
      }
    }
    json_.SkipSpace();
    if (!json_.AtEnd()) return json_.Error("unexpected text after the object");
    return absl::OkStatus();
  }

 private:
  absl::Status ParseId(const std::string& token, int64_t* id) {
    const absl::string_view number = json_.NumberText();
    bool ok = !number.empty() && number.size() <= 5 && (number == "0" || number[0] != '0');
    int64_t value = 0;
    for (size_t k = 0; ok && k < number.size(); ++k) {
      ok = number[k] >= '0' && number[k] <= '9';
      value = value * 10 + (number[k] - '0');
    }
    if (!ok || value > kMaxId) {
      return json_.Error(absl::StrCat(
          "token ", Quote(token), ": id ", number.empty() ? "(missing)" : Quote(number),
          " is not an integer in [0, 65535] (shard tokens are uint16)"));
    }
    *id = value;
    return absl::OkStatus();
  }

  JsonReader json_;
};

// A whole file, refusing one over kMaxGpt2FileBytes.
absl::StatusOr<std::string> ReadBounded(const std::string& path, absl::string_view what) {
  std::error_code ec;
  const std::uintmax_t size = std::filesystem::file_size(path, ec);
  if (ec == std::errc::no_such_file_or_directory) {
    return absl::NotFoundError(absl::StrCat(what, " ", path, " does not exist"));
  }
  if (ec) return absl::InternalError(absl::StrCat(what, " ", path, ": ", ec.message()));
  const auto too_big = [&](std::uintmax_t bytes) {
    return absl::InvalidArgumentError(absl::StrCat(what, " ", path, " is ", bytes,
                                                   " bytes, over the limit of ", kMaxGpt2FileBytes,
                                                   " (64 MiB)"));
  };
  if (size > static_cast<std::uintmax_t>(kMaxGpt2FileBytes)) return too_big(size);
  std::FILE* file = std::fopen(path.c_str(), "rb");
  if (file == nullptr) {
    return absl::InternalError(
        absl::StrCat("cannot open ", what, " ", path, ": ", std::strerror(errno)));
  }
  // One byte more than the limit, in case the file grew since file_size.
  std::string content(static_cast<size_t>(kMaxGpt2FileBytes) + 1, '\0');
  const size_t n = std::fread(content.data(), 1, content.size(), file);
  const bool failed = std::ferror(file) != 0;
  std::fclose(file);
  if (failed) return absl::InternalError(absl::StrCat("cannot read ", what, " ", path));
  if (n > static_cast<size_t>(kMaxGpt2FileBytes)) return too_big(n);
  content.resize(n);
  return content;
}

template <typename Id>
absl::StatusOr<std::string> DecodeWith(const std::vector<std::string>& id_to_bytes,
                                       std::span<const Id> ids) {
  std::string text;
  for (size_t i = 0; i < ids.size(); ++i) {
    const int64_t id = ids[i];
    if (id < 0 || id >= static_cast<int64_t>(id_to_bytes.size()) || id_to_bytes[id].empty()) {
      return absl::InvalidArgumentError(absl::StrCat("token ", i, " has id ", id,
                                                     ", which is not in the GPT-2 vocabulary (",
                                                     id_to_bytes.size(), " ids)"));
    }
    text += id_to_bytes[id];
  }
  return text;
}

}  // namespace

Gpt2Tokenizer::Gpt2Tokenizer() : cache_(std::make_unique<Cache>()) {}
Gpt2Tokenizer::Gpt2Tokenizer(Gpt2Tokenizer&&) noexcept = default;
Gpt2Tokenizer& Gpt2Tokenizer::operator=(Gpt2Tokenizer&&) noexcept = default;
Gpt2Tokenizer::~Gpt2Tokenizer() = default;

absl::StatusOr<Gpt2Tokenizer> Gpt2Tokenizer::Load(const std::string& encoder_json_path,
                                                  const std::string& merges_path) {
  absl::StatusOr<std::string> json = ReadBounded(encoder_json_path, "encoder.json");
  if (!json.ok()) return json.status();
  absl::StatusOr<std::string> merges = ReadBounded(merges_path, "merges file");
  if (!merges.ok()) return merges.status();
  return Parse(*json, encoder_json_path, *merges, merges_path);
}

absl::StatusOr<Gpt2Tokenizer> Gpt2Tokenizer::FromContents(std::string_view encoder_json,
                                                          std::string_view merges) {
  return Parse(encoder_json, "encoder.json", merges, "vocab.bpe");
}

absl::StatusOr<Gpt2Tokenizer> Gpt2Tokenizer::Parse(std::string_view encoder_json_text,
                                                   std::string_view encoder_name_text,
                                                   std::string_view merges_text,
                                                   std::string_view merges_name_text) {
  const absl::string_view encoder_json = Absl(encoder_json_text);
  const absl::string_view encoder_name = Absl(encoder_name_text);
  const absl::string_view merges = Absl(merges_text);
  const absl::string_view merges_name = Absl(merges_name_text);
  std::vector<VocabEntry> entries;
  if (absl::Status s = EncoderJsonParser(encoder_json, encoder_name).Parse(&entries); !s.ok()) {
    return s;
  }
  Gpt2Tokenizer tokenizer;
  int64_t max_id = -1;
  for (const VocabEntry& e : entries) max_id = std::max(max_id, e.id);
  tokenizer.id_to_bytes_.resize(static_cast<size_t>(max_id + 1));
  // The entry that took each id, for the message about a second one.
  std::vector<const VocabEntry*> id_owner(tokenizer.id_to_bytes_.size(), nullptr);
  absl::flat_hash_map<std::string, uint16_t> bytes_to_id;
  for (const VocabEntry& e : entries) {
    const auto error = [&](absl::string_view what) {
      return absl::InvalidArgumentError(absl::StrCat(encoder_name, " line ", e.line, ": ", what));
    };
    absl::StatusOr<std::string> bytes = TokenBytes(e.token);
    if (!bytes.ok()) return error(bytes.status().message());
    std::string& slot = tokenizer.id_to_bytes_[e.id];
    if (const VocabEntry* owner = id_owner[e.id]; owner != nullptr) {
      return error(absl::StrCat("id ", e.id, " is given to ", Quote(e.token), " and already to ",
                                Quote(owner->token), " (line ", owner->line, ")"));
    }
    if (!bytes_to_id.emplace(*bytes, static_cast<uint16_t>(e.id)).second) {
      return error(absl::StrCat("token ", Quote(e.token), " appears twice"));
    }
    slot = *std::move(bytes);
    id_owner[e.id] = &e;
  }
  for (int b = 0; b < 256; ++b) {
    const auto it = bytes_to_id.find(std::string(1, static_cast<char>(b)));
    if (it == bytes_to_id.end()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s has no token for byte 0x%02x: byte-level BPE needs all 256", encoder_name, b));
    }
    tokenizer.byte_ids_[b] = it->second;
  }

  std::vector<int> rank_lines;
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(merges, '\n')) {
    ++line_number;
    if (absl::EndsWith(line, "\r")) line.remove_suffix(1);
    if (line.empty() || (line_number == 1 && absl::StartsWith(line, "#version"))) continue;
    const auto error = [&](absl::string_view what) {
      return absl::InvalidArgumentError(
          absl::StrCat(merges_name, " line ", line_number, ": ", what));
    };
    if (tokenizer.num_merges_ >= kMaxGpt2Merges) {
      return error(absl::StrCat("more than ", kMaxGpt2Merges, " merges"));
    }
    const size_t space = line.find(' ');
    if (space == 0 || space == absl::string_view::npos || space + 1 == line.size() ||
        line.find(' ', space + 1) != absl::string_view::npos) {
      return error(absl::StrCat("expected two tokens separated by one space, got ", Quote(line)));
    }
    uint16_t ids[3];
    const absl::string_view parts[2] = {line.substr(0, space), line.substr(space + 1)};
    std::string merged;
    for (int k = 0; k < 2; ++k) {
      absl::StatusOr<std::string> bytes = TokenBytes(parts[k]);
      if (!bytes.ok()) return error(bytes.status().message());
      const auto it = bytes_to_id.find(*bytes);
      if (it == bytes_to_id.end()) {
        return error(absl::StrCat(Quote(parts[k]), " is not in ", encoder_name));
      }
      ids[k] = it->second;
      merged += *bytes;
    }
    const auto it = bytes_to_id.find(merged);
    if (it == bytes_to_id.end()) {
      return error(absl::StrCat("the merge of ", Quote(line), " is not in ", encoder_name));
    }
    ids[2] = it->second;
    const uint32_t key = uint32_t{ids[0]} << 16 | ids[1];
    const auto [existing, inserted] = tokenizer.merges_.emplace(
        key, Merge{.rank = static_cast<uint32_t>(tokenizer.num_merges_), .id = ids[2]});
    if (!inserted) {
      return error(absl::StrCat("repeats the merge of line ", rank_lines[existing->second.rank]));
    }
    rank_lines.push_back(line_number);
    ++tokenizer.num_merges_;
  }
  return tokenizer;
}

absl::Status Gpt2Tokenizer::EncodeAppend(std::string_view text, std::vector<uint16_t>* out) const {
  if (static_cast<int64_t>(text.size()) > kMaxGpt2EncodeBytes) {
    return absl::InvalidArgumentError(absl::StrCat("text of ", text.size(),
                                                   " bytes: encode at most ", kMaxGpt2EncodeBytes,
                                                   " per call (cut with Gpt2SafeCut)"));
  }
  Gpt2PreTokenizer splitter(text);
  std::string_view piece;
  while (splitter.Next(&piece)) EncodePiece(piece, out);
  return absl::OkStatus();
}

absl::StatusOr<std::vector<uint16_t>> Gpt2Tokenizer::Encode(std::string_view text) const {
  std::vector<uint16_t> ids;
  if (absl::Status s = EncodeAppend(text, &ids); !s.ok()) return s;
  return ids;
}

void Gpt2Tokenizer::EncodePiece(std::string_view piece, std::vector<uint16_t>* out) const {
  if (piece.size() == 1) {
    out->push_back(byte_ids_[static_cast<unsigned char>(piece[0])]);
    return;
  }
  if (piece.size() > kMaxCachedPieceBytes) {
    Bpe(piece, out);
    return;
  }
  {
    absl::MutexLock lock(&cache_->mu);
    const auto it = cache_->pieces.find(Absl(piece));
    if (it != cache_->pieces.end()) {
      out->insert(out->end(), it->second.begin(), it->second.end());
      return;
    }
  }
  const size_t start = out->size();
  Bpe(piece, out);
  absl::MutexLock lock(&cache_->mu);
  if (cache_->pieces.size() >= kMaxCacheEntries) cache_->pieces.clear();
  cache_->pieces.emplace(std::string(piece),
                         std::vector<uint16_t>(out->begin() + start, out->end()));
}

// GPT-2 merges, at each step, every occurrence of the lowest-ranked adjacent
// pair, left to right. Here the pairs wait in a heap ordered by (rank,
// position); all entries of the lowest rank are taken as one batch, in
// position order, before the pairs the batch creates join the heap (one of
// those may rank lower and must not cut in). An entry is still valid if the
// symbols at its position still have its ids: a position's symbol only grows,
// so its id never returns to an earlier one.
void Gpt2Tokenizer::Bpe(std::string_view piece, std::vector<uint16_t>* out) const {
  struct Symbol {
    uint16_t id;
    bool dead;
    int32_t prev, next;  // -1: none
  };
  struct Candidate {
    uint32_t rank;
    int32_t left;
    uint16_t left_id, right_id, merged_id;
  };
  struct Later {
    bool operator()(const Candidate& a, const Candidate& b) const {
      return a.rank != b.rank ? a.rank > b.rank : a.left > b.left;
    }
  };
  const int32_t n = static_cast<int32_t>(piece.size());
  if (n == 0) return;
  std::vector<Symbol> symbols(static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i) {
    symbols[i] = Symbol{.id = byte_ids_[static_cast<unsigned char>(piece[i])],
                        .dead = false,
                        .prev = i - 1,
                        .next = i + 1 < n ? i + 1 : -1};
  }
  std::priority_queue<Candidate, std::vector<Candidate>, Later> heap;
  const auto push_pair = [&](int32_t left) {
    const int32_t right = symbols[left].next;
    if (right < 0) return;
    const auto it = merges_.find(uint32_t{symbols[left].id} << 16 | symbols[right].id);
    if (it == merges_.end()) return;
    heap.push(Candidate{.rank = it->second.rank,
                        .left = left,
                        .left_id = symbols[left].id,
                        .right_id = symbols[right].id,
                        .merged_id = it->second.id});
  };
  for (int32_t i = 0; i + 1 < n; ++i) push_pair(i);
  std::vector<Candidate> batch;
  std::vector<int32_t> merged;
  while (!heap.empty()) {
    const uint32_t rank = heap.top().rank;
    batch.clear();
    while (!heap.empty() && heap.top().rank == rank) {
      batch.push_back(heap.top());
      heap.pop();
    }
    merged.clear();
    for (const Candidate& c : batch) {
      Symbol& left = symbols[c.left];
      if (left.dead || left.id != c.left_id || left.next < 0) continue;
      Symbol& right = symbols[left.next];
      if (right.id != c.right_id) continue;
      left.id = c.merged_id;
      right.dead = true;
      left.next = right.next;
      if (right.next >= 0) symbols[right.next].prev = c.left;
      merged.push_back(c.left);
    }
    for (const int32_t p : merged) {
      if (symbols[p].prev >= 0) push_pair(symbols[p].prev);
      push_pair(p);
    }
  }
  for (int32_t i = 0; i >= 0; i = symbols[i].next) out->push_back(symbols[i].id);
}

absl::StatusOr<std::string> Gpt2Tokenizer::Decode(std::span<const int32_t> ids) const {
  return DecodeWith(id_to_bytes_, ids);
}

absl::StatusOr<std::string> Gpt2Tokenizer::Decode(std::span<const uint16_t> ids) const {
  return DecodeWith(id_to_bytes_, ids);
}

}  // namespace cohort::data
