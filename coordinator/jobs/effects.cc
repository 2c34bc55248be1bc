#include "coordinator/jobs/effects.h"

namespace cohort::coordinator {

v1::CoordinatorMessage Effects::Message::WithBase(const v1::CoordinatorMessage& base,
                                                  const v1::CoordinatorMessage& message) {
  v1::CoordinatorMessage full = base;
  full.MergeFrom(message);
  return full;
}

}  // namespace cohort::coordinator
