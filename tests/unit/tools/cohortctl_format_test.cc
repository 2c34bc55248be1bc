// Tables, job details, the progress bar and event lines of cohortctl.

#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "common/proto_time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tools/cohortctl/job_format.h"
#include "tools/cohortctl/progress_bar.h"
#include "tools/cohortctl/spec_builder.h"
#include "tools/cohortctl/text_table.h"

namespace cohort::cohortctl {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

// When `get` runs, in these tests: ten minutes after RunningJob() was created.
const absl::Time kNow = absl::FromUnixSeconds(1'700'000'600);

// A RUNNING demo job at step 120 on a 2x2x1 mesh of four workers.
v1::Job RunningJob() {
  v1::Job job;
  job.set_job_id("j-7f3a");
  // The demo spec with the values these expectations were written for.
  *job.mutable_spec() = DemoJobSpec();
  job.mutable_spec()->set_steps(200);
  job.mutable_spec()->mutable_optimizer()->set_learning_rate(1e-3);
  job.mutable_spec()->mutable_optimizer()->set_min_learning_rate(1e-4);
  job.mutable_spec()->mutable_optimizer()->set_warmup_steps(10);
  job.mutable_spec()->mutable_checkpoint()->set_interval_steps(50);
  job.mutable_spec()->mutable_checkpoint()->set_keep_last(3);
  job.set_state(v1::JOB_STATE_RUNNING);
  job.set_generation(3);
  job.set_ready_workers(4);
  job.set_message("training");
  v1::Mesh& mesh = *job.mutable_mesh();
  mesh.set_data_parallel(2);
  mesh.set_tensor_parallel(2);
  mesh.set_pipeline_parallel(1);
  for (int rank = 0; rank < 4; ++rank) {
    v1::MeshMember& member = *mesh.add_members();
    member.set_worker_id(absl::StrCat("w", rank));
    member.set_host(rank < 2 ? "host-a" : "host-b");
    member.set_device_index(rank % 2);
    member.mutable_coordinates()->set_rank(rank);
    member.mutable_coordinates()->set_tensor(rank % 2);
    member.mutable_coordinates()->set_data(rank / 2);
  }
  job.mutable_progress()->set_step(120);
  job.mutable_progress()->set_loss(3.21049);
  job.mutable_progress()->set_tokens_per_second(12345);
  job.mutable_progress()->set_step_time_seconds(0.125);
  *job.mutable_create_time() = ToProtoTime(absl::FromUnixSeconds(1'700'000'000));
  return job;
}

TEST(TextTableTest, AlignsColumnsWithoutTrailingBlanks) {
  TextTable table({"A", "LONG HEADER", "C"});
  table.AddRow({"wide cell", "x", "last"});
  table.AddRow({"y"});  // missing cells print empty
  table.AddRow({"multi\nline", "tab\there", "z", "dropped"});
  EXPECT_EQ(table.row_count(), 3u);
  EXPECT_EQ(table.Render(),
            "A           LONG HEADER  C\n"
            "wide cell   x            last\n"
            "y\n"
            "multi line  tab here     z\n");
}

TEST(JobFormatTest, NamesAndShapes) {
  EXPECT_EQ(JobStateName(v1::JOB_STATE_RECONFIGURING), "RECONFIGURING");
  EXPECT_EQ(JobStateName(static_cast<v1::JobState>(42)), "UNKNOWN(42)");
  EXPECT_EQ(WorkerStateName(v1::WORKER_STATE_LOST), "LOST");
  EXPECT_EQ(JobEventKindName(v1::JOB_EVENT_KIND_MESH_CHANGED), "MESH_CHANGED");
  EXPECT_EQ(JobEventKindName(v1::JOB_EVENT_KIND_RECOVERED), "RECOVERED");
  EXPECT_EQ(RecoveryKindName(v1::RECOVERY_KIND_CHECKPOINT), "CHECKPOINT");
  EXPECT_TRUE(IsTerminal(v1::JOB_STATE_CANCELLED));
  EXPECT_FALSE(IsTerminal(v1::JOB_STATE_RECONFIGURING));
  EXPECT_EQ(MeshShape(RunningJob().mesh()), "2x2x1");
  EXPECT_EQ(MeshShape(v1::Mesh()), "-");
  EXPECT_EQ(DeviceLabel(v1::DEVICE_KIND_GPU, 3), "gpu:3");
  EXPECT_EQ(DeviceLabel(v1::DEVICE_KIND_UNSPECIFIED, 0), "cpu:0");
  EXPECT_EQ(StepProgress(RunningJob()), "120/200");
}

TEST(JobFormatTest, Ages) {
  EXPECT_EQ(FormatAge(absl::Milliseconds(850)), "850ms");
  EXPECT_EQ(FormatAge(absl::Milliseconds(4200)), "4.2s");
  EXPECT_EQ(FormatAge(absl::Seconds(187)), "3m07s");
  EXPECT_EQ(FormatAge(absl::Minutes(125)), "2h05m");
  EXPECT_EQ(FormatAge(absl::Seconds(-3)), "0ms");
}

TEST(JobFormatTest, JobTable) {
  v1::ListJobsResponse response;
  *response.add_jobs() = RunningJob();
  v1::Job& pending = *response.add_jobs();
  pending.set_job_id("j-2");
  pending.mutable_spec()->set_name("next");
  pending.mutable_spec()->set_steps(50);
  pending.set_state(v1::JOB_STATE_PENDING);
  pending.set_message("waiting for 2 workers, have 1");
  EXPECT_EQ(FormatJobTable(response),
            "JOB     NAME  STATE    GEN  WORKERS  MESH   STEP/STEPS  MESSAGE\n"
            "j-7f3a  demo  RUNNING  3    4        2x2x1  120/200     training\n"
            "j-2     next  PENDING  0    0        -      0/50        waiting "
            "for 2 workers, have 1\n");
}

TEST(JobFormatTest, JobDetailsShowSpecProgressAndMesh) {
  const std::string details = FormatJobDetails(RunningJob(), kNow);
  EXPECT_THAT(details, StartsWith("Job:         j-7f3a\nName:        demo\n"
                                  "State:       RUNNING\n"));
  EXPECT_THAT(details, HasSubstr("Created:     2023-11-14 22:13:20 UTC\n"));
  EXPECT_THAT(details, HasSubstr("Updated:     -\n"));
  EXPECT_THAT(details, HasSubstr("Progress:    step 120/200, loss 3.2105, 12345 "
                                 "tokens/s, 0.125 s/step\n"));
  EXPECT_THAT(details, HasSubstr("Model:       2 layers, 4 heads, width 64, "
                                 "vocab 256, context 64\n"));
  // How the step's micro-batches split, when the mesh says.
  v1::Job split = RunningJob();
  for (int share : {3, 3, 2}) split.mutable_mesh()->add_micro_batches(share);
  EXPECT_THAT(FormatJobDetails(split, kNow),
              HasSubstr("Split:       3+3+2 micro-batches per data rank (deterministic "
                        "reduction)\n"));
  EXPECT_THAT(details, Not(HasSubstr("Split:")));
  // The windowed rate beside the last step's, once a worker reports it.
  v1::Job averaged = RunningJob();
  averaged.mutable_progress()->set_tokens_per_second_average(11800);
  EXPECT_THAT(FormatJobDetails(averaged, kNow),
              HasSubstr("Progress:    step 120/200, loss 3.2105, 12345 tokens/s (average "
                        "11800), 0.125 s/step\n"));
  EXPECT_THAT(details, HasSubstr("Optimizer:   lr 0.001 -> 0.0001, warmup 10, "
                                 "weight decay 0.1, grad clip 1\n"));
  EXPECT_THAT(details, HasSubstr("Elastic:     2..4 workers\n"));
  EXPECT_THAT(details, HasSubstr("Checkpoint:  every 50 steps, keep last 3\n"));
  EXPECT_THAT(details, HasSubstr("Mesh:        2x2x1 (data x tensor x "
                                 "pipeline), 4 members, 4 ready\n"));
  EXPECT_THAT(details, HasSubstr("RANK  WORKER  HOST    DEVICE  DATA  TENSOR  PIPELINE\n"
                                 "0     w0      host-a  cpu:0   0     0       0\n"
                                 "1     w1      host-a  cpu:1   0     1       0\n"
                                 "2     w2      host-b  cpu:0   1     0       0\n"
                                 "3     w3      host-b  cpu:1   1     1       0\n"));
}

TEST(JobFormatTest, JobDetailsShowTheValidationDataAndTheNewestResults) {
  v1::Job job = RunningJob();
  EXPECT_THAT(FormatJobDetails(job, kNow), Not(HasSubstr("Validation")));
  v1::ValidationConfig* validation = job.mutable_spec()->mutable_data()->mutable_validation();
  validation->set_pattern("/data/val_*.bin");
  validation->set_interval_steps(50);
  validation->set_batches(4);
  for (const auto& [step, loss] : {std::pair{50, 3.5}, std::pair{100, 3.25}}) {
    v1::LossPoint* p = job.mutable_progress()->add_validation();
    p->set_step(step);
    p->set_loss(loss);
  }
  const std::string details = FormatJobDetails(job, kNow);
  EXPECT_THAT(details, HasSubstr("Held out:    shards /data/val_*.bin, every 50 steps and "
                                 "the last, 4 batches\n"));
  EXPECT_THAT(details, HasSubstr("Validation:  loss 3.2500 at step 100 (3.5000 at step 50)\n"));
  validation->clear_pattern();
  validation->set_held_out_fraction(0.1);
  validation->set_interval_steps(0);
  EXPECT_THAT(FormatJobDetails(job, kNow),
              HasSubstr("the last 10% of the data, after the last step, 4 batches\n"));
  // The bar and the event line show the newest.
  EXPECT_THAT(RenderProgressBar(job, 140), HasSubstr("loss  3.2105  val  3.2500  12.3k tok/s"));
  v1::JobEvent event;
  event.set_kind(v1::JOB_EVENT_KIND_PROGRESS);
  *event.mutable_job() = job;
  EXPECT_THAT(FormatEventLine(event), HasSubstr(" val_loss=3.2500@100"));
}

TEST(JobFormatTest, PendingJobHasNoMeshTable) {
  v1::Job job = RunningJob();
  job.clear_mesh();
  job.mutable_progress()->set_step(0);
  const std::string details = FormatJobDetails(job, kNow);
  EXPECT_THAT(details, HasSubstr("Progress:    step 0/200\n"));  // no loss yet
  EXPECT_THAT(details, HasSubstr("Mesh:        none yet\n"));
  EXPECT_THAT(details, Not(HasSubstr("RANK")));
}

TEST(JobFormatTest, WorkerTable) {
  v1::ListWorkersResponse response;
  v1::WorkerInfo& busy = *response.add_workers();
  busy.set_worker_id("w0");
  busy.set_host("host-a");
  busy.set_device_kind(v1::DEVICE_KIND_GPU);
  busy.set_device_index(1);
  busy.set_state(v1::WORKER_STATE_ASSIGNED);
  busy.set_job_id("j-7f3a");
  busy.mutable_coordinates()->set_rank(5);
  busy.set_last_heartbeat_age_ms(250);
  busy.set_metrics_address("host-a:9466");
  v1::WorkerInfo& idle = *response.add_workers();
  idle.set_worker_id("w1");
  idle.set_host("host-b");
  idle.set_state(v1::WORKER_STATE_IDLE);
  idle.set_last_heartbeat_age_ms(61'000);
  v1::WarmSpare& warm = *idle.mutable_warm();
  warm.set_job_id("j-7f3a");
  warm.set_rank(7);
  warm.set_state(v1::WARM_SPARE_STATE_WARM);
  warm.set_bytes(uint64_t{3} << 30);
  EXPECT_EQ(FormatWorkerTable(response),
            "WORKER  HOST    DEVICE  STATE     JOB     RANK  SPARE                  "
            "HEARTBEAT AGE  METRICS\n"
            "w0      host-a  gpu:1   ASSIGNED  j-7f3a  5     -                      "
            "250ms          host-a:9466\n"
            "w1      host-b  cpu:0   IDLE      -       -     warm j-7f3a:7 3.22 GB  "
            "1m01s          -\n");
}

TEST(JobFormatTest, Summary) {
  EXPECT_EQ(FormatJobSummary(RunningJob()), "j-7f3a RUNNING (training)");
  v1::Job job;
  job.set_job_id("j-1");
  job.set_state(v1::JOB_STATE_PENDING);
  EXPECT_EQ(FormatJobSummary(job), "j-1 PENDING");
}

// RunningJob() after its generation 3 took generation 2's state from peers.
v1::Job PeerRecoveredJob() {
  v1::Job job = RunningJob();
  v1::RecoveryPlan& plan = *job.mutable_recovery();
  plan.set_kind(v1::RECOVERY_KIND_PEER);
  plan.set_step(120);
  plan.set_source_generation(2);
  plan.set_lost_steps(0);
  plan.set_reason("every piece of generation 2's state survives; resuming at step 120");
  v1::RecoveryStats& stats = *job.mutable_recovery_stats();
  stats.set_peer(2);
  stats.set_spare(1);
  stats.set_checkpoint(1);
  stats.set_lost_steps(20);
  stats.set_last_detect_to_running_seconds(0.1837);
  stats.set_last_suspend_seconds(0.0211);
  stats.set_last_prepare_seconds(0.1626);
  stats.set_last_build_seconds(0.0500);
  stats.set_last_restore_seconds(0.1100);
  stats.set_last_sessions_kept(1);
  stats.set_last_members(2);
  stats.set_last_communicators_seconds(0.0200);
  stats.set_last_session_seconds(0.0300);
  stats.set_last_transfer_seconds(0.0900);
  stats.set_last_mirrors_seconds(0.0200);
  stats.set_last_first_step_seconds(0.0400);
  stats.set_last_detect_to_first_step_seconds(0.2237);
  return job;
}

// RunningJob() after its generation 3 loaded the checkpoint of step 100.
v1::Job CheckpointRecoveredJob() {
  v1::Job job = RunningJob();
  v1::RecoveryPlan& plan = *job.mutable_recovery();
  plan.set_kind(v1::RECOVERY_KIND_CHECKPOINT);
  plan.set_step(100);
  plan.set_checkpoint_step(100);
  plan.set_lost_steps(20);
  plan.set_reason(
      "no survivor holds the weights of source rank 1 (data 0, tensor 1, pipeline 0); "
      "resuming from the checkpoint of step 100");
  v1::RecoveryStats& stats = *job.mutable_recovery_stats();
  stats.set_checkpoint(1);
  stats.set_lost_steps(20);
  stats.set_last_detect_to_running_seconds(2.5);
  stats.set_last_suspend_seconds(0.5);
  stats.set_last_prepare_seconds(2.0);
  return job;
}

TEST(RecoveryFormatTest, PeerPlan) {
  v1::Job job = PeerRecoveredJob();
  EXPECT_EQ(FormatRecoveryPlan(job),
            "PEER at step 120 (generation 3 from generation 2's memory, 0 steps lost): every "
            "piece of generation 2's state survives; resuming at step 120");
  // A drained worker serves its state as a donor.
  job.mutable_recovery()->add_donors()->set_worker_id("w9");
  job.mutable_recovery()->clear_reason();
  EXPECT_EQ(FormatRecoveryPlan(job),
            "PEER at step 120 (generation 3 from generation 2's memory, 1 donor, 0 steps lost)");
  job.mutable_recovery()->add_donors()->set_worker_id("w8");
  EXPECT_EQ(FormatRecoveryPlan(job),
            "PEER at step 120 (generation 3 from generation 2's memory, 2 donors, 0 steps lost)");
}

TEST(RecoveryFormatTest, CheckpointAndFreshStartPlans) {
  EXPECT_EQ(FormatRecoveryPlan(CheckpointRecoveredJob()),
            "CHECKPOINT step 100, 20 steps lost: no survivor holds the weights of source rank 1 "
            "(data 0, tensor 1, pipeline 0); resuming from the checkpoint of step 100");
  v1::Job job = RunningJob();
  job.mutable_recovery()->set_kind(v1::RECOVERY_KIND_NONE);
  job.mutable_recovery()->set_lost_steps(1);
  job.mutable_recovery()->set_reason("no survivor holds state; no checkpoint: starting over");
  EXPECT_EQ(FormatRecoveryPlan(job),
            "NONE, fresh start at step 0, 1 step lost: no survivor holds state; no checkpoint: "
            "starting over");
}

TEST(RecoveryFormatTest, NoPlanAndNoRecoveriesPrintNothing) {
  const v1::Job job = RunningJob();
  EXPECT_EQ(FormatRecoveryPlan(job), "");
  EXPECT_EQ(FormatRecoveryStats(job.recovery_stats()), "");
  const std::string details = FormatJobDetails(job, kNow);
  EXPECT_THAT(details, Not(HasSubstr("Recovery")));
  EXPECT_THAT(details, Not(HasSubstr("Recoveries")));
}

TEST(RecoveryFormatTest, Totals) {
  EXPECT_EQ(FormatRecoveryStats(PeerRecoveredJob().recovery_stats()),
            "2 peer (1 with a spare), 1 from checkpoint, 20 steps lost; last took 0.184 s from "
            "detection to running (suspend 0.021 s, prepare 0.163 s: build 0.050 s "
            "(communicators 0.020 s, session 0.030 s), restore 0.110 s (transfer 0.090 s, "
            "mirrors 0.020 s); 1 of 2 members kept their session), 0.224 s to its first step");
  EXPECT_EQ(FormatRecoveryStats(CheckpointRecoveredJob().recovery_stats()),
            "0 peer, 1 from checkpoint, 20 steps lost; last took 2.500 s from detection to "
            "running (suspend 0.500 s, prepare 2.000 s)");
  v1::RecoveryStats stats;
  stats.set_peer(1);
  EXPECT_EQ(FormatRecoveryStats(stats), "1 peer, 0 from checkpoint, 0 steps lost");
}

TEST(RecoveryFormatTest, JobDetailsShowThePlanAndTotalsAfterTheGeneration) {
  EXPECT_THAT(FormatJobDetails(PeerRecoveredJob(), kNow),
              HasSubstr("Generation:  3\n"
                        "Recovery:    PEER at step 120 (generation 3 from generation 2's memory, "
                        "0 steps lost): every piece of generation 2's state survives; resuming "
                        "at step 120\n"
                        "Recoveries:  2 peer (1 with a spare), 1 from checkpoint, 20 steps lost; "
                        "last took 0.184 s from detection to running (suspend 0.021 s, prepare "
                        "0.163 s: build 0.050 s (communicators 0.020 s, session 0.030 s), "
                        "restore 0.110 s (transfer 0.090 s, mirrors 0.020 s); 1 of 2 members "
                        "kept their session), 0.224 s to its first step\n"
                        "Created:     "));
  // A fresh job's plan shows without totals.
  v1::Job job = RunningJob();
  job.mutable_recovery()->set_kind(v1::RECOVERY_KIND_NONE);
  job.mutable_recovery()->set_reason("no state to recover");
  EXPECT_THAT(FormatJobDetails(job, kNow),
              HasSubstr("Generation:  3\n"
                        "Recovery:    NONE, fresh start at step 0, 0 steps lost: no state to "
                        "recover\n"
                        "Created:     "));
}

TEST(RecoveryFormatTest, RecoveredEventLine) {
  v1::JobEvent event;
  event.set_kind(v1::JOB_EVENT_KIND_RECOVERED);
  *event.mutable_job() = PeerRecoveredJob();
  *event.mutable_time() = ToProtoTime(absl::FromUnixMillis(1'700'000'000'250));
  EXPECT_EQ(FormatRecovered(event.job()),
            "generation 3: PEER at step 120, 0 steps lost, 0.184 s from detection to running");
  EXPECT_EQ(FormatEventLine(event),
            "2023-11-14T22:13:20.250Z RECOVERED job=j-7f3a generation 3: PEER at step 120, "
            "0 steps lost, 0.184 s from detection to running");
  *event.mutable_job() = CheckpointRecoveredJob();
  event.clear_time();
  EXPECT_EQ(FormatEventLine(event),
            "- RECOVERED job=j-7f3a generation 3: CHECKPOINT step 100, 20 steps lost, 2.500 s "
            "from detection to running");
  // Without a measured time the line says nothing about it.
  event.mutable_job()->clear_recovery_stats();
  EXPECT_EQ(FormatEventLine(event),
            "- RECOVERED job=j-7f3a generation 3: CHECKPOINT step 100, 20 steps lost");
}

// The store's words for a full disk, as the coordinator records them.
constexpr char kNoSpace[] =
    "RocksDB write of a chunk of param/w for job j-7f3a step 1400 generation 3 in data dir "
    "/data/checkpoints failed: IO error: No space left on device: While appending to file: "
    "/data/checkpoints/000012.blob: No space left on device";

v1::CheckpointCommit CommitAt(int64_t step, absl::Time time) {
  v1::CheckpointCommit commit;
  commit.set_step(step);
  commit.set_generation(3);
  *commit.mutable_time() = ToProtoTime(time);
  return commit;
}

v1::CheckpointFailure FailureAt(int64_t step, absl::Time time, v1::CheckpointFailureKind kind,
                                const std::string& reason) {
  v1::CheckpointFailure failure;
  failure.set_step(step);
  failure.set_generation(3);
  *failure.mutable_time() = ToProtoTime(time);
  failure.set_kind(kind);
  failure.set_reason(reason);
  return failure;
}

// RunningJob() whose step 1200 committed 3m07s before kNow and whose step
// 1400 failed for want of disk 4 s before kNow, the 7th attempt to fail.
v1::Job CheckpointsFailingJob() {
  v1::Job job = RunningJob();
  v1::CheckpointStatus& status = *job.mutable_checkpoint_status();
  *status.mutable_last_commit() = CommitAt(1200, kNow - absl::Seconds(187));
  *status.mutable_last_failure() =
      FailureAt(1400, kNow - absl::Seconds(4), v1::CHECKPOINT_FAILURE_KIND_STORAGE, kNoSpace);
  status.set_failed_attempts(7);
  return job;
}

TEST(CheckpointFormatTest, NothingToShowPrintsNothing) {
  EXPECT_EQ(FormatCheckpointStatus(v1::CheckpointStatus(), kNow), "");
  EXPECT_THAT(FormatJobDetails(RunningJob(), kNow), Not(HasSubstr("Checkpoints:")));
  v1::CheckpointStatus status;
  *status.mutable_last_commit() = CommitAt(1200, kNow - absl::Seconds(187));
  EXPECT_EQ(FormatCheckpointStatus(status, kNow), "step 1200 committed 3m07s ago");
  EXPECT_FALSE(CheckpointsFailing(status));
}

TEST(CheckpointFormatTest, AFailureNewerThanTheLastCommitStandsOut) {
  const v1::CheckpointStatus status = CheckpointsFailingJob().checkpoint_status();
  EXPECT_TRUE(CheckpointsFailing(status));
  // The reason is cut in the middle: its start, and the end that says why.
  EXPECT_EQ(FormatCheckpointStatus(status, kNow),
            "step 1200 committed 3m07s ago; FAILING: step 1400 failed 4.0s ago (storage: "
            "RocksDB write of a chunk of param/w ... appending to file: "
            "/data/checkpoints/000012.blob: No space left on device), 7 attempts failed");
  // get shows it after the progress.
  EXPECT_THAT(FormatJobDetails(CheckpointsFailingJob(), kNow),
              HasSubstr("tokens/s, 0.125 s/step\n"
                        "Checkpoints: step 1200 committed 3m07s ago; FAILING: step 1400 failed "
                        "4.0s ago (storage: RocksDB write"));
}

TEST(CheckpointFormatTest, AFailureACommitFollowedIsHistory) {
  v1::CheckpointStatus status = CheckpointsFailingJob().checkpoint_status();
  *status.mutable_last_commit() = CommitAt(1500, kNow - absl::Seconds(2));
  status.mutable_last_failure()->set_reason("IO error: No space left on device");
  EXPECT_FALSE(CheckpointsFailing(status));
  EXPECT_EQ(FormatCheckpointStatus(status, kNow),
            "step 1500 committed 2.0s ago; last failure step 1400 4.0s ago (storage: IO error: "
            "No space left on device), 7 attempts failed");
}

TEST(CheckpointFormatTest, FailuresWithoutACommit) {
  v1::CheckpointStatus status;
  *status.mutable_last_failure() =
      FailureAt(100, kNow - absl::Minutes(12), v1::CHECKPOINT_FAILURE_KIND_INCOMPLETE,
                "param/w: chunks cover 18 of its 24 elements");
  status.set_failed_attempts(1);
  EXPECT_TRUE(CheckpointsFailing(status));
  EXPECT_EQ(FormatCheckpointStatus(status, kNow),
            "none committed; FAILING: step 100 failed 12m00s ago (incomplete: param/w: chunks "
            "cover 18 of its 24 elements), 1 attempt failed");
  *status.mutable_last_failure() = FailureAt(100, kNow, v1::CHECKPOINT_FAILURE_KIND_ABANDONED, "");
  EXPECT_EQ(FormatCheckpointStatus(status, kNow),
            "none committed; FAILING: step 100 failed 0ms ago (abandoned), 1 attempt failed");
}

TEST(CheckpointFormatTest, ALongOrMultilineReasonStaysOnOneBoundedLine) {
  v1::CheckpointStatus status = CheckpointsFailingJob().checkpoint_status();
  // Appended, not concatenated: g++ 12 warns falsely (array-bounds) about
  // operator+ on a string this long.
  std::string reason(2000, 'x');
  reason.append("\nsecond line: why");
  status.mutable_last_failure()->set_reason(reason);
  const std::string line = FormatCheckpointStatus(status, kNow);
  EXPECT_THAT(line, Not(HasSubstr("\n")));
  EXPECT_THAT(line, HasSubstr("x ... x"));
  EXPECT_THAT(line, HasSubstr("x second line: why), 7 attempts failed"));
  constexpr absl::string_view kBefore =
      "step 1200 committed 3m07s ago; FAILING: step 1400 failed 4.0s ago (storage: ";
  constexpr absl::string_view kAfter = "), 7 attempts failed";
  EXPECT_EQ(line.size(), kBefore.size() + kCheckpointReasonShown + kAfter.size());
  // Between words where it can.
  const std::string a(30, 'a'), b(200, 'b'), c(60, 'c');
  status.mutable_last_failure()->set_reason(absl::StrCat(a, " ", b, " ", c, " end"));
  EXPECT_THAT(FormatCheckpointStatus(status, kNow),
              HasSubstr(absl::StrCat("(storage: ", a, " ... ", c, " end), 7 attempts failed")));
}

TEST(CheckpointFormatTest, WatchPrintsCheckpointEventsAndKeepsFailuresAboveTheBar) {
  v1::JobEvent event;
  event.set_kind(v1::JOB_EVENT_KIND_CHECKPOINT);
  *event.mutable_job() = CheckpointsFailingJob();
  event.mutable_job()->mutable_checkpoint_status()->mutable_last_failure()->set_reason(
      "IO error: No space left on device");
  *event.mutable_time() = ToProtoTime(kNow);
  EXPECT_EQ(FormatEventLine(event),
            "2023-11-14T22:23:20.000Z CHECKPOINT job=j-7f3a step 1200 committed 3m07s ago; "
            "FAILING: step 1400 failed 4.0s ago (storage: IO error: No space left on device), 7 "
            "attempts failed");

  // On a terminal: a new failure keeps its line, and so does the first commit
  // after failures; a routine commit only redraws the bar.
  v1::Job before = event.job();
  before.mutable_checkpoint_status()->set_failed_attempts(6);
  EXPECT_TRUE(KeepsALine(event, &before));
  EXPECT_TRUE(KeepsALine(event, nullptr)) << "failing when watch starts";
  v1::JobEvent commit = event;
  *commit.mutable_job()->mutable_checkpoint_status()->mutable_last_commit() = CommitAt(1500, kNow);
  EXPECT_TRUE(KeepsALine(commit, &event.job()));
  v1::JobEvent routine = commit;
  *routine.mutable_job()->mutable_checkpoint_status()->mutable_last_commit() =
      CommitAt(1600, kNow + absl::Minutes(1));
  EXPECT_FALSE(KeepsALine(routine, &commit.job()));
  EXPECT_FALSE(KeepsALine(routine, nullptr));
  // The other kinds as before.
  v1::JobEvent other = event;
  for (v1::JobEventKind kind : {v1::JOB_EVENT_KIND_STATE_CHANGED, v1::JOB_EVENT_KIND_MESH_CHANGED,
                                v1::JOB_EVENT_KIND_RECOVERED}) {
    other.set_kind(kind);
    EXPECT_TRUE(KeepsALine(other, &before)) << JobEventKindName(kind);
  }
  for (v1::JobEventKind kind : {v1::JOB_EVENT_KIND_PROGRESS, v1::JOB_EVENT_KIND_SNAPSHOT}) {
    other.set_kind(kind);
    EXPECT_FALSE(KeepsALine(other, &before)) << JobEventKindName(kind);
  }
}

TEST(JobFormatTest, DrainedWorker) {
  v1::WorkerInfo worker;
  worker.set_worker_id("w3");
  worker.set_state(v1::WORKER_STATE_DRAINING);
  worker.set_job_id("j-7f3a");
  EXPECT_EQ(FormatDrainedWorker(worker),
            "worker w3: DRAINING (its job j-7f3a is re-planned without it; it exits once its "
            "state is handed over)");
  worker.clear_job_id();
  EXPECT_EQ(FormatDrainedWorker(worker), "worker w3: DRAINING (in no job; it exits now)");
  worker.set_state(v1::WORKER_STATE_IDLE);
  EXPECT_EQ(FormatDrainedWorker(worker), "worker w3: IDLE");
}

TEST(ProgressBarTest, Rates) {
  EXPECT_EQ(FormatRate(0), "0");
  EXPECT_EQ(FormatRate(950), "950");
  EXPECT_EQ(FormatRate(12345), "12.3k");
  EXPECT_EQ(FormatRate(456789), "457k");
  EXPECT_EQ(FormatRate(4.56e6), "4.56M");
  EXPECT_EQ(FormatRate(-1), "-");
}

TEST(ProgressBarTest, RendersBarStepLossRateStateAndGeneration) {
  const std::string bar = RenderProgressBar(RunningJob(), 120);
  // 60% of a 40-cell bar is 24 cells; no trailing blanks after the state.
  EXPECT_EQ(bar,
            "[########################................] 120/200  60%  loss  "
            "3.2105  12.3k tok/s  gen 3  RUNNING");
}

TEST(ProgressBarTest, BarKeepsItsPlaceAsNumbersChange) {
  v1::Job job = RunningJob();
  const size_t text_start = RenderProgressBar(job, 100).find(']');
  job.mutable_progress()->set_step(7);
  job.mutable_progress()->set_loss(10.5);
  job.mutable_progress()->set_tokens_per_second(3);
  job.set_state(v1::JOB_STATE_RECONFIGURING);
  job.set_generation(4);
  EXPECT_EQ(RenderProgressBar(job, 100).find(']'), text_start);
}

TEST(ProgressBarTest, NarrowTerminalsShrinkThenDropTheBar) {
  const v1::Job job = RunningJob();
  for (int width : {80, 70, 60, 40, 10}) {
    const std::string bar = RenderProgressBar(job, width);
    EXPECT_LE(static_cast<int>(bar.size()), width - 1) << width;
  }
  EXPECT_THAT(RenderProgressBar(job, 80), StartsWith("[#########......]"));
  EXPECT_THAT(RenderProgressBar(job, 70), StartsWith("[###..] 120/200"));
  EXPECT_THAT(RenderProgressBar(job, 60), StartsWith("120/200  60%"));
}

// Terminal columns of UTF-8 text whose characters are each one column wide.
int Columns(const std::string& text) {
  int columns = 0;
  for (unsigned char c : text) columns += (c & 0xC0) != 0x80 ? 1 : 0;
  return columns;
}

TEST(ProgressBarTest, SparklineChartsTheRecentLossLowestToHighest) {
  LossSparkline spark;
  EXPECT_EQ(spark.Render(8), "");  // nothing to chart yet
  spark.Add(1, 4.0);
  EXPECT_EQ(spark.Render(8), "");  // one point is no line
  spark.Add(2, 3.0);
  spark.Add(2, 9.0);  // a repeated step is ignored
  spark.Add(3, 2.0);
  spark.Add(1, 9.0);  // so is an older one (a recovery redoing steps)
  spark.Add(4, 1.0);
  // 4, 3, 2, 1 over [1, 4]: levels 7, 5, 2, 0.
  EXPECT_EQ(spark.Render(8), "\u2588\u2586\u2583\u2581");
  EXPECT_EQ(spark.Render(2), "\u2588\u2581");  // the newest two, rescaled: 2, 1
  for (int step = 5; step < 200; ++step) spark.Add(step, 1.0);
  EXPECT_EQ(spark.size(), LossSparkline::kKeep);
  EXPECT_EQ(spark.Render(3), "\u2581\u2581\u2581");  // flat: the lowest block
}

TEST(ProgressBarTest, RedrawWithASparklineStaysWithinTheWidth) {
  const v1::Job job = RunningJob();
  LossSparkline spark;
  for (int step = 1; step <= 30; ++step) spark.Add(step, 5.0 / step);
  for (int width : {100, 120, 160}) {
    const std::string line = RedrawProgressBar(job, width, &spark);
    ASSERT_THAT(line, StartsWith("\r"));
    ASSERT_THAT(line, ::testing::EndsWith("\x1b[K"));
    const std::string shown = line.substr(1, line.size() - 1 - 3);
    EXPECT_LE(Columns(shown), width - 1) << width;
    EXPECT_THAT(shown, HasSubstr(spark.Render(kSparklineCells))) << width;
  }
  // Too narrow for both: the bar alone.
  EXPECT_EQ(RedrawProgressBar(job, 80, &spark), RedrawProgressBar(job, 80));
}

TEST(ProgressBarTest, EdgesOfTheRange) {
  v1::Job job = RunningJob();
  job.mutable_progress()->set_step(0);
  EXPECT_THAT(RenderProgressBar(job, 120),
              StartsWith("[........................................]   0/200   "
                         "0%  loss       -"));
  job.mutable_progress()->set_step(250);  // past the end: clamps to full
  EXPECT_THAT(RenderProgressBar(job, 120),
              StartsWith("[########################################] 250/200 "
                         "100%"));
  job.mutable_spec()->set_steps(0);  // no division by zero
  EXPECT_THAT(RenderProgressBar(job, 120), HasSubstr("   0%"));
}

TEST(ProgressBarTest, RedrawOverwritesTheLine) {
  const std::string redraw = RedrawProgressBar(RunningJob(), 100);
  EXPECT_THAT(redraw, StartsWith("\r["));
  EXPECT_EQ(redraw.substr(redraw.size() - 3), "\x1b[K");
}

TEST(ProgressBarTest, EventLine) {
  v1::JobEvent event;
  event.set_kind(v1::JOB_EVENT_KIND_PROGRESS);
  *event.mutable_job() = RunningJob();
  event.mutable_job()->set_message("say \"hi\"\nnow");
  *event.mutable_time() = ToProtoTime(absl::FromUnixMillis(1'700'000'000'250));
  EXPECT_EQ(FormatEventLine(event),
            "2023-11-14T22:13:20.250Z PROGRESS job=j-7f3a state=RUNNING gen=3 "
            "step=120/200 loss=3.2105 tok/s=12345 mesh=2x2x1 workers=4 "
            "message=\"say \\\"hi\\\" now\"");
  event.clear_time();
  event.mutable_job()->clear_message();
  EXPECT_THAT(FormatEventLine(event), StartsWith("- PROGRESS job=j-7f3a"));
  EXPECT_THAT(FormatEventLine(event), Not(HasSubstr("message=")));
}

TEST(ProgressBarTest, FinalLine) {
  v1::Job job = RunningJob();
  job.set_state(v1::JOB_STATE_COMPLETED);
  job.clear_message();
  job.mutable_progress()->set_step(200);
  EXPECT_EQ(FormatFinalLine(job), "job j-7f3a COMPLETED at step 200/200");
  job.set_state(v1::JOB_STATE_FAILED);
  job.set_message("worker w2 lost and no checkpoint");
  EXPECT_EQ(FormatFinalLine(job),
            "job j-7f3a FAILED at step 200/200: worker w2 lost and no "
            "checkpoint");
}

}  // namespace
}  // namespace cohort::cohortctl
