// Fuzz target: checkpoint manifests and their chunk boxes, wherever they are
// decoded or checked from bytes.
//
// Input: one selector byte, then a serialized cohort.v1.CheckpointManifest
// (inputs that do not parse are skipped).
//   selector % 4 == 0  coverage: CheckCoverage (the commit rule) on every
//                      tensor, against a brute-force count of each element
//                      when the shape is small
//                   1  stores: the manifest's chunks put, committed, listed,
//                      opened, read back and deleted, in RocksDbCheckpointStore
//                      (one database per process, on tmpfs, left empty after
//                      each input) and InMemoryCheckpointStore
//                   2  cohortctl: FormatManifest, and FormatCheckpointTable
//                      of the same bytes as a ListCheckpointsResponse
//                   3  safetensors: PlanSafetensors of the tensors and
//                      objects, as `cohortctl checkpoint export` plans a file
//
// The shapes and names given to CheckCoverage, the stores and the planner are
// those CheckpointUploads admits (checkpoint_uploads.cc CheckHeader): at most
// 8 dimensions, each >= 0, under 2^60 bytes in all; tensor names of
// [A-Za-z0-9_/.-]; job ids of [a-z0-9-]. Boxes, sizes, crcs and objects are
// as fuzzed.

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cohort/v1/checkpoints.pb.h"
#include "common/box.h"
#include "common/box_proto.h"
#include "common/crc32c.h"
#include "coordinator/checkpoints/checkpoint_coverage.h"
#include "coordinator/checkpoints/checkpoint_store.h"
#include "coordinator/checkpoints/checkpoint_uploads.h"
#include "coordinator/store/rocksdb_checkpoint_store.h"
#include "fuzz/fuzz_support.h"
#include "google/protobuf/util/message_differencer.h"
#include "rocksdb/db.h"
#include "tools/cohortctl/checkpoint_format.h"
#include "tools/cohortctl/safetensors.h"

namespace cohort::fuzz {
namespace {

using coordinator::CheckpointReader;
using coordinator::CheckpointStore;
using coordinator::ChunkBytes;
using coordinator::PendingCheckpoint;

// Largest tensor the brute-force coverage count handles.
constexpr int64_t kMaxCountedElements = 4096;
// Chunk bytes put into the stores are cut to this.
constexpr size_t kMaxStoredChunkBytes = 4096;

// CheckHeader's shape rule.
bool AdmittedShape(const v1::TensorInfo& t) {
  if (t.global_shape_size() > 8) return false;
  int64_t elements = 1;
  for (int64_t d : t.global_shape()) {
    if (d < 0 || (d > 0 && elements > std::numeric_limits<int64_t>::max() / 8 / d)) return false;
    elements *= d;
  }
  return true;
}

bool AdmittedJobId(const std::string& id) {
  if (id.empty() || id.size() > 80) return false;
  for (char c : id) {
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-')) return false;
  }
  return true;
}

// ---- mode 0: coverage ----

// Whether every box is inside `shape` and every element is covered exactly
// once, counted element by element. `shape` has at most kMaxCountedElements.
bool CoversExactlyOnce(const std::vector<int64_t>& shape, const std::vector<Box>& boxes) {
  int64_t total = 1;
  for (int64_t d : shape) total *= d;
  std::vector<int> count(static_cast<size_t>(total), 0);
  for (const Box& box : boxes) {
    if (!BoxWithin(box, shape)) return false;
    if (box.empty()) continue;
    std::vector<int64_t> point = box.start;
    const Box whole = WholeBox(shape);
    for (;;) {
      ++count[static_cast<size_t>(FlatIndexIn(whole, point))];
      int d = box.rank() - 1;
      while (d >= 0) {
        if (++point[d] < box.start[d] + box.extent[d]) break;
        point[d] = box.start[d];
        --d;
      }
      if (d < 0) break;
    }
  }
  for (int c : count) {
    if (c != 1) return false;
  }
  return true;
}

void FuzzCoverage(const v1::CheckpointManifest& manifest) {
  for (const v1::TensorInfo& t : manifest.tensors()) {
    if (!AdmittedShape(t)) continue;
    const std::vector<int64_t> shape(t.global_shape().begin(), t.global_shape().end());
    std::vector<Box> boxes;
    for (const v1::ChunkInfo& c : t.chunks()) boxes.push_back(BoxFromProto(c.box()));
    const absl::Status covered = coordinator::CheckCoverage(t.name(), shape, boxes);
    CheckHandlerError(covered, "CheckCoverage");
    Require(covered.ok() || covered.code() == absl::StatusCode::kFailedPrecondition,
            "CheckCoverage failed with a code other than FAILED_PRECONDITION");
    int64_t total = 1;
    for (int64_t d : shape) total *= d;
    if (total <= kMaxCountedElements) {
      Require(covered.ok() == CoversExactlyOnce(shape, boxes),
              covered.ok() ? "CheckCoverage accepted chunks that do not tile the tensor"
                           : "CheckCoverage refused chunks that tile the tensor");
    }
  }
}

// ---- mode 1: stores ----

// What the input puts: the manifest made admissible, and the bytes of each
// chunk (a pattern of the chunk's size, cut to kMaxStoredChunkBytes).
struct StoreCase {
  v1::CheckpointManifest manifest;
  PendingCheckpoint pending;
  // (tensor, box start) -> bytes, the last put winning, as in both stores.
  std::map<std::pair<std::string, std::vector<int64_t>>, std::string> stored;
  // Whether every (tensor, index) and (tensor, box start) is unique, as
  // CheckpointUploads makes them; ReadChunk results are predicted only then.
  bool unique_chunks = true;
};

StoreCase MakeStoreCase(v1::CheckpointManifest manifest) {
  StoreCase c;
  if (!AdmittedJobId(manifest.job_id())) manifest.set_job_id("fuzz-1");
  if (manifest.step() < 0) manifest.set_step(-(manifest.step() + 1));
  manifest.set_generation(1 + manifest.generation() % (uint64_t{1} << 32));
  std::set<std::pair<std::string, uint32_t>> indices;
  std::set<std::pair<std::string, std::vector<int64_t>>> starts;
  for (v1::TensorInfo& t : *manifest.mutable_tensors()) {
    if (!coordinator::ValidTensorName(t.name())) t.set_name("t");
    if (!AdmittedShape(t)) t.clear_global_shape();
    for (const v1::ChunkInfo& chunk : t.chunks()) {
      std::vector<int64_t> start(chunk.box().start().begin(), chunk.box().start().end());
      c.unique_chunks = c.unique_chunks && indices.insert({t.name(), chunk.index()}).second &&
                        starts.insert({t.name(), start}).second;
    }
  }
  c.manifest = std::move(manifest);
  c.pending = PendingCheckpoint{JobId(c.manifest.job_id()), Step(c.manifest.step()),
                                Generation(c.manifest.generation())};
  for (const v1::TensorInfo& t : c.manifest.tensors()) {
    for (const v1::ChunkInfo& chunk : t.chunks()) {
      std::string bytes(std::min<uint64_t>(chunk.bytes(), kMaxStoredChunkBytes),
                        static_cast<char>(chunk.index()));
      std::vector<int64_t> start(chunk.box().start().begin(), chunk.box().start().end());
      c.stored[{t.name(), start}] = std::move(bytes);
    }
  }
  return c;
}

bool SameManifest(const v1::CheckpointManifest& a, const v1::CheckpointManifest& b) {
  return google::protobuf::util::MessageDifferencer::Equals(a, b);
}

void RoundTrip(CheckpointStore& store, const StoreCase& c, const char* name) {
  const v1::CheckpointManifest& m = c.manifest;
  const JobId job(m.job_id());
  auto require_ok = [name](const absl::Status& s, const char* what) {
    if (!s.ok()) {
      std::fprintf(stderr, "fuzz finding: %s %s: %s\n", name, what, s.ToString().c_str());
      std::abort();
    }
  };
  require_ok(store.BeginPending(c.pending), "BeginPending");
  for (const v1::TensorInfo& t : m.tensors()) {
    for (const v1::ChunkInfo& chunk : t.chunks()) {
      // The pattern of the chunk's own index; a later chunk with the same
      // start replaces it (MakeStoreCase predicts which is left).
      const std::string own(std::min<uint64_t>(chunk.bytes(), kMaxStoredChunkBytes),
                            static_cast<char>(chunk.index()));
      require_ok(store.PutChunk(c.pending, t.name(), BoxFromProto(chunk.box()), own), "PutChunk");
    }
  }
  absl::StatusOr<std::vector<PendingCheckpoint>> pending = store.ListPending();
  require_ok(pending.status(), "ListPending");
  Require(pending->size() == 1 && (*pending)[0] == c.pending,
          "ListPending does not return the one attempt begun");
  require_ok(store.Commit(m), "Commit");

  absl::StatusOr<std::vector<v1::CheckpointManifest>> listed = store.List(job);
  require_ok(listed.status(), "List");
  Require(listed->size() == 1 && SameManifest((*listed)[0], m),
          "List does not return the committed manifest");
  pending = store.ListPending();
  require_ok(pending.status(), "ListPending");
  Require(pending->empty(), "the marker outlived the commit");

  for (const std::optional<Step> step : {std::optional<Step>(Step(m.step())),
                                         std::optional<Step>()}) {
    absl::StatusOr<std::unique_ptr<CheckpointReader>> reader = store.Open(job, step);
    require_ok(reader.status(), "Open");
    Require(SameManifest((*reader)->manifest(), m), "Open returns another manifest");
    for (const v1::TensorInfo& t : m.tensors()) {
      for (const v1::ChunkInfo& chunk : t.chunks()) {
        absl::StatusOr<ChunkBytes> bytes = (*reader)->ReadChunk(t, chunk);
        CheckHandlerError(bytes.status(), "ReadChunk");
        Require(bytes.ok() || bytes.status().code() == absl::StatusCode::kDataLoss,
                "ReadChunk failed with a code other than DATA_LOSS");
        if (!c.unique_chunks) continue;
        std::vector<int64_t> start(chunk.box().start().begin(), chunk.box().start().end());
        const std::string& put = c.stored.at({t.name(), start});
        const bool intact = put.size() == chunk.bytes() && Crc32c(put) == chunk.crc32c();
        Require(bytes.ok() == intact, bytes.ok() ? "ReadChunk returned bytes that do not verify"
                                                 : "ReadChunk refused intact bytes");
        if (bytes.ok()) Require(bytes->view() == put, "ReadChunk returned other bytes");
      }
    }
  }
  require_ok(store.Delete(job, Step(m.step())), "Delete");
  Require(absl::IsNotFound(store.Open(job, Step(m.step())).status()), "a deleted checkpoint opens");
  Require(absl::IsNotFound(store.Delete(job, Step(m.step()))),
          "a deleted checkpoint deletes again");
  pending = store.ListPending();
  require_ok(pending.status(), "ListPending");
  Require(pending->empty(), "Delete left a marker");
}

// One RocksDB store for the process, in a fresh scratch directory.
coordinator::RocksDbCheckpointStore* SharedRocksDb() {
  static coordinator::RocksDbCheckpointStore* store = [] {
    static const std::string dir = ScratchPath("checkpoints");
    std::filesystem::remove_all(dir);
    coordinator::RocksDbCheckpointStoreOptions options;
    options.direct_io = false;
    options.write_buffer_bytes = 1 << 20;
    options.blob_file_bytes = 1 << 20;
    auto opened = coordinator::RocksDbCheckpointStore::Open(dir, options);
    Require(opened.ok(), "cannot open the RocksDB checkpoint store");
    std::atexit([] { std::filesystem::remove_all(dir); });
    return opened->release();  // lives until exit, for every input
  }();
  return store;
}

void FuzzStores(const v1::CheckpointManifest& input) {
  const StoreCase c = MakeStoreCase(input);
  coordinator::InMemoryCheckpointStore memory;
  RoundTrip(memory, c, "InMemoryCheckpointStore");
  Require(memory.chunk_count() == 0, "InMemoryCheckpointStore::Delete left chunks");

  coordinator::RocksDbCheckpointStore* rocks = SharedRocksDb();
  RoundTrip(*rocks, c, "RocksDbCheckpointStore");
  // Delete removed every chunk key of the attempt.
  for (const auto& [key, bytes] : c.stored) {
    std::string value;
    const rocksdb::Status s = rocks->db()->Get(
        rocksdb::ReadOptions(), rocks->chunks_family(),
        coordinator::RocksDbCheckpointStore::ChunkKey(c.pending, key.first, key.second), &value);
    Require(s.IsNotFound(), "RocksDbCheckpointStore::Delete left a chunk");
  }
}

// ---- mode 2: cohortctl's renderings ----

void FuzzFormat(std::string_view bytes, const v1::CheckpointManifest& manifest) {
  cohortctl::FormatManifest(manifest);
  v1::ListCheckpointsResponse list;
  if (list.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
    cohortctl::FormatCheckpointTable(list);
  }
}

// ---- mode 3: the safetensors header ----

uint64_t LittleEndian64(std::string_view bytes) {
  uint64_t value = 0;
  for (int i = 7; i >= 0; --i) value = (value << 8) | static_cast<uint8_t>(bytes[i]);
  return value;
}

void FuzzSafetensors(const v1::CheckpointManifest& manifest) {
  std::vector<cohortctl::SafetensorsTensor> tensors;
  std::set<std::string> names;
  uint64_t data_bytes = 0;
  for (const v1::TensorInfo& t : manifest.tensors()) {
    if (!coordinator::ValidTensorName(t.name()) || !AdmittedShape(t) ||
        !names.insert(t.name()).second) {
      continue;
    }
    tensors.push_back({t.name(), {t.global_shape().begin(), t.global_shape().end()}});
    uint64_t bytes = 4;
    for (int64_t d : t.global_shape()) bytes *= static_cast<uint64_t>(d);
    data_bytes += bytes;
  }
  // The metadata ExportSafetensors writes: fixed keys, the job, the
  // step, the generation and the "model" object as the writers sent it.
  std::map<std::string, std::string> metadata = {
      {"format", "cohort-gpt"},
      {"job", AdmittedJobId(manifest.job_id()) ? manifest.job_id() : "fuzz-1"},
      {"step", absl::StrCat(manifest.step())},
      {"generation", absl::StrCat(manifest.generation())},
  };
  if (auto it = manifest.objects().find("model"); it != manifest.objects().end()) {
    metadata["model"] = it->second;
  }
  const cohortctl::SafetensorsLayout layout = cohortctl::PlanSafetensors(tensors, metadata);
  Require(layout.prefix.size() >= 8 && layout.prefix.size() % 8 == 0,
          "the safetensors prefix is not 8 + a multiple of 8 bytes");
  const std::string_view header = std::string_view(layout.prefix).substr(8);
  Require(LittleEndian64(layout.prefix) == header.size(),
          "the safetensors length field does not match the header");
  Require(IsJson(header), "the safetensors header is not valid JSON");
  Require(layout.file_offsets.size() == tensors.size(), "one file offset per tensor");
  uint64_t offset = layout.prefix.size();
  for (size_t i = 0; i < tensors.size(); ++i) {
    Require(layout.file_offsets[i] == offset, "tensor data is not laid out in order without gaps");
    uint64_t bytes = 4;
    for (int64_t d : tensors[i].shape) bytes *= static_cast<uint64_t>(d);
    offset += bytes;
  }
  Require(layout.file_size == layout.prefix.size() + data_bytes, "the file size is not the sum");
}

}  // namespace
}  // namespace cohort::fuzz

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  cohort::fuzz::QuietLogs();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace cohort;
  if (size == 0) return 0;
  const std::string_view bytes(reinterpret_cast<const char*>(data) + 1, size - 1);
  v1::CheckpointManifest manifest;
  if (!manifest.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) return 0;
  switch (data[0] % 4) {
    case 0:
      fuzz::FuzzCoverage(manifest);
      break;
    case 1:
      fuzz::FuzzStores(manifest);
      break;
    case 2:
      fuzz::FuzzFormat(bytes, manifest);
      break;
    case 3:
      fuzz::FuzzSafetensors(manifest);
      break;
  }
  return 0;
}
