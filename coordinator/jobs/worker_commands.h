#pragma once
// The commands the coordinator sends workers on their Attach streams
// (cohort.v1.CoordinatorMessage; proto/README.md says what each means), each
// built here and nowhere else. A command to every member of a generation is
// built once without coordinates and completed per member
// (Effects::Message::base), so its large common part (spec, mesh, plan) is
// shared. Pure functions, thread-safe.

#include <string>

#include "cohort/v1/job.pb.h"
#include "cohort/v1/workers.pb.h"
#include "common/ids.h"

namespace cohort::coordinator::commands {

// Generation `generation` of a job, for a worker already in it: its place in
// `mesh` and where its state comes from (`plan`). Carries the spec too, so a
// worker whose Assign of an earlier generation never arrived can join from
// this command alone. Without coordinates: add MemberCoordinates.
v1::CoordinatorMessage Reconfigure(const JobId& job, Generation generation, const v1::Mesh& mesh,
                                   const v1::RecoveryPlan& plan, const v1::JobSpec& spec,
                                   const std::string& reason);
// Generation `generation` for a worker left out of `mesh` that serves its
// state to it (it reports DONATED when done).
v1::CoordinatorMessage DonorReconfigure(const JobId& job, Generation generation,
                                        const v1::Mesh& mesh, const v1::RecoveryPlan& plan,
                                        const std::string& reason);
// Generation `generation` for a worker joining the job. Without coordinates:
// add MemberCoordinates.
v1::CoordinatorMessage Assign(const JobId& job, Generation generation, const v1::Mesh& mesh,
                              const v1::RecoveryPlan& plan, const v1::JobSpec& spec);
// The per-member part of a Reconfigure or Assign built above: `kind` is the
// command's (kReconfigure or kAssign).
v1::CoordinatorMessage MemberCoordinates(v1::CoordinatorMessage::KindCase kind,
                                         const v1::MeshCoordinates& coordinates);
// Stop training generation `generation` and answer with the states held.
v1::CoordinatorMessage Suspend(const JobId& job, Generation generation, const std::string& reason);
// Leave the job (generation `generation` or older), dropping its state.
v1::CoordinatorMessage Stop(const JobId& job, Generation generation, const std::string& reason);
// Leave the cluster: the worker exits.
v1::CoordinatorMessage Drain(const std::string& reason);

}  // namespace cohort::coordinator::commands
