#include "coordinator/store/rocksdb_checkpoint_store.h"

#include <filesystem>
#include <random>
#include <string>

#include "common/crc32c.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "rocksdb/db.h"
#include "tests/testing/testing.h"

namespace cohort::coordinator {
namespace {

using ::testing::HasSubstr;

uint64_t DirectoryBytes(const std::string& dir) {
  uint64_t total = 0;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(dir)) {
    if (entry.is_regular_file()) total += entry.file_size();
  }
  return total;
}

// A checkpoint of one tensor "param/w" of `rows` x 1024 floats in chunks of
// `rows_per_chunk` rows, random bytes.
struct Written {
  v1::CheckpointManifest manifest;
  std::vector<std::string> chunks;
};

Written Write(RocksDbCheckpointStore& store, const std::string& job, int64_t step,
              uint64_t generation, int rows, int rows_per_chunk, uint32_t seed) {
  const PendingCheckpoint attempt{JobId(job), Step(step), Generation(generation)};
  EXPECT_TRUE(store.BeginPending(attempt).ok());
  Written w;
  w.manifest.set_job_id(job);
  w.manifest.set_step(step);
  w.manifest.set_generation(generation);
  v1::TensorInfo* tensor = w.manifest.add_tensors();
  tensor->set_name("param/w");
  tensor->set_dtype(v1::TENSOR_DTYPE_FLOAT32);
  tensor->add_global_shape(rows);
  tensor->add_global_shape(1024);
  std::mt19937 rng(seed);
  for (int r = 0; r < rows; r += rows_per_chunk) {
    std::string bytes(static_cast<size_t>(rows_per_chunk) * 1024 * 4, '\0');
    for (char& c : bytes) c = static_cast<char>(rng());
    const Box box{{r, 0}, {rows_per_chunk, 1024}};
    EXPECT_TRUE(store.PutChunk(attempt, "param/w", box, bytes).ok());
    v1::ChunkInfo* info = tensor->add_chunks();
    info->set_index(static_cast<uint32_t>(w.chunks.size()));
    info->mutable_box()->add_start(r);
    info->mutable_box()->add_start(0);
    info->mutable_box()->add_extent(rows_per_chunk);
    info->mutable_box()->add_extent(1024);
    info->set_bytes(bytes.size());
    info->set_crc32c(Crc32c(bytes));
    w.chunks.push_back(std::move(bytes));
  }
  return w;
}

TEST(RocksDbCheckpointStoreTest, CommittedCheckpointsSurviveReopenAndReadBackWhole) {
  const std::string dir = testing::MakeTempDir("ckpt-store");
  Written a, b;
  {
    auto store = RocksDbCheckpointStore::Open(dir);
    ASSERT_TRUE(store.ok()) << store.status();
    a = Write(**store, "job-1", 10, 1, 64, 16, 1);
    ASSERT_TRUE((*store)->Commit(a.manifest).ok());
    b = Write(**store, "job-1", 20, 1, 64, 16, 2);
    ASSERT_TRUE((*store)->Commit(b.manifest).ok());
    Write(**store, "job-10", 5, 1, 16, 16, 3);  // a longer id sharing the prefix, uncommitted
  }
  auto store = RocksDbCheckpointStore::Open(dir);
  ASSERT_TRUE(store.ok()) << store.status();
  auto listed = (*store)->List(JobId("job-1"));
  ASSERT_TRUE(listed.ok());
  ASSERT_EQ(listed->size(), 2u);
  EXPECT_EQ((*listed)[0].step(), 20);  // newest first
  EXPECT_EQ((*listed)[1].step(), 10);
  EXPECT_TRUE((*store)->List(JobId("job-10"))->empty());
  EXPECT_THAT(*(*store)->ListPending(),
              ::testing::ElementsAre(PendingCheckpoint{JobId("job-10"), Step(5), Generation(1)}));

  auto newest = (*store)->Open(JobId("job-1"), std::nullopt);
  ASSERT_TRUE(newest.ok());
  EXPECT_EQ((*newest)->manifest().step(), 20);
  const v1::TensorInfo& tensor = (*newest)->manifest().tensors(0);
  for (int i = 0; i < tensor.chunks_size(); ++i) {
    absl::StatusOr<ChunkBytes> bytes = (*newest)->ReadChunk(tensor, tensor.chunks(i));
    ASSERT_TRUE(bytes.ok()) << bytes.status();
    EXPECT_EQ(bytes->view(), b.chunks[i]);
  }
  EXPECT_TRUE(absl::IsNotFound((*store)->Open(JobId("job-1"), Step(15)).status()));
  EXPECT_TRUE(absl::IsNotFound((*store)->Open(JobId("job-2"), std::nullopt).status()));
  // The in-memory index (what the coordinator asks under its lock) was
  // rebuilt at Open and follows deletes.
  EXPECT_EQ((*store)->NewestStep(JobId("job-1")), Step(20));
  EXPECT_EQ((*store)->NewestStep(JobId("job-10")), std::nullopt) << "uncommitted";
  ASSERT_TRUE((*store)->Delete(JobId("job-1"), Step(20)).ok());
  EXPECT_EQ((*store)->NewestStep(JobId("job-1")), Step(10));
  ASSERT_TRUE((*store)->Delete(JobId("job-1"), Step(10)).ok());
  EXPECT_EQ((*store)->NewestStep(JobId("job-1")), std::nullopt);
}

TEST(RocksDbCheckpointStoreTest, AFlippedByteIsDataLossNamingTensorAndChunk) {
  const std::string dir = testing::MakeTempDir("ckpt-store");
  auto store = RocksDbCheckpointStore::Open(dir);
  ASSERT_TRUE(store.ok());
  Written a = Write(**store, "job-1", 10, 3, 32, 8, 4);
  ASSERT_TRUE((*store)->Commit(a.manifest).ok());
  // Overwrite chunk 2's value with one byte flipped, keeping its key.
  std::string corrupt = a.chunks[2];
  corrupt[1000] ^= 0x10;
  const std::string key = RocksDbCheckpointStore::ChunkKey(
      PendingCheckpoint{JobId("job-1"), Step(10), Generation(3)}, "param/w", {16, 0});
  ASSERT_TRUE((*store)->db()->Put(rocksdb::WriteOptions(), (*store)->chunks_family(), key, corrupt).ok());
  auto reader = (*store)->Open(JobId("job-1"), Step(10));
  ASSERT_TRUE(reader.ok());
  const v1::TensorInfo& tensor = (*reader)->manifest().tensors(0);
  EXPECT_TRUE((*reader)->ReadChunk(tensor, tensor.chunks(1)).ok());
  absl::StatusOr<ChunkBytes> bad = (*reader)->ReadChunk(tensor, tensor.chunks(2));
  EXPECT_TRUE(absl::IsDataLoss(bad.status())) << bad.status();
  EXPECT_THAT(bad.status().message(), HasSubstr("tensor param/w chunk 2 is corrupt"));
}

TEST(RocksDbCheckpointStoreTest, DeleteAndDropFreeTheBytesAndAReaderKeepsItsSnapshot) {
  const std::string dir = testing::MakeTempDir("ckpt-store");
  RocksDbCheckpointStoreOptions options;
  options.blob_file_bytes = 4 << 20;
  auto store = RocksDbCheckpointStore::Open(dir, options);
  ASSERT_TRUE(store.ok());
  Written a = Write(**store, "job-1", 10, 1, 2048, 256, 5);  // 8 MiB
  ASSERT_TRUE((*store)->Commit(a.manifest).ok());
  Written b = Write(**store, "job-1", 20, 1, 2048, 256, 6);
  ASSERT_TRUE((*store)->Commit(b.manifest).ok());
  const uint64_t two = *(*store)->LiveBytes();
  const uint64_t two_on_disk = DirectoryBytes(dir);
  EXPECT_GE(two, 16u << 20);

  auto reader = (*store)->Open(JobId("job-1"), Step(10));
  ASSERT_TRUE(reader.ok());
  ASSERT_TRUE((*store)->Delete(JobId("job-1"), Step(10)).ok());
  EXPECT_TRUE(absl::IsNotFound((*store)->Delete(JobId("job-1"), Step(10))));
  EXPECT_EQ((*store)->List(JobId("job-1"))->size(), 1u);
  // The reader opened before the delete still reads every chunk. What it
  // hands out (RocksDB's own read buffers, lent) stays valid after the
  // reader, the checkpoint and its blob files are gone: a download's
  // messages may outlive all three.
  const v1::TensorInfo& tensor = (*reader)->manifest().tensors(0);
  std::vector<ChunkBytes> held;
  for (int i = 0; i < tensor.chunks_size(); ++i) {
    absl::StatusOr<ChunkBytes> bytes = (*reader)->ReadChunk(tensor, tensor.chunks(i));
    ASSERT_TRUE(bytes.ok()) << bytes.status();
    ASSERT_EQ(bytes->view(), a.chunks[i]);
    held.push_back(*std::move(bytes));
  }
  reader->reset();
  // Abandon an uncommitted attempt too.
  Write(**store, "job-1", 30, 2, 2048, 256, 7);
  ASSERT_TRUE((*store)->DropPending(PendingCheckpoint{JobId("job-1"), Step(30), Generation(2)}).ok());
  ASSERT_TRUE((*store)->Delete(JobId("job-1"), Step(20)).ok());
  // The snapshot is gone: compaction may now drop the bytes.
  ASSERT_TRUE((*store)->Commit(Write(**store, "job-1", 40, 2, 8, 8, 8).manifest).ok());
  rocksdb::CompactRangeOptions compact;
  compact.bottommost_level_compaction = rocksdb::BottommostLevelCompaction::kForce;
  ASSERT_TRUE((*store)->db()->CompactRange(compact, (*store)->chunks_family(), nullptr, nullptr).ok());
  const uint64_t after = *(*store)->LiveBytes();
  std::printf("live bytes: %llu with two 8 MiB checkpoints, %llu after deleting them "
              "(directory: %llu -> %llu)\n",
              static_cast<unsigned long long>(two), static_cast<unsigned long long>(after),
              static_cast<unsigned long long>(two_on_disk),
              static_cast<unsigned long long>(DirectoryBytes(dir)));
  EXPECT_LT(after, 1u << 20);
  EXPECT_LT(DirectoryBytes(dir), two_on_disk - (12u << 20));
  EXPECT_TRUE((*store)->ListPending()->empty());
  for (size_t i = 0; i < held.size(); ++i) EXPECT_EQ(held[i].view(), a.chunks[i]) << "chunk " << i;
}

TEST(RocksDbCheckpointStoreTest, ACommitReplacesTheSameStepOfAnotherGeneration) {
  const std::string dir = testing::MakeTempDir("ckpt-store");
  auto store = RocksDbCheckpointStore::Open(dir);
  ASSERT_TRUE(store.ok());
  ASSERT_TRUE((*store)->Commit(Write(**store, "job-1", 10, 1, 16, 8, 9).manifest).ok());
  Written second = Write(**store, "job-1", 10, 2, 16, 16, 10);
  ASSERT_TRUE((*store)->Commit(second.manifest).ok());
  auto reader = (*store)->Open(JobId("job-1"), Step(10));
  ASSERT_TRUE(reader.ok());
  EXPECT_EQ((*reader)->manifest().generation(), 2u);
  const v1::TensorInfo& tensor = (*reader)->manifest().tensors(0);
  EXPECT_EQ((*reader)->ReadChunk(tensor, tensor.chunks(0))->view(), second.chunks[0]);
}

// tmpfs refuses O_DIRECT: the store falls back to the page cache there.
TEST(RocksDbCheckpointStoreTest, WorksOnAFileSystemWithoutDirectIo) {
  if (!std::filesystem::is_directory("/dev/shm")) GTEST_SKIP() << "no /dev/shm (tmpfs) here";
  char dir[] = "/dev/shm/cohort-ckpt-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  {
    auto store = RocksDbCheckpointStore::Open(dir);
    ASSERT_TRUE(store.ok()) << store.status();
    Written a = Write(**store, "job-1", 1, 1, 64, 16, 11);
    ASSERT_TRUE((*store)->Commit(a.manifest).ok());
    auto reader = (*store)->Open(JobId("job-1"), Step(1));
    ASSERT_TRUE(reader.ok());
    const v1::TensorInfo& t = (*reader)->manifest().tensors(0);
    EXPECT_EQ((*reader)->ReadChunk(t, t.chunks(3))->view(), a.chunks[3]);
  }
  std::filesystem::remove_all(dir);
}

TEST(RocksDbCheckpointStoreTest, ASecondOpenOfTheSameDirectoryIsUnavailable) {
  const std::string dir = testing::MakeTempDir("ckpt-store");
  auto first = RocksDbCheckpointStore::Open(dir);
  ASSERT_TRUE(first.ok());
  auto second = RocksDbCheckpointStore::Open(dir);
  EXPECT_TRUE(absl::IsUnavailable(second.status())) << second.status();
}

}  // namespace
}  // namespace cohort::coordinator
