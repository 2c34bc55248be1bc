#include "tests/testing/job_specs.h"

namespace cohort::testing {

v1::JobSpec SmallJobSpec(const std::string& name, int tensor, int min_workers, int max_workers) {
  v1::JobSpec spec;
  spec.set_name(name);
  spec.mutable_model()->set_layers(2);
  spec.mutable_model()->set_heads(4);
  spec.mutable_model()->set_width(64);
  spec.mutable_model()->set_vocab_size(256);
  spec.mutable_model()->set_context_length(64);
  spec.mutable_data()->mutable_synthetic()->set_seed(1);
  spec.mutable_optimizer()->set_learning_rate(1e-3);
  spec.mutable_batch()->set_global_batch_size(kSmallJobMicroBatches * kSmallJobMicroBatchSize);
  spec.mutable_batch()->set_micro_batch_size(kSmallJobMicroBatchSize);
  spec.mutable_parallelism()->set_tensor(tensor);
  spec.mutable_elastic()->set_min_workers(min_workers);
  spec.mutable_elastic()->set_max_workers(max_workers);
  spec.set_steps(100);
  return spec;
}

}  // namespace cohort::testing
