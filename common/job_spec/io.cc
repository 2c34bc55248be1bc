#include "common/job_spec/io.h"

#include <fcntl.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "google/protobuf/util/json_util.h"
#include "yaml-cpp/yaml.h"

namespace cohort {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::EnumDescriptor;
using google::protobuf::FieldDescriptor;

// ---------------------------------------------------------------------------
// JSON text helpers.

void AppendJsonString(absl::string_view text, std::string* out) {
  out->push_back('"');
  for (const char c : text) {
    switch (c) {
      case '"':
        out->append("\\\"");
        break;
      case '\\':
        out->append("\\\\");
        break;
      case '\n':
        out->append("\\n");
        break;
      case '\r':
        out->append("\\r");
        break;
      case '\t':
        out->append("\\t");
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          absl::StrAppendFormat(out, "\\u%04x", static_cast<unsigned char>(c));
        } else {
          out->push_back(c);  // UTF-8 passes through unchanged.
        }
    }
  }
  out->push_back('"');
}

// True when `text` is a number in JSON's grammar:
// -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
bool IsJsonNumber(absl::string_view text) {
  size_t i = 0;
  const size_t n = text.size();
  auto digits = [&]() {
    const size_t start = i;
    while (i < n && absl::ascii_isdigit(static_cast<unsigned char>(text[i]))) ++i;
    return i > start;
  };
  if (i < n && text[i] == '-') ++i;
  if (i < n && text[i] == '0') {
    ++i;
  } else if (!digits()) {
    return false;
  }
  if (i < n && text[i] == '.') {
    ++i;
    if (!digits()) return false;
  }
  if (i < n && (text[i] == 'e' || text[i] == 'E')) {
    ++i;
    if (i < n && (text[i] == '+' || text[i] == '-')) ++i;
    if (!digits()) return false;
  }
  return i == n;
}

// ---------------------------------------------------------------------------
// YAML scalars.

// A plain (unquoted, untagged-as-string) scalar may be a number, bool or
// null; a quoted one is always a string.
bool IsPlainScalar(const YAML::Node& node) {
  const std::string& tag = node.Tag();
  return tag != "!" && tag != "tag:yaml.org,2002:str";
}

bool IsYamlNull(absl::string_view text) {
  return text.empty() || text == "~" || text == "null" || text == "Null" || text == "NULL";
}

bool IsYamlTrue(absl::string_view t) { return t == "true" || t == "True" || t == "TRUE"; }
bool IsYamlFalse(absl::string_view t) { return t == "false" || t == "False" || t == "FALSE"; }

// YAML's special floats in the spelling protobuf's JSON parser accepts.
const char* SpecialFloat(absl::string_view t) {
  if (t == ".inf" || t == ".Inf" || t == ".INF" || t == "+.inf" || t == "+.Inf" || t == "+.INF") {
    return "Infinity";
  }
  if (t == "-.inf" || t == "-.Inf" || t == "-.INF") return "-Infinity";
  if (t == ".nan" || t == ".NaN" || t == ".NAN") return "NaN";
  return nullptr;
}

std::string Where(const YAML::Node& node) {
  const YAML::Mark mark = node.Mark();
  if (mark.is_null()) return "";
  return absl::StrFormat("line %d, column %d: ", mark.line + 1, mark.column + 1);
}

const char* KindName(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Map:
      return "a map";
    case YAML::NodeType::Sequence:
      return "a list";
    case YAML::NodeType::Scalar:
      return "a scalar";
    case YAML::NodeType::Null:
      return "nothing";
    default:
      return "an undefined node";
  }
}

std::string FieldPath(const std::string& parent, absl::string_view name) {
  return parent.empty() ? std::string(name) : absl::StrCat(parent, ".", name);
}

// Schema-free conversion of a scalar: plain scalars that read as JSON
// numbers, bools or null keep that type; everything else is a string.
void AppendUntypedScalar(const YAML::Node& node, std::string* out) {
  const std::string& text = node.Scalar();
  if (IsPlainScalar(node)) {
    if (IsYamlNull(text)) {
      out->append("null");
      return;
    }
    if (IsYamlTrue(text)) {
      out->append("true");
      return;
    }
    if (IsYamlFalse(text)) {
      out->append("false");
      return;
    }
    if (IsJsonNumber(text)) {
      out->append(text);
      return;
    }
    if (const char* special = SpecialFloat(text)) {
      AppendJsonString(special, out);
      return;
    }
  }
  AppendJsonString(text, out);
}

void AppendUntyped(const YAML::Node& node, std::string* out) {
  switch (node.Type()) {
    case YAML::NodeType::Map: {
      out->push_back('{');
      bool first = true;
      for (const auto& entry : node) {
        if (!first) out->push_back(',');
        first = false;
        AppendJsonString(entry.first.Scalar(), out);
        out->push_back(':');
        AppendUntyped(entry.second, out);
      }
      out->push_back('}');
      return;
    }
    case YAML::NodeType::Sequence: {
      out->push_back('[');
      bool first = true;
      for (const auto& element : node) {
        if (!first) out->push_back(',');
        first = false;
        AppendUntyped(element, out);
      }
      out->push_back(']');
      return;
    }
    case YAML::NodeType::Scalar:
      AppendUntypedScalar(node, out);
      return;
    default:
      out->append("null");
  }
}

// ---------------------------------------------------------------------------
// Schema-guided conversion.

class GuidedConverter {
 public:
  absl::Status Message(const YAML::Node& node, const Descriptor& type, const std::string& path,
                       std::string* out);

 private:
  absl::Status Field(const YAML::Node& node, const FieldDescriptor& field, const std::string& path,
                     std::string* out);
  absl::Status Singular(const YAML::Node& node, const FieldDescriptor& field,
                        const std::string& path, std::string* out);
  absl::Status Scalar(const YAML::Node& node, const FieldDescriptor& field, const std::string& path,
                      std::string* out);
};

// The field named `key` in proto (snake_case) or JSON (lowerCamelCase) form,
// the two spellings protobuf's JSON parser accepts; nullptr if none.
const FieldDescriptor* FindField(const Descriptor& type, const std::string& key) {
  if (const FieldDescriptor* field = type.FindFieldByName(key)) return field;
  for (int i = 0; i < type.field_count(); ++i) {
    if (type.field(i)->json_name() == key) return type.field(i);
  }
  return nullptr;
}

absl::Status ShapeError(const YAML::Node& node, const std::string& path,
                        absl::string_view expected) {
  return absl::InvalidArgumentError(absl::StrCat(Where(node), path.empty() ? "the document" : path,
                                                 ": expected ", expected, ", got ",
                                                 KindName(node)));
}

absl::Status GuidedConverter::Message(const YAML::Node& node, const Descriptor& type,
                                      const std::string& path, std::string* out) {
  if (!node.IsMap()) {
    return ShapeError(node, path, absl::StrCat("a map of ", type.full_name(), " fields"));
  }
  out->push_back('{');
  bool first = true;
  // Where each field was given: YAML keys are unique, and a repeated one
  // would silently replace the first (protobuf's JSON parser keeps the last).
  std::map<const FieldDescriptor*, std::string> given;
  for (const auto& entry : node) {
    if (!entry.first.IsScalar()) {
      return absl::InvalidArgumentError(
          absl::StrCat(Where(entry.first), "field names must be scalars"));
    }
    const std::string& key = entry.first.Scalar();
    const FieldDescriptor* field = FindField(type, key);
    if (field == nullptr) {
      std::vector<std::string> known;
      for (int i = 0; i < type.field_count(); ++i) {
        known.push_back(type.field(i)->name());
      }
      return absl::InvalidArgumentError(
          absl::StrCat(Where(entry.first), "unknown field \"", key, "\"",
                       path.empty() ? "" : absl::StrCat(" in ", path), " (", type.full_name(),
                       "); known fields: ", absl::StrJoin(known, ", ")));
    }
    const auto [earlier, added] = given.emplace(field, Where(entry.first));
    if (!added) {
      const absl::string_view first_at = absl::StripSuffix(earlier->second, ": ");
      return absl::InvalidArgumentError(absl::StrCat(
          Where(entry.first), "field \"", key, "\"", path.empty() ? "" : absl::StrCat(" in ", path),
          " is given twice", first_at.empty() ? "" : absl::StrCat(" (first at ", first_at, ")")));
    }
    if (!first) out->push_back(',');
    first = false;
    AppendJsonString(field->name(), out);
    out->push_back(':');
    if (absl::Status s = Field(entry.second, *field, FieldPath(path, key), out); !s.ok()) {
      return s;
    }
  }
  out->push_back('}');
  return absl::OkStatus();
}

absl::Status GuidedConverter::Field(const YAML::Node& node, const FieldDescriptor& field,
                                    const std::string& path, std::string* out) {
  if (node.IsNull()) {
    out->append("null");  // protobuf treats null as "not set"
    return absl::OkStatus();
  }
  if (field.is_map()) {
    if (!node.IsMap()) return ShapeError(node, path, "a map");
    const FieldDescriptor& value_field = *field.message_type()->map_value();
    out->push_back('{');
    bool first = true;
    for (const auto& entry : node) {
      if (!entry.first.IsScalar()) {
        return absl::InvalidArgumentError(
            absl::StrCat(Where(entry.first), path, ": map keys must be scalars"));
      }
      if (!first) out->push_back(',');
      first = false;
      AppendJsonString(entry.first.Scalar(), out);
      out->push_back(':');
      const std::string key_path = absl::StrCat(path, "[", entry.first.Scalar(), "]");
      if (absl::Status s = Singular(entry.second, value_field, key_path, out); !s.ok()) {
        return s;
      }
    }
    out->push_back('}');
    return absl::OkStatus();
  }
  if (field.is_repeated()) {
    if (!node.IsSequence()) return ShapeError(node, path, "a list");
    out->push_back('[');
    for (size_t i = 0; i < node.size(); ++i) {
      if (i > 0) out->push_back(',');
      if (absl::Status s = Singular(node[i], field, absl::StrCat(path, "[", i, "]"), out);
          !s.ok()) {
        return s;
      }
    }
    out->push_back(']');
    return absl::OkStatus();
  }
  return Singular(node, field, path, out);
}

absl::Status GuidedConverter::Singular(const YAML::Node& node, const FieldDescriptor& field,
                                       const std::string& path, std::string* out) {
  if (node.IsNull()) {
    out->append("null");
    return absl::OkStatus();
  }
  if (field.cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
    const Descriptor& type = *field.message_type();
    // Well-known types (Timestamp, Duration, Struct, ...) have their own JSON
    // forms; protobuf checks those.
    if (absl::StartsWith(type.full_name(), "google.protobuf.")) {
      AppendUntyped(node, out);
      return absl::OkStatus();
    }
    return Message(node, type, path, out);
  }
  if (!node.IsScalar()) {
    return ShapeError(node, path, absl::StrCat("a single ", field.type_name(), " value"));
  }
  return Scalar(node, field, path, out);
}

template <typename T>
bool ParsesAsInteger(absl::string_view text) {
  T value;
  return absl::SimpleAtoi(text, &value);
}

absl::Status GuidedConverter::Scalar(const YAML::Node& node, const FieldDescriptor& field,
                                     const std::string& path, std::string* out) {
  const std::string& text = node.Scalar();
  const bool plain = IsPlainScalar(node);
  auto bad_value = [&](absl::string_view expected) {
    return absl::InvalidArgumentError(
        absl::StrCat(Where(node), path, ": expected ", expected, ", got \"", text, "\""));
  };
  switch (field.cpp_type()) {
    case FieldDescriptor::CPPTYPE_STRING:
      // A string field keeps the text as written, even `name: 2024`.
      AppendJsonString(text, out);
      return absl::OkStatus();
    case FieldDescriptor::CPPTYPE_BOOL:
      if (IsYamlTrue(text)) {
        out->append("true");
      } else if (IsYamlFalse(text)) {
        out->append("false");
      } else {
        return bad_value("true or false");
      }
      return absl::OkStatus();
    case FieldDescriptor::CPPTYPE_INT32:
      if (!ParsesAsInteger<int32_t>(text)) return bad_value("a 32-bit integer");
      break;
    case FieldDescriptor::CPPTYPE_INT64:
      if (!ParsesAsInteger<int64_t>(text)) return bad_value("a 64-bit integer");
      break;
    case FieldDescriptor::CPPTYPE_UINT32:
      if (!ParsesAsInteger<uint32_t>(text)) {
        return bad_value("an unsigned 32-bit integer");
      }
      break;
    case FieldDescriptor::CPPTYPE_UINT64:
      if (!ParsesAsInteger<uint64_t>(text)) {
        return bad_value("an unsigned 64-bit integer");
      }
      break;
    case FieldDescriptor::CPPTYPE_FLOAT:
    case FieldDescriptor::CPPTYPE_DOUBLE: {
      if (const char* special = SpecialFloat(text); special != nullptr) {
        AppendJsonString(special, out);
        return absl::OkStatus();
      }
      double value;
      if (!absl::SimpleAtod(text, &value)) return bad_value("a number");
      break;
    }
    case FieldDescriptor::CPPTYPE_ENUM: {
      const EnumDescriptor& type = *field.enum_type();
      int number;
      if (type.FindValueByName(text) == nullptr &&
          !(absl::SimpleAtoi(text, &number) && type.FindValueByNumber(number) != nullptr)) {
        std::vector<std::string> names;
        for (int i = 0; i < type.value_count(); ++i) {
          names.push_back(type.value(i)->name());
        }
        return bad_value(absl::StrCat("one of ", absl::StrJoin(names, ", ")));
      }
      AppendJsonString(text, out);
      return absl::OkStatus();
    }
    case FieldDescriptor::CPPTYPE_MESSAGE:
      break;  // handled by Singular
  }
  // A number: unquoted when JSON can carry it as written; protobuf's parser
  // also reads numbers from strings (e.g. "+3", "1_000" is refused above).
  if (plain && IsJsonNumber(text)) {
    out->append(text);
  } else {
    AppendJsonString(text, out);
  }
  return absl::OkStatus();
}

std::string ErrnoMessage(int error) {
  char buffer[256];
  // GNU strerror_r returns the message pointer, which may not be `buffer`.
  return std::string(strerror_r(error, buffer, sizeof(buffer)));
}

absl::StatusCode ErrnoCode(int error) {
  switch (error) {
    case ENOENT:
    case ENOTDIR:
      return absl::StatusCode::kNotFound;
    case EACCES:
    case EPERM:
      return absl::StatusCode::kPermissionDenied;
    default:
      return absl::StatusCode::kInvalidArgument;
  }
}

// The whole file, or the OS error as "<path>: <reason>"; InvalidArgument
// past `max_bytes` (a device like /dev/zero never ends).
absl::StatusOr<std::string> ReadWholeFile(const std::string& path, size_t max_bytes) {
  auto os_error = [&path](int error) {
    return absl::Status(ErrnoCode(error), absl::StrCat(path, ": ", ErrnoMessage(error)));
  };
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return os_error(errno);
  std::string text;
  char buffer[64 * 1024];
  while (true) {
    const ssize_t n = read(fd, buffer, sizeof(buffer));
    if (n < 0) {
      if (errno == EINTR) continue;
      const int error = errno;  // e.g. EISDIR for a directory
      close(fd);
      return os_error(error);
    }
    if (n == 0) break;
    if (text.size() + static_cast<size_t>(n) > max_bytes) {
      close(fd);
      return absl::InvalidArgumentError(absl::StrCat(
          path, ": larger than ", max_bytes, " bytes, the most a job spec file may hold"));
    }
    text.append(buffer, static_cast<size_t>(n));
  }
  close(fd);
  return text;
}

}  // namespace

JobSpecFormat DetectJobSpecFormat(absl::string_view path, absl::string_view contents) {
  const std::string lower = absl::AsciiStrToLower(path);
  if (absl::EndsWith(lower, ".json")) return JobSpecFormat::kJson;
  if (absl::EndsWith(lower, ".yaml") || absl::EndsWith(lower, ".yml")) {
    return JobSpecFormat::kYaml;
  }
  const absl::string_view body = absl::StripLeadingAsciiWhitespace(contents);
  return absl::StartsWith(body, "{") ? JobSpecFormat::kJson : JobSpecFormat::kYaml;
}

absl::StatusOr<std::string> YamlToJson(absl::string_view yaml, const Descriptor* schema) {
  // yaml-cpp reports errors by exception; they stop here (docs/conventions.md, Errors).
  try {
    const YAML::Node root = YAML::Load(std::string(yaml));
    std::string out;
    if (schema == nullptr) {
      AppendUntyped(root, &out);
      return out;
    }
    if (root.IsNull() || !root.IsDefined()) {
      return absl::InvalidArgumentError("the document is empty");
    }
    GuidedConverter converter;
    if (absl::Status s = converter.Message(root, *schema, "", &out); !s.ok()) {
      return s;
    }
    return out;
  } catch (const YAML::Exception& e) {
    if (e.mark.is_null()) {
      return absl::InvalidArgumentError(absl::StrCat("YAML error: ", e.msg));
    }
    return absl::InvalidArgumentError(absl::StrFormat("line %d, column %d: YAML syntax error: %s",
                                                      e.mark.line + 1, e.mark.column + 1, e.msg));
  }
}

absl::Status ParseMessage(absl::string_view contents, JobSpecFormat format,
                          google::protobuf::Message* message) {
  std::string json;
  if (format == JobSpecFormat::kYaml) {
    absl::StatusOr<std::string> converted = YamlToJson(contents, message->GetDescriptor());
    if (!converted.ok()) return converted.status();
    json = *std::move(converted);
  } else {
    if (absl::StripAsciiWhitespace(contents).empty()) {
      return absl::InvalidArgumentError("the document is empty");
    }
    json = std::string(contents);
  }
  message->Clear();
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = false;
  const auto status = google::protobuf::util::JsonStringToMessage(json, message, options);
  if (!status.ok()) {
    return absl::InvalidArgumentError(status.message().ToString());
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::JobSpec> ParseJobSpec(absl::string_view contents, JobSpecFormat format) {
  v1::JobSpec spec;
  if (absl::Status s = ParseMessage(contents, format, &spec); !s.ok()) {
    return s;
  }
  return spec;
}

absl::StatusOr<v1::JobSpec> ReadJobSpecFile(const std::string& path) {
  absl::StatusOr<std::string> text = ReadWholeFile(path, kMaxJobSpecFileBytes);
  if (!text.ok()) return text.status();
  absl::StatusOr<v1::JobSpec> spec = ParseJobSpec(*text, DetectJobSpecFormat(path, *text));
  if (!spec.ok()) {
    return absl::Status(spec.status().code(), absl::StrCat(path, ": ", spec.status().message()));
  }
  return spec;
}

std::string ToJson(const google::protobuf::Message& message, bool multiline) {
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = multiline;
  options.always_print_primitive_fields = true;
  std::string out;
  const auto status = google::protobuf::util::MessageToJsonString(message, &out, options);
  if (!status.ok()) {
    out = "{\"error\":";
    AppendJsonString(status.message().ToString(), &out);
    out.push_back('}');
    return out;
  }
  // The pretty printer ends with a newline, the compact one does not; callers
  // add their own.
  while (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

}  // namespace cohort
