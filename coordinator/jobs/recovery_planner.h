#pragma once
// PlanRecovery: how the next generation of a job gets its training state.
// Pure logic (docs/conventions.md, Pure core): inputs in, plan out.
//
// The state of a generation is cut into pieces the way a checkpoint is
// (worker/checkpoint/shard_plan.h): piece r is what source rank r owns, the
// DataShardRange of its (tensor rank, stage) shard. Its weights live on every
// data-parallel replica of that shard; its AdamW moments on every replica
// without ZeRO-1, and with ZeRO-1 on its owner and the owner's
// optimizer_replicas - 1 mirrors (the next data ranks along the source
// mesh's copy ring, which puts them on other hosts: layout::CopyRingsOf).
//
// Survivors report the steps they hold. Every rank keeps its state at its
// newest consistent step and the one before, and no rank completes a step
// until every rank has completed the previous one, so the holders' newest
// steps differ by at most one and all of them hold the smallest, t. When
// some completed t + 1 (a fault during a step's collectives: a ring
// all-reduce ends on some ranks before others), the plan resumes at t + 1 if
// those ranks hold every piece of it (without ZeRO-1 any one data replica of
// each shard holds its whole state), else at t. The plan:
//
//   PEER        every piece has a surviving holder: each piece's source (its
//               owner where possible, else a replica or mirror, rotated so
//               receivers pull from several sources at once), resume at that
//               step. Steps some rank completed beyond it (a reported step,
//               or t + 1 when only part of it survives) count as lost: they
//               are computed again. Survivors outside the new mesh that serve
//               a piece become donors.
//   CHECKPOINT  some piece has no holder, or nobody holds state: the newest
//               committed checkpoint; the steps after it are lost.
//   NONE        no state and no checkpoint: a fresh start (step 0, or the
//               job's resume_from checkpoint, which the workers load).
//
// Thread-safety: pure function.

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "cohort/v1/job.pb.h"
#include "common/ids.h"

namespace cohort::coordinator {

// The generation whose layout the held state is in.
struct StateSource {
  Generation generation;
  v1::Mesh mesh;  // all its members, with their coordinates
  bool zero1 = false;
  int optimizer_replicas = 1;
};

struct RecoveryInput {
  std::optional<StateSource> source;
  // Survivors holding state in the source's layout: worker id -> newest step.
  std::map<std::string, int64_t> holders;
  v1::Mesh next_mesh;  // the new generation's
  std::optional<int64_t> checkpoint_step;  // the job's newest committed checkpoint
  // The newest step any rank of the job reported completing since the last
  // recovery (heartbeats, statuses), for lost steps.
  int64_t reported_step = 0;
};

v1::RecoveryPlan PlanRecovery(const RecoveryInput& input);

// Whether a peer recovery keeps the layout and brings in new workers: a
// spare took a lost worker's place (for metrics).
bool IsSpareReplacement(const v1::RecoveryPlan& plan, const v1::Mesh& source,
                        const v1::Mesh& next);

}  // namespace cohort::coordinator
