// Sharded checkpoints through a real Checkpoints gRPC service (in-process,
// port 0) over the RocksDB store: every rank of a (dp, tp, pp) layout saves
// its share with a CheckpointWriter, and every rank of another layout loads
// what it needs with LoadCheckpoint. The state is synthetic (each value a
// function of its tensor and global index), so every parameter and both
// AdamW moments, reassembled, must be bitwise what was saved.

#include <algorithm>
#include <cmath>
#include <atomic>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "coordinator/checkpoints/checkpoint_uploads.h"
#include "coordinator/coordinator_metrics.h"
#include "coordinator/service/blocking_executor.h"
#include "coordinator/service/checkpoints_service.h"
#include "coordinator/store/rocksdb_checkpoint_store.h"
#include "gmock/gmock.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#include "gtest/gtest.h"
#include "rocksdb/db.h"
#include "tests/testing/testing.h"
#include "worker/checkpoint/checkpoint_loader.h"
#include "worker/checkpoint/checkpoint_writer.h"
#include "worker/train/data_parallel.h"

namespace cohort::checkpoint {
namespace {

using ::testing::HasSubstr;

const model::GptConfig kSmall{
    .layers = 4, .heads = 4, .width = 128, .vocab_size = 512, .context_length = 64};
constexpr char kJob[] = "ckpt-1";

struct Layout {
  int dp, tp, pp;
  int world() const { return dp * tp * pp; }
  friend bool operator==(const Layout&, const Layout&) = default;
};
std::string Name(const Layout& l) { return absl::StrCat("(", l.dp, ",", l.tp, ",", l.pp, ")"); }

// The Checkpoints service over a RocksDB store in a temp dir, with a job
// "ckpt-1" at generation 1.
class CheckpointServer {
 public:
  CheckpointServer()
      : store_(*coordinator::RocksDbCheckpointStore::Open(testing::MakeTempDir("ckpt-db"))),
        uploads_(
            store_.get(),
            [this](const JobId& job) -> absl::StatusOr<coordinator::CheckpointJobState> {
              if (job.value() != kJob) return absl::NotFoundError("no such job");
              coordinator::CheckpointJobState state;
              state.generation = Generation(1);
              state.policy.set_keep_last(10);
              return state;
            },
            RealClock::Get()),
        metrics_(std::make_shared<prometheus::Registry>()),
        executor_(4),
        service_(&uploads_, store_.get(), &executor_, &metrics_, &gate_) {
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(&service_);
    server_ = builder.BuildAndStart();
    address_ = absl::StrCat("127.0.0.1:", port);
  }
  ~CheckpointServer() { server_->Shutdown(); }

  const std::string& address() const { return address_; }
  coordinator::RocksDbCheckpointStore& store() { return *store_; }

 private:
  std::unique_ptr<coordinator::RocksDbCheckpointStore> store_;
  coordinator::CheckpointUploads uploads_;
  coordinator::CoordinatorMetrics metrics_;
  std::unique_ptr<coordinator::Authorizer> authorizer_ = coordinator::Authorizer::AllowAll();
  coordinator::StreamLimiter streams_{0};
  coordinator::CallGate gate_{authorizer_.get(), &streams_, &metrics_};
  coordinator::BlockingExecutor executor_;
  coordinator::CheckpointsService service_;
  std::unique_ptr<grpc::Server> server_;
  std::string address_;
};

// The unsharded state: value of element i of tensor `id` under `kind`.
float Value(StateKind kind, int id, size_t i) {
  uint64_t h = (static_cast<uint64_t>(kind) * 1000003u + static_cast<uint64_t>(id)) * 2654435761u + i;
  h ^= h >> 29;
  h *= 0xbf58476d1ce4e5b9ull;
  h ^= h >> 32;
  return static_cast<float>(static_cast<int64_t>(h % 2000001) - 1000000) * 1e-6f;
}

struct RankState {
  model::ParameterTable table;
  RankPosition position;
  ArenaRange optimizer;
  std::vector<float> params, m, v;
};

std::vector<RankState> MakeRanks(const Layout& l, bool zero1, bool filled) {
  const model::ParameterTable whole(kSmall);
  std::vector<RankState> ranks;
  for (int stage = 0; stage < l.pp; ++stage) {
    for (int d = 0; d < l.dp; ++d) {
      for (int t = 0; t < l.tp; ++t) {
        const model::ModelLayout layout{.tp = l.tp, .tp_rank = t, .pp = l.pp, .stage = stage};
        RankState r{model::ParameterTable(kSmall, layout), RankPosition{{l.dp, l.tp, l.pp}, {d, t, stage}}, {}, {}, {}, {}};
        const size_t n = r.table.num_params();
        const layout::ShardRange own = layout::DataShardRange(n, l.dp, d);
        r.optimizer = zero1 ? ArenaRange{own.begin, own.end} : ArenaRange{0, n};
        r.params.assign(n, NAN);
        r.m.assign(r.optimizer.end - r.optimizer.begin, NAN);
        r.v.assign(r.optimizer.end - r.optimizer.begin, NAN);
        if (filled) {
          std::vector<float> arena(n);
          for (StateKind kind : kStateKinds) {
            for (const model::ParameterInfo& info : r.table.tensors()) {
              if (!info.present()) continue;
              const model::ParameterInfo& g = whole[info.id];
              std::vector<float> global(g.numel);
              for (size_t i = 0; i < g.numel; ++i) global[i] = Value(kind, info.id, i);
              ExtractShard(info, global.data(), arena.data() + info.offset);
            }
            if (kind == StateKind::kParam) {
              r.params = arena;
            } else {
              std::vector<float>& out = kind == StateKind::kAdamM ? r.m : r.v;
              std::copy(arena.begin() + r.optimizer.begin, arena.begin() + r.optimizer.end,
                        out.begin());
            }
          }
        }
        ranks.push_back(std::move(r));
      }
    }
  }
  return ranks;
}

// Every rank of `l` saves step `step`; returns how many writers committed.
int SaveAll(const Layout& l, bool zero1, int64_t step, client::CheckpointClient* client) {
  std::vector<RankState> ranks = MakeRanks(l, zero1, /*filled=*/true);
  std::vector<std::unique_ptr<CheckpointWriter>> writers;
  for (size_t r = 0; r < ranks.size(); ++r) {
    CheckpointWriterOptions options;
    options.job_id = kJob;
    options.generation = Generation(1);
    options.writer = static_cast<uint32_t>(r);
    options.position = ranks[r].position;
    options.zero1 = zero1;
    options.max_chunk_elements = 20000;  // several chunks per large tensor
    writers.push_back(std::make_unique<CheckpointWriter>(client, kSmall, ranks[r].table, options));
    StateView state{ranks[r].params.data(), ranks[r].m.data(), ranks[r].v.data(), ranks[r].optimizer};
    absl::StatusOr<absl::Duration> saved = writers.back()->Save(Step(step), state);
    EXPECT_TRUE(saved.ok()) << saved.status();
  }
  int committed = 0;
  for (auto& w : writers) {
    UploadResult result = w->Wait();
    EXPECT_TRUE(result.status.ok()) << result.status;
    committed += result.committed ? 1 : 0;
  }
  return committed;
}

// Loads `step` into every rank of `l` and compares with the synthetic state.
// `saved`: the layout the checkpoint was written in.
void LoadAllAndCompare(const Layout& l, bool zero1, int64_t step, client::CheckpointClient* client,
                       const Layout& saved) {
  absl::StatusOr<v1::CheckpointManifest> manifest = client->GetManifest(kJob, step, absl::Seconds(10));
  ASSERT_TRUE(manifest.ok()) << manifest.status();
  std::vector<RankState> expected = MakeRanks(l, zero1, /*filled=*/true);
  std::vector<RankState> loaded = MakeRanks(l, zero1, /*filled=*/false);
  uint64_t bytes = 0;
  int64_t chunks = 0, in_place = 0;
  for (size_t r = 0; r < loaded.size(); ++r) {
    RankState& rank = loaded[r];
    LoadStats stats;
    absl::Status s = LoadCheckpoint(
        client, *manifest, kSmall, rank.table,
        StateBuffers{rank.params.data(), rank.m.data(), rank.v.data(), rank.optimizer},
        absl::Seconds(30), &stats);
    ASSERT_TRUE(s.ok()) << Name(l) << " rank " << r << ": " << s;
    bytes += stats.bytes;
    in_place += stats.chunks_in_place;
    chunks += stats.chunks;
    ASSERT_EQ(std::memcmp(rank.params.data(), expected[r].params.data(), rank.params.size() * 4), 0)
        << Name(l) << " rank " << r << " weights";
    ASSERT_EQ(std::memcmp(rank.m.data(), expected[r].m.data(), rank.m.size() * 4), 0)
        << Name(l) << " rank " << r << " adam_m";
    ASSERT_EQ(std::memcmp(rank.v.data(), expected[r].v.data(), rank.v.size() * 4), 0)
        << Name(l) << " rank " << r << " adam_v";
  }
  // Chunks wholly needed and contiguous in a rank's buffers are received in
  // place: all of them in the layout they were saved in, some elsewhere
  // (the others straddle shard edges or are column slices of another
  // tensor-parallel split, and are copied).
  if (l == saved) {
    EXPECT_EQ(in_place, chunks) << Name(l);
  } else {
    EXPECT_LT(in_place, chunks) << Name(l);
  }
  EXPECT_GT(in_place, 0) << Name(l);
  std::printf(
      "load into %-8s%s: %d ranks read %.2f MB (checkpoint %.2f MB), "
      "%lld of %lld chunks in place\n",
      Name(l).c_str(), zero1 ? " ZeRO-1" : "       ", l.world(), bytes / 1e6,
      manifest->total_bytes() / 1e6, static_cast<long long>(in_place),
      static_cast<long long>(chunks));
}

TEST(CheckpointReshardTest, SavedUnderTwoTwoOneLoadsBitwiseIntoEveryLayout) {
  CheckpointServer server;
  std::unique_ptr<client::CheckpointClient> client = client::NewGrpcCheckpointClient(CoordinatorTarget::Insecure(server.address()));
  for (bool save_zero1 : {true, false}) {
    const int64_t step = save_zero1 ? 10 : 20;
    ASSERT_EQ(SaveAll(Layout{2, 2, 1}, save_zero1, step, client.get()), 1)
        << "exactly one writer completes the checkpoint";
    for (const Layout& target :
         {Layout{1, 1, 2}, Layout{4, 1, 1}, Layout{1, 2, 2}, Layout{2, 1, 2}, Layout{1, 1, 1},
          Layout{2, 2, 1}, Layout{2, 2, 2}}) {
      for (bool load_zero1 : {true, false}) {
        SCOPED_TRACE(absl::StrCat("saved ", save_zero1 ? "with" : "without", " ZeRO-1, loaded into ",
                                  Name(target), load_zero1 ? " with" : " without", " ZeRO-1"));
        LoadAllAndCompare(target, load_zero1, step, client.get(), Layout{2, 2, 1});
      }
    }
  }
  absl::StatusOr<v1::ListCheckpointsResponse> listed = client->List(kJob, absl::Seconds(5));
  ASSERT_TRUE(listed.ok());
  ASSERT_EQ(listed->checkpoints_size(), 2);
  EXPECT_EQ(listed->checkpoints(0).step(), 20);
  EXPECT_EQ(listed->checkpoints(0).layout().data_parallel(), 2);
  EXPECT_EQ(listed->checkpoints(0).layout().tensor_parallel(), 2);
}

TEST(CheckpointReshardTest, PipelineSavesLoadIntoTensorLayoutsToo) {
  CheckpointServer server;
  std::unique_ptr<client::CheckpointClient> client = client::NewGrpcCheckpointClient(CoordinatorTarget::Insecure(server.address()));
  ASSERT_EQ(SaveAll(Layout{1, 2, 2}, true, 7, client.get()), 1);
  LoadAllAndCompare(Layout{2, 2, 1}, true, 7, client.get(), Layout{1, 2, 2});
  LoadAllAndCompare(Layout{1, 4, 1}, false, 7, client.get(), Layout{1, 2, 2});
}

// The coordinator reads several chunks ahead of the one it sends; they
// still arrive in the order asked for. A download the client abandons
// midway (its callback fails) frees its stream slot: more of them than the
// service's 64 slots leave a full download working.
TEST(CheckpointReshardTest, DownloadsKeepTheRequestedOrderAndAbandonedOnesFreeTheirSlots) {
  CheckpointServer server;
  std::unique_ptr<client::CheckpointClient> client =
      client::NewGrpcCheckpointClient(CoordinatorTarget::Insecure(server.address()));
  ASSERT_EQ(SaveAll(Layout{1, 1, 1}, false, 5, client.get()), 1);
  absl::StatusOr<v1::CheckpointManifest> manifest = client->GetManifest(kJob, 5, absl::Seconds(5));
  ASSERT_TRUE(manifest.ok());
  std::vector<v1::ChunkRef> refs;
  for (const v1::TensorInfo& t : manifest->tensors()) {
    for (const v1::ChunkInfo& c : t.chunks()) {
      v1::ChunkRef ref;
      ref.set_tensor(t.name());
      ref.set_index(c.index());
      refs.push_back(std::move(ref));
    }
  }
  std::reverse(refs.begin(), refs.end());  // not the store's key order
  ASSERT_GT(refs.size(), 20u);
  auto download = [&](size_t stop_after, std::vector<std::pair<std::string, uint32_t>>* got) {
    return client->Download(
        kJob, 5, refs,
        [&](const std::string& tensor, const v1::ChunkInfo& info, std::string_view) {
          got->emplace_back(tensor, info.index());
          return got->size() == stop_after ? absl::AbortedError("enough") : absl::OkStatus();
        },
        absl::Seconds(30));
  };
  for (int i = 0; i < 70; ++i) {
    std::vector<std::pair<std::string, uint32_t>> got;
    absl::Status s = download(3, &got);
    ASSERT_TRUE(absl::IsAborted(s)) << "abandoned download " << i << ": " << s;
  }
  std::vector<std::pair<std::string, uint32_t>> got;
  absl::Status s = download(0, &got);
  ASSERT_TRUE(s.ok()) << s;
  ASSERT_EQ(got.size(), refs.size());
  for (size_t k = 0; k < refs.size(); ++k) {
    EXPECT_EQ(got[k], std::make_pair(refs[k].tensor(), refs[k].index())) << "chunk " << k;
  }
}

TEST(CheckpointReshardTest, ACorruptChunkIsDataLossNamingTensorAndChunk) {
  CheckpointServer server;
  std::unique_ptr<client::CheckpointClient> client = client::NewGrpcCheckpointClient(CoordinatorTarget::Insecure(server.address()));
  ASSERT_EQ(SaveAll(Layout{1, 1, 1}, false, 3, client.get()), 1);
  absl::StatusOr<v1::CheckpointManifest> manifest = client->GetManifest(kJob, 3, absl::Seconds(5));
  ASSERT_TRUE(manifest.ok());
  const v1::TensorInfo* fcw = nullptr;
  for (const v1::TensorInfo& t : manifest->tensors()) {
    if (t.name() == "adam_v/fcw") fcw = &t;
  }
  ASSERT_NE(fcw, nullptr);
  ASSERT_GE(fcw->chunks_size(), 2);
  const v1::ChunkInfo& chunk = fcw->chunks(1);
  // Flip one byte of the stored value under its own key.
  auto reader = server.store().Open(JobId(kJob), Step(3));
  ASSERT_TRUE(reader.ok());
  std::string bytes((*reader)->ReadChunk(*fcw, chunk)->view());
  bytes[bytes.size() / 2] ^= 0x01;
  const std::string key = coordinator::RocksDbCheckpointStore::ChunkKey(
      coordinator::PendingCheckpoint{JobId(kJob), Step(3), Generation(1)}, fcw->name(),
      std::vector<int64_t>(chunk.box().start().begin(), chunk.box().start().end()));
  ASSERT_TRUE(server.store()
                  .db()
                  ->Put(rocksdb::WriteOptions(), server.store().chunks_family(), key, bytes)
                  .ok());
  std::vector<RankState> ranks = MakeRanks(Layout{1, 1, 1}, false, false);
  absl::Status s = LoadCheckpoint(
      client.get(), *manifest, kSmall, ranks[0].table,
      StateBuffers{ranks[0].params.data(), ranks[0].m.data(), ranks[0].v.data(), ranks[0].optimizer},
      absl::Seconds(30));
  EXPECT_TRUE(absl::IsDataLoss(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr(absl::StrCat("tensor adam_v/fcw chunk ", chunk.index())));
}

// A client whose first `refusals` Download calls are refused as busy (the
// coordinator at --max_checkpoint_downloads), then passes through.
class BusyClient : public client::CheckpointClient {
 public:
  BusyClient(client::CheckpointClient* inner, int refusals) : inner_(inner), left_(refusals) {}
  absl::StatusOr<v1::UploadResponse> Upload(const v1::UploadHeader& header,
                                            const std::vector<client::UploadChunk>& chunks,
                                            const v1::UploadEnd& end,
                                            absl::Duration timeout) override {
    return inner_->Upload(header, chunks, end, timeout);
  }
  absl::StatusOr<v1::CheckpointManifest> GetManifest(const std::string& job, int64_t step,
                                                     absl::Duration timeout) override {
    return inner_->GetManifest(job, step, timeout);
  }
  absl::Status Download(const std::string& job, int64_t step, const std::vector<v1::ChunkRef>& refs,
                        const client::ChunkPlacement& place, const client::ChunkCallback& on_chunk,
                        absl::Duration timeout) override {
    ++calls_;
    if (left_.fetch_sub(1) > 0) return absl::ResourceExhaustedError("too many downloads");
    return inner_->Download(job, step, refs, place, on_chunk, timeout);
  }
  absl::StatusOr<v1::ListCheckpointsResponse> List(const std::string& job,
                                                   absl::Duration timeout) override {
    return inner_->List(job, timeout);
  }
  absl::Status Delete(const std::string& job, int64_t step, absl::Duration timeout) override {
    return inner_->Delete(job, step, timeout);
  }
  int calls() const { return calls_.load(); }

 private:
  client::CheckpointClient* const inner_;
  std::atomic<int> left_;
  std::atomic<int> calls_{0};
};

TEST(CheckpointReshardTest, StreamsRefusedAsBusyAreRetriedAndOneStreamLoadsTheSame) {
  CheckpointServer server;
  std::unique_ptr<client::CheckpointClient> direct =
      client::NewGrpcCheckpointClient(CoordinatorTarget::Insecure(server.address()));
  ASSERT_EQ(SaveAll(Layout{2, 1, 1}, true, 5, direct.get()), 1);
  absl::StatusOr<v1::CheckpointManifest> manifest = direct->GetManifest(kJob, 5, absl::Seconds(5));
  ASSERT_TRUE(manifest.ok()) << manifest.status();
  const std::vector<RankState> expected = MakeRanks(Layout{1, 1, 1}, false, /*filled=*/true);
  for (const int streams : {1, 4}) {
    // Three refusals: some of the four streams start late, or one starts
    // only on its third try.
    BusyClient busy(direct.get(), 3);
    std::vector<RankState> loaded = MakeRanks(Layout{1, 1, 1}, false, /*filled=*/false);
    RankState& rank = loaded[0];
    LoadStats stats;
    const absl::Status s = LoadCheckpoint(
        &busy, *manifest, kSmall, rank.table,
        StateBuffers{rank.params.data(), rank.m.data(), rank.v.data(), rank.optimizer},
        absl::Seconds(30), &stats, streams);
    ASSERT_TRUE(s.ok()) << streams << " streams: " << s;
    EXPECT_EQ(busy.calls(), streams + 3) << streams << " streams";
    EXPECT_EQ(stats.bytes, manifest->total_bytes()) << streams << " streams";
    ASSERT_EQ(std::memcmp(rank.params.data(), expected[0].params.data(), rank.params.size() * 4), 0);
    ASSERT_EQ(std::memcmp(rank.m.data(), expected[0].m.data(), rank.m.size() * 4), 0);
    ASSERT_EQ(std::memcmp(rank.v.data(), expected[0].v.data(), rank.v.size() * 4), 0);
  }
}

TEST(CheckpointReshardTest, AnotherModelIsRefused) {
  CheckpointServer server;
  std::unique_ptr<client::CheckpointClient> client = client::NewGrpcCheckpointClient(CoordinatorTarget::Insecure(server.address()));
  ASSERT_EQ(SaveAll(Layout{1, 1, 1}, false, 3, client.get()), 1);
  absl::StatusOr<v1::CheckpointManifest> manifest = client->GetManifest(kJob, -1, absl::Seconds(5));
  ASSERT_TRUE(manifest.ok());
  model::GptConfig other = kSmall;
  other.width = 64;
  model::ParameterTable table(other);
  std::vector<float> params(table.num_params()), m(table.num_params()), v(table.num_params());
  absl::Status s = LoadCheckpoint(client.get(), *manifest, other, table,
                                  StateBuffers{params.data(), m.data(), v.data(),
                                               ArenaRange{0, table.num_params()}},
                                  absl::Seconds(30));
  EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr("width=128"));
}

}  // namespace
}  // namespace cohort::checkpoint
