#include "worker/compute/attention_report.h"

#include "absl/synchronization/mutex.h"
#include "common/log.h"

namespace cohort::compute {
namespace {

struct Record {
  absl::Mutex mu;
  std::optional<AttentionChoice> latest ABSL_GUARDED_BY(mu);
};

// Never destroyed: a backend may report from a static's destructor.
Record& TheRecord() {
  static Record* const record = new Record;
  return *record;
}

}  // namespace

const char* AttentionImplementationName(AttentionImplementation implementation) {
  switch (implementation) {
    case AttentionImplementation::kKernels: return "kernels";
    case AttentionImplementation::kCudnn: return "cudnn";
  }
  return "unknown";
}

void ReportAttentionChoice(const AttentionChoice& choice, bool fallback) {
  Record& record = TheRecord();
  absl::MutexLock lock(&record.mu);
  const bool same = record.latest.has_value() &&
                    record.latest->implementation == choice.implementation &&
                    record.latest->reason == choice.reason;
  record.latest = choice;
  if (same) return;
  if (fallback) {
    LOG(WARNING) << "attention: the kernels instead of cuDNN's fused attention: " << choice.reason;
  } else {
    LOG(INFO) << "attention: " << AttentionImplementationName(choice.implementation) << " ("
             << choice.reason << ")";
  }
}

std::optional<AttentionChoice> LatestAttentionChoice() {
  Record& record = TheRecord();
  absl::MutexLock lock(&record.mu);
  return record.latest;
}

}  // namespace cohort::compute
