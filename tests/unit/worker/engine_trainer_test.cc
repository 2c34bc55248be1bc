// EngineTrainer end to end in one process: several trainers as threads,
// their generations' communicators in-process (tests/testing/thread_comms.h)
// instead of UCX, checkpoints absent. Building a generation, the restore from
// peers' memory (with a donor) and the training loop run as in a worker; the
// losses are compared with one TrainingSession running the same job.

#include <cmath>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/job_spec/validator.h"
#include "coordinator/jobs/recovery_planner.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/engine_runs.h"
#include "tests/testing/fake_checkpoint_client.h"
#include "tests/testing/job_specs.h"
#include "tests/testing/reference_losses.h"
#include "tests/testing/thread_comms.h"
#include "tests/testing/wait.h"
#include "worker/comm/tracked_communicator.h"
#include "worker/engine/engine_trainer.h"
#include "worker/train/mesh_communicators.h"
#include "worker/train/training_config.h"
#include "worker/train/training_session.h"

namespace cohort::worker {
namespace {

using testing::kSmallJobMicroBatches;  // the meshes below are planned for SmallJobSpec

using testing::ReferenceLosses;
using testing::Together;
using testing::WaitUntil;
// The tiny model steps fast: poll often enough to catch a given step.
constexpr absl::Duration kPoll = absl::Milliseconds(1);

constexpr absl::Duration kWait = absl::Seconds(60);

class EngineTrainerTest : public ::testing::Test {
 protected:
  // The job: the small test model, `steps` steps, ZeRO-1 with `replicas`
  // copies of each moment shard (with one, a rank that leaves must donate
  // its shard; with two, a lost rank's survives on its neighbour).
  static v1::JobSpec Spec(int64_t steps, int replicas = 1) {
    v1::JobSpec spec = testing::SmallJobSpec("threads", 1, 1, 3);
    spec.set_steps(steps);
    spec.mutable_parallelism()->set_zero1(true);
    spec.mutable_elastic()->set_optimizer_replicas(replicas);
    absl::StatusOr<v1::JobSpec> normalized = NormalizeJobSpec(spec);
    EXPECT_TRUE(normalized.ok()) << normalized.status();
    return normalized.ok() ? *normalized : spec;
  }

  std::unique_ptr<EngineTrainer> NewTrainer(worker::CommsFactory comms = nullptr,
                                            uint64_t warm_memory_bytes = 0) {
    EngineTrainerOptions options;
    options.warm_memory_bytes = warm_memory_bytes;
    options.num_threads = 1;
    options.collective_timeout = absl::Seconds(20);
    options.comms_factory = comms ? std::move(comms) : mesh_.Factory();
    // No checkpoint anywhere: a generation without a peer plan starts fresh.
    options.checkpoint_factory = [] {
      return std::make_unique<testing::RecordingCheckpointClient>();
    };
    options.on_finished = [this](const JobId&, Generation generation, const absl::Status& s) {
      absl::MutexLock lock(&mu_);
      finished_.push_back({generation, s});
    };
    options.on_first_step = [this](const JobId&, Generation generation) {
      absl::MutexLock lock(&mu_);
      first_steps_.push_back(generation);
    };
    return std::make_unique<EngineTrainer>(std::move(options));
  }

  // Member `rank` of `mesh` at `generation`, restoring by `plan`.
  static Assignment Member(const v1::JobSpec& spec, uint64_t generation, const v1::Mesh& mesh,
                           int rank, const v1::RecoveryPlan& plan) {
    Assignment a;
    a.job_id = JobId("threads-1");
    a.generation = Generation(generation);
    a.spec = spec;
    a.mesh = mesh;
    a.coordinates = mesh.members(rank).coordinates();
    a.recovery = plan;
    a.participant = rank;
    return a;
  }

  // Waits until `n` runs of `generation` have finished; their statuses.
  std::vector<absl::Status> WaitFinished(uint64_t generation, size_t n) {
    absl::MutexLock lock(&mu_);
    auto count = [&] {
      size_t c = 0;
      for (const auto& [g, s] : finished_) c += g == Generation(generation);
      return c;
    };
    auto enough = [&] { return count() >= n; };
    EXPECT_TRUE(mu_.AwaitWithTimeout(absl::Condition(&enough), kWait))
        << "generation " << generation << ": " << count() << " of " << n << " runs finished";
    std::vector<absl::Status> out;
    for (const auto& [g, s] : finished_) {
      if (g == Generation(generation)) out.push_back(s);
    }
    return out;
  }

  // Trains `spec` with two fresh members from step 0 to the end, as
  // generation `generation`; the final loss.
  double FaultFreeLoss(const v1::JobSpec& spec, uint64_t generation) {
    const v1::Mesh mesh = train::LocalMesh(2, 1, 1, kSmallJobMicroBatches);
    v1::RecoveryPlan fresh;
    fresh.set_kind(v1::RECOVERY_KIND_NONE);
    std::unique_ptr<EngineTrainer> a = NewTrainer(), b = NewTrainer();
    for (const absl::Status& s :
         Together({[&] { return a->Prepare(Member(spec, generation, mesh, 0, fresh)); },
                   [&] { return b->Prepare(Member(spec, generation, mesh, 1, fresh)); }})) {
      EXPECT_TRUE(s.ok()) << s;
    }
    for (const absl::Status& s : WaitFinished(generation, 2)) EXPECT_TRUE(s.ok()) << s;
    return a->progress().loss.value_or(NAN);
  }

  // Waits until `t` has completed `step` steps.
  static void WaitForStep(EngineTrainer& t, int64_t step) {
    WaitUntil([&] { return t.progress().step >= Step(step); }, kWait, kPoll);
    ASSERT_GE(t.progress().step, Step(step));
  }

  // Generation 1 of `spec` on a two-member mesh, `a` at rank 0; some steps
  // in, rank 1 is lost (its state with it) and `a` suspends. What `a` holds.
  std::vector<v1::HeldState> TrainThenLoseRankOne(const v1::JobSpec& spec, EngineTrainer& a) {
    const v1::Mesh two = train::LocalMesh(2, 1, 1, kSmallJobMicroBatches);
    v1::RecoveryPlan fresh;
    fresh.set_kind(v1::RECOVERY_KIND_NONE);
    std::unique_ptr<EngineTrainer> b = NewTrainer();
    for (const absl::Status& s :
         Together({[&] { return a.Prepare(Member(spec, 1, two, 0, fresh)); },
                   [&] { return b->Prepare(Member(spec, 1, two, 1, fresh)); }})) {
      EXPECT_TRUE(s.ok()) << s;
    }
    WaitForStep(a, 5);
    std::vector<v1::HeldState> held;
    Together({[&] {
                held = a.Suspend();
                return absl::OkStatus();
              },
              [&] {
                b->Stop();
                return absl::OkStatus();
              }});
    return held;
  }

  // Suspends `trainers` at once; what each holds (its newest step first).
  static std::vector<int64_t> SuspendAll(const std::vector<EngineTrainer*>& trainers) {
    std::vector<int64_t> newest(trainers.size(), -1);
    std::vector<std::function<absl::Status()>> calls;
    for (size_t i = 0; i < trainers.size(); ++i) {
      calls.push_back([&, i] {
        const std::vector<v1::HeldState> held = trainers[i]->Suspend();
        if (held.empty()) return absl::NotFoundError("holds nothing");
        newest[i] = held[0].step();
        return absl::OkStatus();
      });
    }
    for (const absl::Status& s : Together(std::move(calls))) EXPECT_TRUE(s.ok()) << s;
    return newest;
  }

  // The peer plan from generation `source` (its mesh `from`; the workers
  // "rank-i" of `newest` holding step newest[i]) into `next`.
  static v1::RecoveryPlan PeerPlan(uint64_t source, const v1::Mesh& from,
                                   const std::vector<int64_t>& newest, const v1::Mesh& next,
                                   int replicas) {
    coordinator::RecoveryInput input;
    input.source = coordinator::StateSource{Generation(source), from, true, replicas};
    for (size_t i = 0; i < newest.size(); ++i) {
      input.holders[absl::StrCat("rank-", i)] = newest[i];
    }
    input.next_mesh = next;
    return coordinator::PlanRecovery(input);
  }

  // Waits until `t`'s warm spare state is `state`.
  static v1::WarmSpare WaitWarm(EngineTrainer& t, v1::WarmSpareState state) {
    WaitUntil([&] { return t.warm_status().state() == state; }, kWait, kPoll);
    EXPECT_EQ(t.warm_status().state(), state) << t.warm_status().message();
    return t.warm_status();
  }

  // The plan that puts a spare (worker "spare") in rank 1's place of the
  // two-member generation 1, from rank 0's memory at `step`.
  static v1::RecoveryPlan SparePlan(int64_t step) {
    const v1::Mesh two = train::LocalMesh(2, 1, 1, kSmallJobMicroBatches);
    coordinator::RecoveryInput input;
    input.source = coordinator::StateSource{Generation(1), two, true, 2};
    input.holders = {{"rank-0", step}};
    input.next_mesh = WithWorker(two, 1, "spare");
    return coordinator::PlanRecovery(input);
  }

  // `mesh` with worker `id` at rank `rank` (a spare in a lost worker's place).
  static v1::Mesh WithWorker(v1::Mesh mesh, int rank, const std::string& id) {
    mesh.mutable_members(rank)->set_worker_id(id);
    return mesh;
  }

  testing::ThreadMesh mesh_;
  absl::Mutex mu_;
  std::vector<std::pair<Generation, absl::Status>> finished_ ABSL_GUARDED_BY(mu_);
  // Generations whose first step a trainer reported (on_first_step).
  std::vector<Generation> first_steps_ ABSL_GUARDED_BY(mu_);
};

TEST_F(EngineTrainerTest, TwoDataParallelMembersTrainTheJobOfOneProcess) {
  const v1::JobSpec spec = Spec(8);
  const std::vector<double> reference = ReferenceLosses(spec);
  const v1::Mesh mesh = train::LocalMesh(2, 1, 1, kSmallJobMicroBatches);
  v1::RecoveryPlan fresh;
  fresh.set_kind(v1::RECOVERY_KIND_NONE);
  std::unique_ptr<EngineTrainer> a = NewTrainer(), b = NewTrainer();
  for (const absl::Status& s :
       Together({[&] { return a->Prepare(Member(spec, 1, mesh, 0, fresh)); },
                 [&] { return b->Prepare(Member(spec, 1, mesh, 1, fresh)); }})) {
    ASSERT_TRUE(s.ok()) << s;
  }
  for (const absl::Status& s : WaitFinished(1, 2)) EXPECT_TRUE(s.ok()) << s;
  for (EngineTrainer* t : {a.get(), b.get()}) {
    const TrainingProgress p = t->progress();
    EXPECT_EQ(p.step, Step(8));
    ASSERT_TRUE(p.loss.has_value());
    // The same math up to the order of float sums (dp 2 vs 1).
    EXPECT_NEAR(*p.loss, reference.back(), 1e-5);
  }
  EXPECT_EQ(*a->progress().loss, *b->progress().loss);  // one all-reduced loss
  {
    // Each member reported its first step once, of 8.
    absl::MutexLock lock(&mu_);
    EXPECT_EQ(first_steps_, std::vector<Generation>({Generation(1), Generation(1)}));
  }
  // Where the Prepare's time went, as sent with READY: both parts measured,
  // nothing received on a fresh start.
  EXPECT_GT(a->last_prepare().build_seconds(), 0);
  EXPECT_GT(a->last_prepare().restore_seconds(), 0);
  EXPECT_EQ(a->last_prepare().restore_bytes(), 0u);
}

TEST_F(EngineTrainerTest, ASurvivorGoesOnFromMemoryWithTheLeaversShardDonated) {
  const int64_t steps = 40;
  const v1::JobSpec spec = Spec(steps);
  const std::vector<double> reference = ReferenceLosses(spec);
  const v1::Mesh two = train::LocalMesh(2, 1, 1, kSmallJobMicroBatches);
  v1::RecoveryPlan fresh;
  fresh.set_kind(v1::RECOVERY_KIND_NONE);
  std::unique_ptr<EngineTrainer> a = NewTrainer(), b = NewTrainer();
  for (const absl::Status& s :
       Together({[&] { return a->Prepare(Member(spec, 1, two, 0, fresh)); },
                 [&] { return b->Prepare(Member(spec, 1, two, 1, fresh)); }})) {
    ASSERT_TRUE(s.ok()) << s;
  }
  // Some steps in, both suspend (as on a re-plan that drops rank 1).
  WaitUntil([&] { return a->progress().step >= Step(5); }, kWait, kPoll);
  ASSERT_GE(a->progress().step, Step(5));
  std::vector<v1::HeldState> held_a, held_b;
  Together({[&] {
              held_a = a->Suspend();
              return absl::OkStatus();
            },
            [&] {
              held_b = b->Suspend();
              return absl::OkStatus();
            }});
  ASSERT_EQ(held_a.size(), 1u);
  ASSERT_EQ(held_b.size(), 1u);

  // Generation 2: rank-0 alone; rank-1 holds the only copy of its moment
  // shard, so the plan makes it a donor.
  coordinator::RecoveryInput input;
  input.source = coordinator::StateSource{Generation(1), two, true, 1};
  input.holders = {{"rank-0", held_a[0].step()}, {"rank-1", held_b[0].step()}};
  const v1::Mesh one = train::LocalMesh(1, 1, 1, kSmallJobMicroBatches);
  input.next_mesh = one;
  const v1::RecoveryPlan plan = coordinator::PlanRecovery(input);
  ASSERT_EQ(plan.kind(), v1::RECOVERY_KIND_PEER) << plan.reason();
  ASSERT_EQ(plan.donors_size(), 1);
  ASSERT_EQ(plan.donors(0).worker_id(), "rank-1");
  Assignment donor = Member(spec, 2, one, 0, plan);
  donor.donor = true;
  donor.participant = 1;  // the mesh's size, then its index among the donors
  for (const absl::Status& s : Together({[&] { return a->Prepare(Member(spec, 2, one, 0, plan)); },
                                         [&] { return b->Donate(donor); }})) {
    ASSERT_TRUE(s.ok()) << s;
  }
  for (const absl::Status& s : WaitFinished(2, 1)) EXPECT_TRUE(s.ok()) << s;
  EXPECT_GT(a->last_prepare().restore_bytes(), 0u);  // the donated moment shard
  const TrainingProgress p = a->progress();
  EXPECT_EQ(p.step, Step(steps));
  ASSERT_TRUE(p.loss.has_value());
  // Resumed at plan.step() with every weight and moment as trained: the
  // trajectory of one process, up to the order of float sums.
  EXPECT_NEAR(*p.loss, reference.back(), 1e-5) << "resumed at step " << plan.step();
}

// A world communicator whose peers are all dead: every point-to-point call
// fails as a transfer to a killed worker does.
class DeadPeersWorld : public comm::TrackedCommunicator {
 public:
  using TrackedCommunicator::TrackedCommunicator;
  absl::Status Send(const void*, size_t, int, uint32_t, absl::Duration) override {
    return absl::UnavailableError("peer died");
  }
  absl::Status Recv(void*, size_t, int, uint32_t, absl::Duration) override {
    return absl::UnavailableError("peer died");
  }
  absl::Status SendRecv(const void*, size_t, int, void*, size_t, int, uint32_t,
                        absl::Duration) override {
    return absl::UnavailableError("peer died");
  }
};

// `inner`'s communicators, but generation `failing`'s state transfers fail.
CommsFactory FailTransfersOf(CommsFactory inner, uint64_t failing) {
  struct Comms : GenerationComms {
    train::TrainingGroups groups() const override { return inner->groups(); }
    comm::Communicator* world() const override { return dead.get(); }
    void Abort(const absl::Status& reason) override { inner->Abort(reason); }
    std::unique_ptr<GenerationComms> inner;
    std::atomic<int> calls{0};
    std::unique_ptr<DeadPeersWorld> dead;
  };
  return [inner = std::move(inner), failing](const CommsRequest& request)
             -> absl::StatusOr<std::unique_ptr<GenerationComms>> {
    absl::StatusOr<std::unique_ptr<GenerationComms>> made = inner(request);
    if (!made.ok() || request.assignment->generation != Generation(failing) ||
        (*made)->world() == nullptr) {
      return made;
    }
    auto comms = std::make_unique<Comms>();
    comms->inner = *std::move(made);
    comms->dead = std::make_unique<DeadPeersWorld>(comms->inner->world(), &comms->calls);
    return std::unique_ptr<GenerationComms>(std::move(comms));
  };
}

TEST_F(EngineTrainerTest, ASurvivorKeepsItsSessionWhenASpareTakesALostRanksPlace) {
  const int64_t steps = 30;
  const v1::JobSpec spec = Spec(steps, /*replicas=*/2);
  const double fault_free = FaultFreeLoss(spec, 9);
  const v1::Mesh two = train::LocalMesh(2, 1, 1, kSmallJobMicroBatches);
  std::unique_ptr<EngineTrainer> a = NewTrainer();
  const std::vector<v1::HeldState> held = TrainThenLoseRankOne(spec, *a);
  ASSERT_EQ(held.size(), 1u);
  const float* weights = a->weights_for_testing();
  ASSERT_NE(weights, nullptr);

  // Generation 2: a spare at rank 1; rank 1's moments come from the
  // survivor's mirror.
  const v1::Mesh next = WithWorker(two, 1, "spare");
  const v1::RecoveryPlan plan = SparePlan(held[0].step());
  ASSERT_EQ(plan.kind(), v1::RECOVERY_KIND_PEER) << plan.reason();
  ASSERT_EQ(plan.donors_size(), 0);
  std::unique_ptr<EngineTrainer> spare = NewTrainer();
  for (const absl::Status& s :
       Together({[&] { return a->Prepare(Member(spec, 2, next, 0, plan)); },
                 [&] { return spare->Prepare(Member(spec, 2, next, 1, plan)); }})) {
    ASSERT_TRUE(s.ok()) << s;
  }
  // The survivor trains on the very buffers it had: nothing was allocated,
  // nothing received. The spare built its session and received its state.
  EXPECT_EQ(a->weights_for_testing(), weights);
  EXPECT_TRUE(a->last_prepare().session_kept());
  EXPECT_EQ(a->last_prepare().restore_bytes(), 0u);
  EXPECT_FALSE(spare->last_prepare().session_kept());
  EXPECT_GT(spare->last_prepare().restore_bytes(), 0u);
  for (const absl::Status& s : WaitFinished(2, 2)) EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(a->weights_for_testing(), weights);
  // The trajectory of the run without the fault, bit for bit.
  ASSERT_TRUE(a->progress().loss.has_value());
  EXPECT_EQ(*a->progress().loss, fault_free) << "resumed at step " << plan.step();
  EXPECT_EQ(*spare->progress().loss, fault_free);
}

TEST_F(EngineTrainerTest, AKeptSessionWhoseRestoreFailsStillHoldsItsStateForTheNextPlan) {
  const int64_t steps = 30;
  const v1::JobSpec spec = Spec(steps, /*replicas=*/2);
  const double fault_free = FaultFreeLoss(spec, 9);
  const v1::Mesh two = train::LocalMesh(2, 1, 1, kSmallJobMicroBatches);
  // Generation 2's transfers fail on both sides (a peer dies during them).
  std::unique_ptr<EngineTrainer> a = NewTrainer(FailTransfersOf(mesh_.Factory(), 2));
  const std::vector<v1::HeldState> held = TrainThenLoseRankOne(spec, *a);
  ASSERT_EQ(held.size(), 1u);
  const float* weights = a->weights_for_testing();
  // The plan resumes one step back, at the survivor's previous version: its
  // kept session rolls back into its current buffers.
  const v1::Mesh next = WithWorker(two, 1, "spare");
  const v1::RecoveryPlan plan = SparePlan(held[0].step() - 1);
  ASSERT_EQ(plan.kind(), v1::RECOVERY_KIND_PEER) << plan.reason();
  ASSERT_EQ(plan.step(), held[0].step() - 1);

  std::unique_ptr<EngineTrainer> spare = NewTrainer(FailTransfersOf(mesh_.Factory(), 2));
  for (const absl::Status& s :
       Together({[&] { return a->Prepare(Member(spec, 2, next, 0, plan)); },
                 [&] { return spare->Prepare(Member(spec, 2, next, 1, plan)); }})) {
    EXPECT_TRUE(absl::IsUnavailable(s)) << s;
  }
  // The session went back to generation 1, still holding the plan's step
  // (its previous version; the current buffers were being overwritten).
  const std::vector<v1::HeldState> kept = a->Suspend();
  ASSERT_EQ(kept.size(), 1u);
  EXPECT_EQ(kept[0].generation(), 1u);
  EXPECT_EQ(kept[0].step(), plan.step());

  // The next plan (generation 3) recovers from it, keeping the session again.
  v1::RecoveryPlan retry = plan;
  for (const absl::Status& s :
       Together({[&] { return a->Prepare(Member(spec, 3, next, 0, retry)); },
                 [&] { return spare->Prepare(Member(spec, 3, next, 1, retry)); }})) {
    ASSERT_TRUE(s.ok()) << s;
  }
  EXPECT_TRUE(a->last_prepare().session_kept());
  EXPECT_EQ(a->weights_for_testing(), weights);
  for (const absl::Status& s : WaitFinished(3, 2)) EXPECT_TRUE(s.ok()) << s;
  ASSERT_TRUE(a->progress().loss.has_value());
  EXPECT_EQ(*a->progress().loss, fault_free);
  EXPECT_EQ(*spare->progress().loss, fault_free);
}

TEST_F(EngineTrainerTest, AWarmSpareTakesThePlaceItPreparedWithTheSessionItBuiltAhead) {
  const int64_t steps = 30;
  const v1::JobSpec spec = Spec(steps, /*replicas=*/2);
  const double fault_free = FaultFreeLoss(spec, 9);
  const v1::Mesh two = train::LocalMesh(2, 1, 1, kSmallJobMicroBatches);
  std::unique_ptr<EngineTrainer> a = NewTrainer();
  // The spare prepares rank 1 of generation 1 while the job trains.
  std::unique_ptr<EngineTrainer> spare = NewTrainer(nullptr, uint64_t{1} << 30);
  v1::RecoveryPlan none;
  Assignment slot = Member(spec, 1, two, 1, none);
  spare->Warm(slot);
  const v1::WarmSpare warm = WaitWarm(*spare, v1::WARM_SPARE_STATE_WARM);
  EXPECT_EQ(warm.job_id(), "threads-1");
  EXPECT_EQ(warm.rank(), 1);
  EXPECT_GT(warm.bytes(), 0u);
  const std::vector<v1::HeldState> held = TrainThenLoseRankOne(spec, *a);
  ASSERT_EQ(held.size(), 1u);

  const v1::Mesh next = WithWorker(two, 1, "spare");
  const v1::RecoveryPlan plan = SparePlan(held[0].step());
  ASSERT_EQ(plan.kind(), v1::RECOVERY_KIND_PEER) << plan.reason();
  // The place of generation 2 has the same shapes: still warm.
  spare->Warm(Member(spec, 2, next, 1, none));
  EXPECT_EQ(spare->warm_status().state(), v1::WARM_SPARE_STATE_WARM);
  EXPECT_EQ(spare->warm_status().generation(), 2u);
  for (const absl::Status& s :
       Together({[&] { return a->Prepare(Member(spec, 2, next, 0, plan)); },
                 [&] { return spare->Prepare(Member(spec, 2, next, 1, plan)); }})) {
    ASSERT_TRUE(s.ok()) << s;
  }
  EXPECT_TRUE(spare->last_prepare().session_warm());
  EXPECT_FALSE(spare->last_prepare().session_kept());
  // Where the time went: communicators and session within the build, the
  // transfer and the mirrors within the restore.
  const v1::PreparePhases phases = spare->last_prepare();
  EXPECT_GT(phases.communicators_seconds(), 0);
  EXPECT_LE(phases.communicators_seconds() + phases.session_seconds(),
            phases.build_seconds() + 1e-9);
  EXPECT_GT(phases.transfer_seconds(), 0);
  EXPECT_GT(phases.mirrors_seconds(), 0);
  EXPECT_NEAR(phases.transfer_seconds() + phases.mirrors_seconds(), phases.restore_seconds(),
              1e-6);
  EXPECT_GT(spare->last_prepare().restore_bytes(), 0u);
  EXPECT_EQ(spare->warm_status().state(), v1::WARM_SPARE_STATE_UNSPECIFIED);
  for (const absl::Status& s : WaitFinished(2, 2)) EXPECT_TRUE(s.ok()) << s;
  ASSERT_TRUE(spare->progress().loss.has_value());
  EXPECT_EQ(*spare->progress().loss, fault_free);
  EXPECT_EQ(*a->progress().loss, fault_free);
}

TEST_F(EngineTrainerTest, AWarmSparePreparedForAnotherDataRankTakesTheLostOnesPlace) {
  // Every data rank of a job without tensor or pipeline parallelism holds
  // the same model shard: a spare warm for rank 1 that has to take rank 0's
  // place builds that place's session around the model it prepared.
  const int64_t steps = 30;
  const v1::JobSpec spec = Spec(steps, /*replicas=*/2);
  const double fault_free = FaultFreeLoss(spec, 9);
  const v1::Mesh two = train::LocalMesh(2, 1, 1, kSmallJobMicroBatches);
  v1::RecoveryPlan fresh;
  fresh.set_kind(v1::RECOVERY_KIND_NONE);
  std::unique_ptr<EngineTrainer> lost = NewTrainer(), b = NewTrainer();
  std::unique_ptr<EngineTrainer> spare = NewTrainer(nullptr, uint64_t{1} << 30);
  spare->Warm(Member(spec, 1, two, 1, fresh));
  WaitWarm(*spare, v1::WARM_SPARE_STATE_WARM);
  for (const absl::Status& s :
       Together({[&] { return lost->Prepare(Member(spec, 1, two, 0, fresh)); },
                 [&] { return b->Prepare(Member(spec, 1, two, 1, fresh)); }})) {
    ASSERT_TRUE(s.ok()) << s;
  }
  WaitForStep(*b, 5);
  std::vector<v1::HeldState> held;
  Together({[&] {
              held = b->Suspend();
              return absl::OkStatus();
            },
            [&] {
              lost->Stop();
              return absl::OkStatus();
            }});
  ASSERT_EQ(held.size(), 1u);

  coordinator::RecoveryInput input;
  input.source = coordinator::StateSource{Generation(1), two, true, 2};
  input.holders = {{"rank-1", held[0].step()}};
  input.next_mesh = WithWorker(two, 0, "spare");
  const v1::RecoveryPlan plan = coordinator::PlanRecovery(input);
  ASSERT_EQ(plan.kind(), v1::RECOVERY_KIND_PEER) << plan.reason();
  for (const absl::Status& s :
       Together({[&] { return spare->Prepare(Member(spec, 2, input.next_mesh, 0, plan)); },
                 [&] { return b->Prepare(Member(spec, 2, input.next_mesh, 1, plan)); }})) {
    ASSERT_TRUE(s.ok()) << s;
  }
  EXPECT_TRUE(spare->last_prepare().session_warm());
  EXPECT_FALSE(spare->last_prepare().session_kept());
  EXPECT_TRUE(b->last_prepare().session_kept());
  for (const absl::Status& s : WaitFinished(2, 2)) EXPECT_TRUE(s.ok()) << s;
  ASSERT_TRUE(spare->progress().loss.has_value());
  EXPECT_EQ(*spare->progress().loss, fault_free) << "resumed at step " << plan.step();
  EXPECT_EQ(*b->progress().loss, fault_free);
}

TEST_F(EngineTrainerTest, AWarmSpareReleasesOrRebuildsWhatItPreparedWhenThePlaceChanges) {
  const v1::JobSpec spec = Spec(8, /*replicas=*/2);
  const v1::Mesh two = train::LocalMesh(2, 1, 1, kSmallJobMicroBatches);
  v1::RecoveryPlan fresh;
  fresh.set_kind(v1::RECOVERY_KIND_NONE);
  std::unique_ptr<EngineTrainer> spare = NewTrainer(nullptr, uint64_t{1} << 30);
  spare->Warm(Member(spec, 1, two, 1, fresh));
  WaitWarm(*spare, v1::WARM_SPARE_STATE_WARM);
  // The job changed its layout (dp 2 -> 1): a new place, built anew.
  const v1::Mesh one = train::LocalMesh(1, 1, 1, kSmallJobMicroBatches);
  spare->Warm(Member(spec, 2, one, 0, fresh));
  WaitUntil(
      [&] {
        const v1::WarmSpare warm = spare->warm_status();
        return warm.rank() == 0 && warm.generation() == 2 &&
               warm.state() == v1::WARM_SPARE_STATE_WARM;
      },
      kWait, kPoll);
  EXPECT_EQ(spare->warm_status().rank(), 0);
  EXPECT_EQ(spare->warm_status().generation(), 2u);
  EXPECT_EQ(spare->warm_status().state(), v1::WARM_SPARE_STATE_WARM);
  // Released: nothing held, nothing reported.
  spare->Warm(Assignment{});
  WaitWarm(*spare, v1::WARM_SPARE_STATE_UNSPECIFIED);

  // A session over the bound is not built; the status says why.
  std::unique_ptr<EngineTrainer> small = NewTrainer(nullptr, 1 << 20);
  small->Warm(Member(spec, 1, two, 1, fresh));
  const v1::WarmSpare cold = WaitWarm(*small, v1::WARM_SPARE_STATE_COLD);
  EXPECT_THAT(cold.message(), ::testing::HasSubstr("--warm_spare_memory"));

  // Prepared for one job, assigned to another: released, then built fresh;
  // the job trains as from scratch.
  spare->Warm(Member(spec, 3, two, 1, fresh));
  WaitWarm(*spare, v1::WARM_SPARE_STATE_WARM);
  v1::JobSpec other = spec;
  other.set_name("other");
  std::unique_ptr<EngineTrainer> b = NewTrainer();
  Assignment first = Member(other, 4, two, 0, fresh), second = Member(other, 4, two, 1, fresh);
  first.job_id = second.job_id = JobId("other-2");
  for (const absl::Status& s : Together({[&] { return b->Prepare(first); },
                                         [&] { return spare->Prepare(second); }})) {
    ASSERT_TRUE(s.ok()) << s;
  }
  EXPECT_FALSE(spare->last_prepare().session_warm());
  EXPECT_EQ(spare->warm_status().state(), v1::WARM_SPARE_STATE_UNSPECIFIED);
  for (const absl::Status& s : WaitFinished(4, 2)) EXPECT_TRUE(s.ok()) << s;
}

TEST_F(EngineTrainerTest, SurvivorsOfDataParallelChangesKeepTheirModelShard) {
  // dp 4 -> 2 -> 4: each time the survivors build a session around the
  // model shard they had (weights in place, the same buffers); only the
  // optimizer range is new. The leavers donate their moment shards.
  const int64_t steps = 40;
  const v1::JobSpec spec = Spec(steps);
  const std::vector<double> reference = ReferenceLosses(spec);
  const v1::Mesh four = train::LocalMesh(4, 1, 1, kSmallJobMicroBatches), two = train::LocalMesh(2, 1, 1, kSmallJobMicroBatches);
  std::vector<std::unique_ptr<EngineTrainer>> t;
  for (int i = 0; i < 4; ++i) t.push_back(NewTrainer());
  v1::RecoveryPlan fresh;
  fresh.set_kind(v1::RECOVERY_KIND_NONE);
  std::vector<std::function<absl::Status()>> start;
  for (int i = 0; i < 4; ++i) {
    start.push_back([&, i] { return t[i]->Prepare(Member(spec, 1, four, i, fresh)); });
  }
  for (const absl::Status& s : Together(std::move(start))) ASSERT_TRUE(s.ok()) << s;
  WaitForStep(*t[0], 4);
  const std::vector<int64_t> first =
      SuspendAll({t[0].get(), t[1].get(), t[2].get(), t[3].get()});
  const float* weights[2] = {t[0]->weights_for_testing(), t[1]->weights_for_testing()};

  // Generation 2: dp 2 on the first two.
  const v1::RecoveryPlan shrink = PeerPlan(1, four, first, two, 1);
  ASSERT_EQ(shrink.kind(), v1::RECOVERY_KIND_PEER) << shrink.reason();
  ASSERT_EQ(shrink.donors_size(), 2);
  std::vector<std::function<absl::Status()>> shrinking;
  for (int i = 0; i < 2; ++i) {
    shrinking.push_back([&, i] { return t[i]->Prepare(Member(spec, 2, two, i, shrink)); });
  }
  for (int d = 0; d < 2; ++d) {
    shrinking.push_back([&, d] {
      Assignment donor = Member(spec, 2, two, 0, shrink);
      donor.donor = true;
      donor.participant = 2 + d;
      const std::string& id = shrink.donors(d).worker_id();
      return t[id == "rank-2" ? 2 : 3]->Donate(donor);
    });
  }
  for (const absl::Status& s : Together(std::move(shrinking))) ASSERT_TRUE(s.ok()) << s;
  for (int i = 0; i < 2; ++i) {
    EXPECT_TRUE(t[i]->last_prepare().model_kept()) << "rank " << i;
    EXPECT_FALSE(t[i]->last_prepare().session_kept()) << "rank " << i;
    EXPECT_EQ(t[i]->weights_for_testing(), weights[i]) << "rank " << i;
    // The donated moments arrive; the weights were in place.
    EXPECT_GT(t[i]->last_prepare().restore_bytes(), 0u) << "rank " << i;
  }
  WaitForStep(*t[0], shrink.step() + 3);
  const std::vector<int64_t> second = SuspendAll({t[0].get(), t[1].get()});

  // Generation 3: dp 4 again, two fresh workers at ranks 2 and 3.
  const v1::RecoveryPlan grow = PeerPlan(2, two, second, four, 1);
  ASSERT_EQ(grow.kind(), v1::RECOVERY_KIND_PEER) << grow.reason();
  t[2] = NewTrainer();
  t[3] = NewTrainer();
  std::vector<std::function<absl::Status()>> growing;
  for (int i = 0; i < 4; ++i) {
    growing.push_back([&, i] { return t[i]->Prepare(Member(spec, 3, four, i, grow)); });
  }
  for (const absl::Status& s : Together(std::move(growing))) ASSERT_TRUE(s.ok()) << s;
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(t[i]->last_prepare().model_kept(), i < 2) << "rank " << i;
  }
  for (int i = 0; i < 2; ++i) EXPECT_EQ(t[i]->weights_for_testing(), weights[i]) << "rank " << i;
  for (const absl::Status& s : WaitFinished(3, 4)) EXPECT_TRUE(s.ok()) << s;
  for (int i = 0; i < 4; ++i) {
    const TrainingProgress p = t[i]->progress();
    EXPECT_EQ(p.step, Step(steps)) << "rank " << i;
    ASSERT_TRUE(p.loss.has_value()) << "rank " << i;
    // The trajectory of one process, up to the order of float sums.
    EXPECT_NEAR(*p.loss, reference.back(), 1e-5) << "rank " << i << "; resumed at steps "
                                                 << shrink.step() << " and " << grow.step();
  }
}

TEST_F(EngineTrainerTest, ATensorParallelChangeBuildsNewModelShardsAndKeepsTheTrajectory) {
  // tp 2 -> 1 (dp 1 -> 2): the shards change shape, so each worker builds
  // a new model (the data pipeline is all that fits) and takes its weights
  // from the two tensor halves its peers and it held.
  const int64_t steps = 30;
  v1::JobSpec split = Spec(steps);
  split.mutable_parallelism()->set_tensor(2);
  split.mutable_elastic()->set_min_workers(2);  // one replica of tp 2
  const v1::JobSpec whole = Spec(steps);
  const std::vector<double> reference = ReferenceLosses(whole);
  const v1::Mesh tensor = train::LocalMesh(1, 2, 1, kSmallJobMicroBatches), data = train::LocalMesh(2, 1, 1, kSmallJobMicroBatches);
  std::unique_ptr<EngineTrainer> a = NewTrainer(), b = NewTrainer();
  const float* weights = nullptr;
  v1::RecoveryPlan fresh;
  fresh.set_kind(v1::RECOVERY_KIND_NONE);
  for (const absl::Status& s :
       Together({[&] { return a->Prepare(Member(split, 1, tensor, 0, fresh)); },
                 [&] { return b->Prepare(Member(split, 1, tensor, 1, fresh)); }})) {
    ASSERT_TRUE(s.ok()) << s;
  }
  WaitForStep(*a, 4);
  const std::vector<int64_t> held = SuspendAll({a.get(), b.get()});
  weights = a->weights_for_testing();

  const v1::RecoveryPlan plan = PeerPlan(1, tensor, held, data, 2);
  ASSERT_EQ(plan.kind(), v1::RECOVERY_KIND_PEER) << plan.reason();
  for (const absl::Status& s :
       Together({[&] { return a->Prepare(Member(whole, 2, data, 0, plan)); },
                 [&] { return b->Prepare(Member(whole, 2, data, 1, plan)); }})) {
    ASSERT_TRUE(s.ok()) << s;
  }
  for (EngineTrainer* x : {a.get(), b.get()}) {
    EXPECT_FALSE(x->last_prepare().model_kept());
    EXPECT_FALSE(x->last_prepare().session_kept());
    EXPECT_GT(x->last_prepare().restore_bytes(), 0u);  // the other tensor half
  }
  EXPECT_NE(a->weights_for_testing(), weights);
  for (const absl::Status& s : WaitFinished(2, 2)) EXPECT_TRUE(s.ok()) << s;
  for (EngineTrainer* x : {a.get(), b.get()}) {
    const TrainingProgress p = x->progress();
    EXPECT_EQ(p.step, Step(steps));
    ASSERT_TRUE(p.loss.has_value());
    // Tensor parallelism sums in another order: the layout tests' bound.
    EXPECT_NEAR(*p.loss, reference.back(), 1e-5 * (1 + steps)) << "resumed at " << plan.step();
  }
}

}  // namespace
}  // namespace cohort::worker
