#pragma once
// Proto enum values as people read them, in logs, errors, tables and metric
// labels: the value's name without its type's prefix (JOB_STATE_RUNNING:
// RUNNING), the prefix being what the type's zero value (*_UNSPECIFIED, as
// every enum of proto/cohort/v1 has) puts before UNSPECIFIED. A number the
// enum does not define reads UNKNOWN(n). Thread-safe.

#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/generated_enum_reflection.h"

namespace cohort {

std::string ShortEnumName(const google::protobuf::EnumDescriptor& type, int number);

template <typename Enum>
std::string ShortEnumName(Enum value) {
  return ShortEnumName(*google::protobuf::GetEnumDescriptor<Enum>(), static_cast<int>(value));
}

}  // namespace cohort
