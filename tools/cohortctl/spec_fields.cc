#include "tools/cohortctl/spec_fields.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/log.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"

namespace cohort::cohortctl {
namespace {

using google::protobuf::EnumValueDescriptor;
using google::protobuf::FieldDescriptor;
using google::protobuf::Message;

// The field at the end of `path` and the message holding it: const for
// reading (a missing message reads as its defaults), mutable for writing.
template <typename M>
std::pair<M*, const FieldDescriptor*> Resolve(M* root, absl::string_view path) {
  M* message = root;
  const std::vector<absl::string_view> names = absl::StrSplit(path, '.');
  for (size_t i = 0; i < names.size(); ++i) {
    const FieldDescriptor* field = message->GetDescriptor()->FindFieldByName(std::string(names[i]));
    CHECK(field != nullptr) << "no JobSpec field " << path;
    if (i + 1 == names.size()) {
      CHECK(field->cpp_type() != FieldDescriptor::CPPTYPE_MESSAGE && !field->is_repeated())
          << "JobSpec field " << path << " is not a scalar";
      return {message, field};
    }
    if constexpr (std::is_const_v<M>) {
      message = &message->GetReflection()->GetMessage(*message, field);
    } else {
      message = message->GetReflection()->MutableMessage(message, field);
    }
  }
  LOG(FATAL) << "empty JobSpec field path";
  return {nullptr, nullptr};
}

// DEVICE_KIND_CPU -> cpu: the one-word form the flags take and the help shows.
std::string EnumWord(const EnumValueDescriptor& value) {
  const std::string& name = value.name();
  return absl::AsciiStrToLower(name.substr(name.rfind('_') + 1));
}

absl::Status BadValue(absl::string_view flag, absl::string_view value, absl::string_view want) {
  return absl::InvalidArgumentError(
      absl::StrCat("--", flag, " must be ", want, ", not \"", value, "\""));
}

// Parses `value` as an Int and hands it to `set`.
template <typename Int, typename Setter>
absl::Status SetInt(absl::string_view flag, absl::string_view value, Setter set) {
  Int parsed = 0;
  if (absl::SimpleAtoi(value, &parsed)) {
    set(parsed);
    return absl::OkStatus();
  }
  if constexpr (std::is_signed_v<Int>) {
    return BadValue(flag, value,
                    absl::StrCat("an integer from ", std::numeric_limits<Int>::min(), " to ",
                                 std::numeric_limits<Int>::max()));
  } else {
    return BadValue(flag, value,
                    absl::StrCat("an integer from 0 to ", std::numeric_limits<Int>::max()));
  }
}

}  // namespace

std::string SpecFieldText(const v1::JobSpec& spec, absl::string_view path) {
  const auto [message, field] = Resolve<const Message>(&spec, path);
  const google::protobuf::Reflection& r = *message->GetReflection();
  switch (field->cpp_type()) {
    case FieldDescriptor::CPPTYPE_INT32: return absl::StrCat(r.GetInt32(*message, field));
    case FieldDescriptor::CPPTYPE_INT64: return absl::StrCat(r.GetInt64(*message, field));
    case FieldDescriptor::CPPTYPE_UINT32: return absl::StrCat(r.GetUInt32(*message, field));
    case FieldDescriptor::CPPTYPE_UINT64: return absl::StrCat(r.GetUInt64(*message, field));
    case FieldDescriptor::CPPTYPE_DOUBLE: return absl::StrCat(r.GetDouble(*message, field));
    case FieldDescriptor::CPPTYPE_FLOAT: return absl::StrCat(r.GetFloat(*message, field));
    case FieldDescriptor::CPPTYPE_BOOL: return r.GetBool(*message, field) ? "on" : "off";
    case FieldDescriptor::CPPTYPE_ENUM: return EnumWord(*r.GetEnum(*message, field));
    case FieldDescriptor::CPPTYPE_STRING: {
      const std::string value = r.GetString(*message, field);
      if (path == "data.shards.pattern" && value.empty()) return "synthetic";
      return value;
    }
    case FieldDescriptor::CPPTYPE_MESSAGE: break;  // refused by Resolve
  }
  return "";
}

absl::Status SetSpecField(absl::string_view path, absl::string_view flag, absl::string_view value,
                          v1::JobSpec* spec) {
  const auto [message, field] = Resolve<Message>(spec, path);
  const google::protobuf::Reflection& r = *message->GetReflection();
  switch (field->cpp_type()) {
    case FieldDescriptor::CPPTYPE_INT32:
      return SetInt<int32_t>(flag, value, [&](int32_t v) { r.SetInt32(message, field, v); });
    case FieldDescriptor::CPPTYPE_INT64:
      return SetInt<int64_t>(flag, value, [&](int64_t v) { r.SetInt64(message, field, v); });
    case FieldDescriptor::CPPTYPE_UINT32:
      return SetInt<uint32_t>(flag, value, [&](uint32_t v) { r.SetUInt32(message, field, v); });
    case FieldDescriptor::CPPTYPE_UINT64:
      return SetInt<uint64_t>(flag, value, [&](uint64_t v) { r.SetUInt64(message, field, v); });
    case FieldDescriptor::CPPTYPE_DOUBLE:
    case FieldDescriptor::CPPTYPE_FLOAT: {
      double v = 0;
      if (!absl::SimpleAtod(value, &v) || !std::isfinite(v)) {
        return BadValue(flag, value, "a finite number");
      }
      if (field->cpp_type() == FieldDescriptor::CPPTYPE_DOUBLE) {
        r.SetDouble(message, field, v);
      } else {
        r.SetFloat(message, field, static_cast<float>(v));
      }
      return absl::OkStatus();
    }
    case FieldDescriptor::CPPTYPE_BOOL: {
      bool v = false;
      if (!absl::SimpleAtob(value, &v)) return BadValue(flag, value, "true or false");
      r.SetBool(message, field, v);
      return absl::OkStatus();
    }
    case FieldDescriptor::CPPTYPE_ENUM: {
      // Every value but the first (*_UNSPECIFIED, which means "not given").
      const google::protobuf::EnumDescriptor& type = *field->enum_type();
      std::vector<std::string> words;
      const std::string wanted = absl::AsciiStrToLower(value);
      for (int i = 1; i < type.value_count(); ++i) {
        words.push_back(EnumWord(*type.value(i)));
        if (words.back() == wanted) {
          r.SetEnum(message, field, type.value(i));
          return absl::OkStatus();
        }
      }
      // "cpu or gpu", "fp32, tf32 or bf16"
      std::string choices = words.back();
      if (words.size() > 1) {
        choices = absl::StrCat(
            absl::StrJoin(std::vector<std::string>(words.begin(), words.end() - 1), ", "), " or ",
            words.back());
      }
      return BadValue(flag, value, choices);
    }
    case FieldDescriptor::CPPTYPE_STRING:
      r.SetString(message, field, std::string(value));
      return absl::OkStatus();
    case FieldDescriptor::CPPTYPE_MESSAGE: break;  // refused by Resolve
  }
  return absl::OkStatus();
}

}  // namespace cohort::cohortctl
