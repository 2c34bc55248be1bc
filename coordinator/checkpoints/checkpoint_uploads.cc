#include "coordinator/checkpoints/checkpoint_uploads.h"

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/box_proto.h"
#include "common/crc32c.h"
#include "common/enum_names.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "coordinator/checkpoints/checkpoint_coverage.h"
#include "coordinator/checkpoints/upload_rules.h"

namespace cohort::coordinator {
struct CheckpointUploads::Attempt {
  PendingCheckpoint key;
  v1::UploadHeader declaration;  // of the first writer, with writer/step as sent
  std::map<std::string, const v1::TensorInfo*> tensors;  // into declaration
  // tensor -> box start -> chunk (a retried chunk replaces the earlier one)
  std::map<std::string, std::map<std::vector<int64_t>, v1::ChunkInfo>> chunks;
  std::map<uint32_t, uint64_t> open;  // writer rank -> serial of its open stream
  std::set<uint32_t> ended;
  std::map<std::string, std::string> objects;
  v1::CheckpointPolicy policy;
  absl::Time last_activity;
  bool beginning = false;  // its marker is being written (Begin, without the lock)
  int in_flight = 0;  // store writes running without the lock
  bool committing = false;  // every writer ended; CommitAttempt runs
  bool abandoned = false;
  std::string abandon_reason;
};

CheckpointUploads::CheckpointUploads(CheckpointStore* store, CheckpointJobLookup jobs,
                                     const Clock* clock, CheckpointUploadsOptions options)
    : store_(store), jobs_(std::move(jobs)), clock_(clock), options_(options) {}

CheckpointUploads::~CheckpointUploads() = default;

absl::StatusOr<int> CheckpointUploads::CollectAbandoned() {
  ASSIGN_OR_RETURN(std::vector<PendingCheckpoint> pending, store_->ListPending());
  for (const PendingCheckpoint& p : pending) {
    LOG(INFO) << "dropping the uncommitted checkpoint attempt of " << PendingName(p);
    RETURN_IF_ERROR(store_->DropPending(p));
  }
  return static_cast<int>(pending.size());
}

absl::StatusOr<std::unique_ptr<CheckpointUploads::Writer>> CheckpointUploads::Begin(
    const v1::UploadHeader& header) {
  RETURN_IF_ERROR(CheckUploadHeader(header, options_.max_tensors));
  const PendingCheckpoint key{JobId(header.job_id()), Step(header.step()),
                              Generation(header.generation())};
  ASSIGN_OR_RETURN(CheckpointJobState job, jobs_(key.job));
  if (key.generation < job.generation) {
    return absl::AbortedError(absl::StrCat("generation ", key.generation.value(), " of job ",
                                           key.job.value(), " is stale (current ",
                                           job.generation.value(), "): upload refused"));
  }
  if (key.generation > job.generation) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job ", key.job.value(), " is at generation ", job.generation.value(), ", not ",
        key.generation.value()));
  }
  const v1::CheckpointLayout& layout = header.layout();
  if (job.data_parallel > 0 &&
      (layout.data_parallel() != job.data_parallel || layout.tensor_parallel() != job.tensor_parallel ||
       layout.pipeline_parallel() != job.pipeline_parallel)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "header.layout: ", layout.data_parallel(), " x ", layout.tensor_parallel(), " x ",
        layout.pipeline_parallel(), " is not the mesh of job ", key.job.value(), " generation ",
        key.generation.value(), " (", job.data_parallel, " x ", job.tensor_parallel, " x ",
        job.pipeline_parallel, ")"));
  }
  if (!job.accepts_checkpoints) {
    return absl::FailedPreconditionError(
        absl::StrCat("job ", key.job.value(), " has ended and takes no checkpoints"));
  }
  absl::StatusOr<std::unique_ptr<CheckpointReader>> committed = store_->Open(key.job, key.step);
  if (committed.ok() && (*committed)->manifest().generation() == key.generation.value()) {
    return absl::AlreadyExistsError(absl::StrCat("the checkpoint of ", PendingName(key),
                                                 " is already committed"));
  }

  absl::MutexLock lock(&mu_);
  if (dropping_.contains(key)) {
    return absl::UnavailableError(absl::StrCat("the abandoned upload of ", PendingName(key),
                                               " is still being dropped; retry"));
  }
  std::shared_ptr<Attempt> slot;
  if (auto found = attempts_.find(key); found != attempts_.end()) slot = found->second;
  if (slot != nullptr && slot->beginning) {
    // Another writer of this checkpoint is writing its marker: wait for it
    // (the marker write is one synced put).
    std::shared_ptr<Attempt> beginning = slot;
    mu_.AwaitWithTimeout(
        absl::Condition(+[](Attempt* a) { return !a->beginning; }, beginning.get()),
        absl::Seconds(30));
    auto again = attempts_.find(key);
    if (beginning->beginning || again == attempts_.end() || again->second != beginning) {
      return absl::UnavailableError(absl::StrCat(
          "the checkpoint upload of ", PendingName(key), " could not be begun yet; retry"));
    }
  }
  if (slot != nullptr && slot->committing) {
    return absl::UnavailableError(
        absl::StrCat("the checkpoint of ", PendingName(key), " is being committed; retry"));
  }
  if (slot == nullptr) {
    slot = std::make_shared<Attempt>();
    slot->key = key;
    slot->declaration = header;
    for (const v1::TensorInfo& t : slot->declaration.tensors()) slot->tensors[t.name()] = &t;
    slot->policy = job.policy;
    slot->last_activity = clock_->Now();
    // The marker goes down before the first chunk can, so a crash from here
    // on leaves something CollectAbandoned finds. A synced write: made
    // without the lock, which every chunk of every upload takes; the other
    // writers of this checkpoint wait above, counted as a store write in
    // flight (an abandon meanwhile drops the attempt once it is done).
    slot->beginning = true;
    ++slot->in_flight;
    attempts_[key] = slot;
    mu_.Unlock();
    const absl::Status marked = store_->BeginPending(key);
    mu_.Lock();
    slot->beginning = false;
    --slot->in_flight;
    if (!marked.ok() || slot->abandoned) {
      auto it = attempts_.find(key);
      if (it != attempts_.end() && it->second == slot) attempts_.erase(it);
      // A write refused by the store fails the attempt, unless the job
      // moved on meanwhile (then it was abandoned, and that is no failure).
      std::optional<FailedCheckpoint> failed;
      if (!marked.ok() && !slot->abandoned) {
        failed =
            FailureLocked(key, v1::CHECKPOINT_FAILURE_KIND_STORAGE, std::string(marked.message()));
      }
      const bool drop = slot->abandoned && slot->in_flight == 0;
      if (drop || failed.has_value()) {
        mu_.Unlock();
        if (drop) Drop(slot);
        Report(failed);
        mu_.Lock();
      }
      if (!marked.ok()) return marked;
      return absl::AbortedError(absl::StrCat("the checkpoint upload of ", PendingName(key),
                                             " was abandoned: ", slot->abandon_reason));
    }
  } else if (!SameDeclaration(slot->declaration, header)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "header of writer ", header.writer(), " for ", PendingName(key),
        " declares another layout or other tensors than writer ", slot->declaration.writer()));
  } else if (slot->ended.contains(header.writer())) {
    return absl::FailedPreconditionError(absl::StrCat(
        "writer ", header.writer(), " has already ended its upload of ", PendingName(key)));
  }
  std::shared_ptr<Attempt> attempt = slot;
  attempt->last_activity = clock_->Now();
  const uint64_t serial = next_writer_serial_++;
  attempt->open[header.writer()] = serial;  // a newer stream replaces a broken one
  return std::unique_ptr<Writer>(new Writer(this, attempt, key, header.writer(), serial));
}

absl::Status CheckpointUploads::AddChunk(Writer* writer, const v1::ChunkHeader& chunk,
                                         std::string_view bytes, uint32_t crc) {
  Attempt& attempt = *writer->attempt_;
  auto it = attempt.tensors.find(chunk.tensor());  // immutable after creation
  if (it == attempt.tensors.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk of tensor \"", chunk.tensor(), "\", which the header did not declare"));
  }
  const v1::TensorInfo& tensor = *it->second;
  const Box box = BoxFromProto(chunk.box());
  const std::vector<int64_t> shape(tensor.global_shape().begin(), tensor.global_shape().end());
  if (!BoxWithin(box, shape) || box.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("tensor ", tensor.name(), ": chunk box ",
                                                   BoxToString(box), " is empty or outside [",
                                                   absl::StrJoin(shape, ", "), "]"));
  }
  const uint64_t expected = static_cast<uint64_t>(box.NumElements()) * DTypeBytes(tensor.dtype());
  if (chunk.bytes() != expected || bytes.size() != expected) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor ", tensor.name(), " chunk ", BoxToString(box), ": ", bytes.size(),
        " bytes received, header says ", chunk.bytes(), ", the box holds ", expected));
  }
  if (static_cast<int64_t>(expected) > options_.max_chunk_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat("tensor ", tensor.name(), " chunk ",
                                                     BoxToString(box), ": ", expected,
                                                     " bytes exceed the chunk limit of ",
                                                     options_.max_chunk_bytes));
  }
  if (crc != chunk.crc32c()) {
    return absl::DataLossError(absl::StrCat("tensor ", tensor.name(), " chunk ", BoxToString(box),
                                            " arrived corrupt (crc32c mismatch)"));
  }
  {
    absl::MutexLock lock(&mu_);
    if (attempt.abandoned) {
      return absl::AbortedError(absl::StrCat("the upload of ", PendingName(attempt.key),
                                             " was abandoned: ", attempt.abandon_reason));
    }
    auto open = attempt.open.find(writer->rank_);
    if (open == attempt.open.end() || open->second != writer->serial_) {
      return absl::AbortedError(absl::StrCat("writer ", writer->rank_,
                                             " was superseded by a newer stream"));
    }
    ++attempt.in_flight;
  }
  absl::Status stored = store_->PutChunk(attempt.key, tensor.name(), box, bytes);
  bool drop = false;
  std::optional<FailedCheckpoint> failed;
  {
    absl::MutexLock lock(&mu_);
    --attempt.in_flight;
    attempt.last_activity = clock_->Now();
    // The attempt lingers (its writer may retry the chunk) until it is
    // abandoned, but a store that refused a chunk has failed it now: that
    // is what the user must hear of (the disk is full), once.
    if (!stored.ok() && !attempt.abandoned) {
      failed = FailureLocked(attempt.key, v1::CHECKPOINT_FAILURE_KIND_STORAGE,
                             std::string(stored.message()));
    }
    if (stored.ok() && !attempt.abandoned) {
      v1::ChunkInfo& info = attempt.chunks[tensor.name()][box.start];
      *info.mutable_box() = chunk.box();
      info.set_bytes(expected);
      info.set_crc32c(crc);
      info.set_writer(writer->rank_);
      ++counters_.chunks;
      counters_.bytes += static_cast<int64_t>(expected);
    }
    drop = attempt.abandoned && attempt.in_flight == 0;
  }
  if (drop) Drop(writer->attempt_);
  Report(failed);
  if (stored.ok()) ++writer->chunks_;
  return stored;
}

absl::StatusOr<bool> CheckpointUploads::End(Writer* writer, const v1::UploadEnd& end) {
  if (end.chunks() != writer->chunks_.load()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "end.chunks: ", end.chunks(), " announced, ", writer->chunks_.load(), " received"));
  }
  std::shared_ptr<Attempt> complete;
  {
    absl::MutexLock lock(&mu_);
    Attempt& attempt = *writer->attempt_;
    if (attempt.abandoned) {
      return absl::AbortedError(absl::StrCat("the upload of ", PendingName(attempt.key),
                                             " was abandoned: ", attempt.abandon_reason));
    }
    attempt.open.erase(writer->rank_);
    attempt.ended.insert(writer->rank_);
    for (const auto& [name, value] : end.objects()) attempt.objects[name] = value;
    attempt.last_activity = clock_->Now();
    if (attempt.ended.size() == attempt.declaration.writers() && attempt.in_flight == 0) {
      attempt.committing = true;
      complete = writer->attempt_;
    }
  }
  writer->ended_ = true;
  if (complete == nullptr) return false;
  RETURN_IF_ERROR(CommitAttempt(std::move(complete)));
  return true;
}

void CheckpointUploads::Abort(Writer* writer) {
  absl::MutexLock lock(&mu_);
  auto open = writer->attempt_->open.find(writer->rank_);
  if (open != writer->attempt_->open.end() && open->second == writer->serial_) {
    writer->attempt_->open.erase(open);
  }
}

absl::Status CheckpointUploads::CommitAttempt(std::shared_ptr<Attempt> attempt) {
  const PendingCheckpoint& key = attempt->key;
  LOG(INFO) << "committing the checkpoint of " << PendingName(key);
  absl::StatusOr<CheckpointJobState> job = jobs_(key.job);
  if (!job.ok() || job->generation != key.generation) {
    Fail(attempt, "stale generation at commit");
    return absl::AbortedError(absl::StrCat(
        "the checkpoint of ", PendingName(key), " was not committed: ",
        job.ok() ? absl::StrCat("the job moved to generation ", job->generation.value())
                 : job.status().ToString()));
  }
  v1::CheckpointManifest manifest;
  manifest.set_job_id(key.job.value());
  manifest.set_step(key.step.value());
  manifest.set_generation(key.generation.value());
  *manifest.mutable_layout() = attempt->declaration.layout();
  manifest.set_writers(attempt->declaration.writers());
  int64_t total = 0;
  for (const auto& [name, declared] : attempt->tensors) {  // sorted by name
    v1::TensorInfo* tensor = manifest.add_tensors();
    *tensor = *declared;
    std::vector<Box> boxes;
    uint32_t index = 0;
    for (auto& [start, chunk] : attempt->chunks[name]) {
      v1::ChunkInfo* info = tensor->add_chunks();
      *info = chunk;
      info->set_index(index++);
      total += static_cast<int64_t>(chunk.bytes());
      boxes.push_back(BoxFromProto(chunk.box()));
    }
    const std::vector<int64_t> shape(declared->global_shape().begin(),
                                     declared->global_shape().end());
    if (absl::Status covered = CheckCoverage(name, shape, boxes); !covered.ok()) {
      Fail(attempt, std::string(covered.message()), v1::CHECKPOINT_FAILURE_KIND_INCOMPLETE);
      return absl::FailedPreconditionError(absl::StrCat(
          "the checkpoint of ", PendingName(key), " was not committed: ", covered.message()));
    }
  }
  manifest.set_total_bytes(total);
  manifest.set_committed_unix_ms(absl::ToUnixMillis(clock_->Now()));
  for (const auto& [name, value] : attempt->objects) (*manifest.mutable_objects())[name] = value;
  if (absl::Status s = store_->Commit(manifest); !s.ok()) {
    Fail(attempt, s.ToString(), v1::CHECKPOINT_FAILURE_KIND_STORAGE, std::string(s.message()));
    return s;
  }
  LOG(INFO) << "committed the checkpoint of " << PendingName(key) << ": "
            << manifest.tensors_size() << " tensors, " << total << " bytes";

  // Older attempts of this job can no longer become the newest checkpoint.
  std::vector<std::shared_ptr<Attempt>> to_drop;
  {
    absl::MutexLock lock(&mu_);
    ++counters_.commits;
    attempts_.erase(key);
    for (auto it = attempts_.begin(); it != attempts_.end();) {
      if (it->first.job == key.job && it->first.step < key.step) {
        std::shared_ptr<Attempt> older = it->second;
        it = attempts_.erase(it);
        if (AbandonLocked(older, absl::StrCat("step ", key.step.value(), " was committed first"))) {
          to_drop.push_back(older);
        }
      } else {
        ++it;
      }
    }
  }
  for (const auto& older : to_drop) Drop(older);
  if (options_.on_commit) {
    options_.on_commit(
        CommittedCheckpoint{key, absl::FromUnixMillis(manifest.committed_unix_ms())});
  }
  if (options_.defer) {
    // Deleting checkpoints compacts the store; the writer's reply should
    // not wait for that.
    options_.defer([this, job = key.job, policy = attempt->policy] { Retire(job, policy); });
  } else {
    Retire(key.job, attempt->policy);
  }
  return absl::OkStatus();
}

void CheckpointUploads::Retire(const JobId& job, const v1::CheckpointPolicy& policy) {
  absl::StatusOr<std::vector<v1::CheckpointManifest>> listed = store_->List(job);
  if (!listed.ok()) {
    LOG(WARNING) << "retention for job " << job << ": " << listed.status();
    return;
  }
  std::vector<int64_t> steps;
  for (const v1::CheckpointManifest& m : *listed) steps.push_back(m.step());
  for (int64_t step : StepsToRetire(steps, policy)) {
    if (absl::Status s = store_->Delete(job, Step(step)); !s.ok() && !absl::IsNotFound(s)) {
      LOG(WARNING) << "retention: deleting job " << job << " step " << step << ": " << s;
      continue;
    }
    LOG(INFO) << "retention: deleted the checkpoint of job " << job << " step " << step;
    absl::MutexLock lock(&mu_);
    ++counters_.retired;
  }
}

bool CheckpointUploads::AbandonLocked(const std::shared_ptr<Attempt>& attempt,
                                      const std::string& why) {
  if (attempt->abandoned) return false;
  attempt->abandoned = true;
  dropping_.insert(attempt->key);
  attempt->abandon_reason = why;
  ++counters_.abandoned;
  LOG(INFO) << "abandoning the checkpoint upload of " << PendingName(attempt->key) << ": " << why;
  return attempt->in_flight == 0;
}

void CheckpointUploads::Fail(const std::shared_ptr<Attempt>& attempt, const std::string& why,
                             v1::CheckpointFailureKind kind, std::string reason) {
  std::optional<FailedCheckpoint> failed;
  bool drop = false;
  {
    absl::MutexLock lock(&mu_);
    auto it = attempts_.find(attempt->key);
    if (it != attempts_.end() && it->second == attempt) attempts_.erase(it);
    drop = AbandonLocked(attempt, why);
    if (kind != v1::CHECKPOINT_FAILURE_KIND_UNSPECIFIED) {
      failed = FailureLocked(attempt->key, kind, reason.empty() ? why : std::move(reason));
    }
  }
  if (drop) Drop(attempt);
  Report(failed);
}

std::optional<FailedCheckpoint> CheckpointUploads::FailureLocked(const PendingCheckpoint& key,
                                                                 v1::CheckpointFailureKind kind,
                                                                 std::string reason) {
  if (!reported_.insert(key).second) return std::nullopt;
  reported_order_.push_back(key);
  if (reported_order_.size() > kRememberedFailures) {
    reported_.erase(reported_order_.front());
    reported_order_.pop_front();
  }
  LOG(WARNING) << "the checkpoint attempt of " << PendingName(key) << " failed ("
               << ShortEnumName(kind) << "): " << reason;
  return FailedCheckpoint{key, kind, std::move(reason), clock_->Now()};
}

void CheckpointUploads::Report(const std::optional<FailedCheckpoint>& failure) {
  if (failure.has_value() && options_.on_failure) options_.on_failure(*failure);
}

void CheckpointUploads::Drop(const std::shared_ptr<Attempt>& attempt) {
  if (absl::Status s = store_->DropPending(attempt->key); !s.ok()) {
    LOG(WARNING) << "dropping the checkpoint attempt of " << PendingName(attempt->key) << ": "
                 << s << " (collected at the next start)";
  }
  absl::MutexLock lock(&mu_);
  dropping_.erase(attempt->key);
}

void CheckpointUploads::Tick() {
  std::vector<JobId> jobs;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [key, attempt] : attempts_) {
      if (jobs.empty() || jobs.back() != key.job) jobs.push_back(key.job);
    }
  }
  std::map<JobId, absl::StatusOr<CheckpointJobState>> states;
  for (const JobId& job : jobs) states.emplace(job, jobs_(job));
  std::vector<std::shared_ptr<Attempt>> to_drop;
  std::vector<std::optional<FailedCheckpoint>> failed;
  {
    absl::MutexLock lock(&mu_);
    const absl::Time now = clock_->Now();
    for (auto it = attempts_.begin(); it != attempts_.end();) {
      std::string why;
      bool idle = false;
      if (it->second->committing) {
        ++it;
        continue;
      }
      auto state = states.find(it->first.job);
      if (state != states.end() && !state->second.ok()) {
        why = state->second.status().ToString();
      } else if (state != states.end() && state->second->generation != it->first.generation) {
        why = absl::StrCat("the job moved to generation ", state->second->generation.value());
      } else if (now - it->second->last_activity > options_.abandon_after) {
        why = absl::StrCat("no activity for ", absl::FormatDuration(options_.abandon_after));
        idle = true;
      }
      if (why.empty()) {
        ++it;
        continue;
      }
      std::shared_ptr<Attempt> attempt = it->second;
      it = attempts_.erase(it);
      if (AbandonLocked(attempt, why)) to_drop.push_back(attempt);
      // Writers of a job that ended stopped with it; writers of a running
      // job that went silent lost the checkpoint. (An attempt a store
      // error failed before was reported then, and is not again.)
      if (idle && state != states.end() && state->second->accepts_checkpoints &&
          !state->second->finished) {
        failed.push_back(FailureLocked(attempt->key, v1::CHECKPOINT_FAILURE_KIND_ABANDONED,
                                       absl::StrCat("its writers sent nothing for ",
                                                    absl::FormatDuration(options_.abandon_after))));
      }
    }
  }
  for (const auto& attempt : to_drop) Drop(attempt);
  for (const auto& failure : failed) Report(failure);
}

UploadCounters CheckpointUploads::counters() const {
  absl::MutexLock lock(&mu_);
  return counters_;
}

int CheckpointUploads::pending_attempts() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(attempts_.size());
}

CheckpointUploads::Writer::~Writer() {
  if (!ended_) owner_->Abort(this);
}

absl::Status CheckpointUploads::Writer::AddChunk(const v1::ChunkHeader& chunk,
                                                 std::string_view bytes) {
  return owner_->AddChunk(this, chunk, bytes, Crc32c(bytes));
}

absl::Status CheckpointUploads::Writer::AddChunk(const v1::ChunkHeader& chunk,
                                                 std::string_view bytes,
                                                 uint32_t crc32c_of_bytes) {
  return owner_->AddChunk(this, chunk, bytes, crc32c_of_bytes);
}

absl::StatusOr<bool> CheckpointUploads::Writer::End(const v1::UploadEnd& end) {
  return owner_->End(this, end);
}

}  // namespace cohort::coordinator
