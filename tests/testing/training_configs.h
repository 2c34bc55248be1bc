#pragma once
// Small single-process TrainingConfigs for tests of the training engine: a
// 2-layer model of width 64 over a synthetic Markov corpus, trained with a
// one-step warm-up.

#include "worker/train/training_config.h"

namespace cohort::testing {

inline train::TrainingConfig SmallTrainingConfig(int global_batch, int micro_batch, int steps) {
  train::TrainingConfig c;
  c.model.layers = 2;
  c.model.heads = 4;
  c.model.width = 64;
  c.model.vocab_size = 64;
  c.model.context_length = 32;
  c.init_seed = 42;
  c.global_batch_size = global_batch;
  c.micro_batch_size = micro_batch;
  c.steps = steps;
  c.lr.max_lr = 1e-3;
  c.lr.min_lr = 1e-4;
  c.lr.warmup_steps = 1;
  c.lr.total_steps = steps;
  c.data.synthetic = true;
  c.data.markov.seed = 7;
  c.data.markov.vocab_size = c.model.vocab_size;
  c.data.markov.alphabet_size = 16;
  c.data.markov.branching = 4;
  c.data.synthetic_tokens = 20000;
  c.data.sample_seed = 11;
  return c;
}

}  // namespace cohort::testing
