#pragma once
// The request selectors of coordinator_rpc_fuzzer (one record's first byte,
// modulo kOpCount). Shared with make_fuzz_seeds, which writes its corpus.

#include <cstdint>

namespace cohort::fuzz {

enum Op : uint8_t {
  kSubmit,
  kGetJob,
  kListJobs,
  kCancel,
  kScale,
  kWatch,
  kUnwatch,
  kKvSet,
  kKvGet,
  kKvWaitFor,
  kAttachMessage,  // payload: stream slot, then a WorkerMessage
  kAttachClose,    // payload: stream slot
  kWorkerReply,    // payload: stream slot, state, step: a status built from the last assignment
  kListWorkers,
  kDrain,
  kTick,           // payload: milliseconds to advance (u32 LE, mod 120 s)
  kUploadMessage,  // payload: upload slot, then an UploadRequest
  kUploadClose,    // payload: upload slot
  kListCheckpoints,
  kGetManifest,
  kDownload,
  kDeleteCheckpoint,
  kQuiesce,
  kOpCount
};

}  // namespace cohort::fuzz
