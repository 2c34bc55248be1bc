#include "worker/checkpoint/checkpoint_loader.h"

#include <algorithm>
#include <atomic>
#include <map>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/box_proto.h"
#include "common/status_macros.h"

namespace cohort::checkpoint {
namespace {

// One needed box (part of a LoadPiece) that a chunk overlaps.
struct Overlap {
  const LoadPiece* piece;
  Box region;  // chunk box intersected with the needed box
};

}  // namespace

absl::Status LoadCheckpoint(client::CheckpointClient* client, const v1::CheckpointManifest& manifest,
                            const model::GptConfig& config, const model::ParameterTable& table,
                            const StateBuffers& buffers, absl::Duration timeout,
                            LoadStats* stats, int streams) {
  const absl::Time start = absl::Now();
  const std::string where =
      absl::StrCat("checkpoint of job ", manifest.job_id(), " step ", manifest.step());
  auto model = manifest.objects().find("model");
  if (model != manifest.objects().end() && model->second != ModelFingerprint(config)) {
    return absl::FailedPreconditionError(absl::StrCat(where, " is of model \"", model->second,
                                                      "\", this job trains \"",
                                                      ModelFingerprint(config), "\""));
  }
  std::map<std::string, const v1::TensorInfo*> tensors;
  for (const v1::TensorInfo& t : manifest.tensors()) tensors[t.name()] = &t;

  const std::vector<LoadPiece> pieces = PlanLoad(table, buffers.optimizer, buffers.weights);
  // chunk (tensor, index) -> the overlaps it fills
  std::map<std::pair<std::string, uint32_t>, std::vector<Overlap>> wanted;
  std::map<const LoadPiece*, int64_t> expected;
  for (const LoadPiece& piece : pieces) {
    auto it = tensors.find(piece.tensor);
    if (it == tensors.end()) {
      return absl::FailedPreconditionError(
          absl::StrCat(where, " has no tensor ", piece.tensor, ", which this model needs"));
    }
    const v1::TensorInfo& tensor = *it->second;
    const model::ParameterInfo* info =
        table.Find(piece.tensor.substr(piece.tensor.find('/') + 1));
    const std::vector<int64_t> shape(tensor.global_shape().begin(), tensor.global_shape().end());
    if (info == nullptr || shape != info->global_shape ||
        tensor.dtype() != v1::TENSOR_DTYPE_FLOAT32) {
      return absl::FailedPreconditionError(absl::StrCat(
          where, ": tensor ", piece.tensor, " is [", absl::StrJoin(shape, ", "), "] ",
          v1::TensorDType_Name(tensor.dtype()), ", this model needs [",
          info == nullptr ? "" : absl::StrJoin(info->global_shape, ", "), "] float32"));
    }
    expected[&piece] = piece.count;
    for (const Box& local : FlatRangeToBoxes(piece.local_box.extent, piece.first,
                                             piece.first + piece.count)) {
      const Box needed = Translate(local, piece.local_box.start);
      for (const v1::ChunkInfo& chunk : tensor.chunks()) {
        std::optional<Box> region = Intersect(BoxFromProto(chunk.box()), needed);
        if (region) wanted[{tensor.name(), chunk.index()}].push_back({&piece, *region});
      }
    }
  }

  // The chunks, dealt over the streams largest first to the least loaded
  // one, so the streams carry about the same bytes.
  std::map<std::pair<std::string, uint32_t>, uint64_t> chunk_bytes;
  for (const auto& [name, tensor] : tensors) {
    for (const v1::ChunkInfo& chunk : tensor->chunks()) {
      chunk_bytes[{name, chunk.index()}] = chunk.bytes();
    }
  }
  std::vector<std::pair<uint64_t, std::pair<std::string, uint32_t>>> by_size;
  for (const auto& [key, unused] : wanted) by_size.push_back({chunk_bytes[key], key});
  std::sort(by_size.begin(), by_size.end(), [](const auto& a, const auto& b) {
    return a.first != b.first ? a.first > b.first : a.second < b.second;
  });
  streams = std::max(1, std::min(streams, static_cast<int>(by_size.size())));
  std::vector<std::vector<v1::ChunkRef>> refs(static_cast<size_t>(streams));
  std::vector<uint64_t> load(static_cast<size_t>(streams), 0);
  for (const auto& [bytes, key] : by_size) {
    const size_t s = static_cast<size_t>(std::min_element(load.begin(), load.end()) - load.begin());
    v1::ChunkRef ref;
    ref.set_tensor(key.first);
    ref.set_index(key.second);
    refs[s].push_back(std::move(ref));
    load[s] += bytes;
  }
  // Where the overlap lands in the piece's buffer.
  auto destination = [&](const Overlap& overlap) {
    const LoadPiece& piece = *overlap.piece;
    float* base = piece.kind == StateKind::kParam   ? buffers.params
                  : piece.kind == StateKind::kAdamM ? buffers.adam_m
                                                    : buffers.adam_v;
    const size_t buffer_begin = piece.kind == StateKind::kParam ? 0 : buffers.optimizer.begin;
    // The destination buffer holds the piece's flat part of its box.
    return BoxedBuffer{&piece.local_box, piece.first, base + (piece.arena_offset - buffer_begin)};
  };
  // A chunk that is wholly one needed region, contiguous in its buffer, is
  // received in place (no copy through the client's buffer); typically any
  // chunk of a tensor this rank holds whole.
  auto in_place = [&](const std::vector<Overlap>& overlaps, const v1::ChunkInfo& info) -> void* {
    if (overlaps.size() != 1) return nullptr;
    const Overlap& overlap = overlaps.front();
    const Box chunk_box = BoxFromProto(info.box());
    if (overlap.region != chunk_box ||
        static_cast<uint64_t>(chunk_box.NumElements()) * sizeof(float) != info.bytes() ||
        !IsContiguousIn(chunk_box, overlap.piece->local_box)) {
      return nullptr;
    }
    const BoxedBuffer to = destination(overlap);
    const int64_t at = FlatIndexIn(*to.box, chunk_box.start) - to.first;
    return static_cast<float*>(to.data) + at;
  };
  absl::Mutex mu;  // the counters below; the chunks' regions are disjoint
  // Once a stream fails the others stop at their next chunk.
  std::atomic<bool> failed{false};
  LoadStats local_stats;
  std::map<const LoadPiece*, int64_t> copied;
  // The whole load, retries included, is bounded by `timeout`.
  const absl::Time deadline = start + timeout;
  auto download = [&](const std::vector<v1::ChunkRef>& chunks, int64_t* received) {
    return client->Download(
      manifest.job_id(), manifest.step(), chunks,
      [&](const std::string& tensor, const v1::ChunkInfo& info) -> void* {
        auto it = wanted.find({tensor, info.index()});
        return it == wanted.end() ? nullptr : in_place(it->second, info);
      },
      [&](const std::string& tensor, const v1::ChunkInfo& info,
          std::string_view bytes) -> absl::Status {
        if (failed.load()) return absl::CancelledError("another download stream failed");
        auto it = wanted.find({tensor, info.index()});
        if (it == wanted.end()) {
          return absl::InternalError(absl::StrCat("download sent ", tensor, " chunk ",
                                                  info.index(), ", which was not asked for"));
        }
        const Box chunk_box = BoxFromProto(info.box());
        if (static_cast<uint64_t>(chunk_box.NumElements()) * sizeof(float) != bytes.size()) {
          return absl::DataLossError(absl::StrCat(where, ": tensor ", tensor, " chunk ",
                                                  info.index(), " has the wrong size"));
        }
        const bool placed = bytes.data() == in_place(it->second, info);
        for (const Overlap& overlap : it->second) {
          if (!placed) {
            CopyRegion(overlap.region, ConstBoxedBuffer{&chunk_box, 0, bytes.data()},
                       destination(overlap), sizeof(float));
          }
        }
        ++*received;
        absl::MutexLock lock(&mu);
        for (const Overlap& overlap : it->second) {
          copied[overlap.piece] += overlap.region.NumElements();
        }
        ++local_stats.chunks;
        local_stats.chunks_in_place += placed ? 1 : 0;
        local_stats.bytes += bytes.size();
        return absl::OkStatus();
      },
      deadline - absl::Now());
  };
  std::vector<absl::Status> results(refs.size());
  {
    std::vector<std::thread> threads;
    auto run = [&](size_t s) {
      // The coordinator refuses streams beyond --max_checkpoint_downloads
      // (many ranks restoring at once): a stream refused before its first
      // chunk waits and tries again, within the timeout.
      absl::Duration backoff = absl::Milliseconds(100);
      int64_t received = 0;
      while (true) {
        results[s] = download(refs[s], &received);
        if (!absl::IsResourceExhausted(results[s]) || received > 0 || failed.load() ||
            absl::Now() + backoff > deadline) {
          break;
        }
        absl::SleepFor(backoff);
        backoff = std::min(backoff * 2, absl::Seconds(2));
      }
      if (!results[s].ok()) failed = true;
    };
    for (size_t s = 1; s < refs.size(); ++s) threads.emplace_back(run, s);
    run(0);
    for (std::thread& t : threads) t.join();
  }
  // The first failure that is not the others stopping for it.
  for (const absl::Status& result : results) {
    if (!result.ok() && !absl::IsCancelled(result)) return result;
  }
  for (const absl::Status& result : results) RETURN_IF_ERROR(result);
  for (const auto& [piece, count] : expected) {
    if (copied[piece] != count) {
      return absl::DataLossError(absl::StrCat(where, ": the chunks of ", piece->tensor, " cover ",
                                              copied[piece], " of the ", count,
                                              " elements this rank needs"));
    }
  }
  local_stats.duration = absl::Now() - start;
  if (stats != nullptr) *stats = local_stats;
  return absl::OkStatus();
}

}  // namespace cohort::checkpoint
