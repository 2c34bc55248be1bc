#include "common/enum_names.h"

#include "absl/strings/strip.h"
#include "google/protobuf/descriptor.h"

namespace cohort {

std::string ShortEnumName(const google::protobuf::EnumDescriptor& type, int number) {
  const google::protobuf::EnumValueDescriptor* value = type.FindValueByNumber(number);
  if (value == nullptr) return absl::StrCat("UNKNOWN(", number, ")");
  absl::string_view name = value->name();
  const google::protobuf::EnumValueDescriptor* zero = type.FindValueByNumber(0);
  if (zero != nullptr) {
    absl::string_view prefix = zero->name();
    if (absl::ConsumeSuffix(&prefix, "UNSPECIFIED")) absl::ConsumePrefix(&name, prefix);
  }
  return std::string(name);
}

}  // namespace cohort
