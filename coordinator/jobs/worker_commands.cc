#include "coordinator/jobs/worker_commands.h"

#include "common/log.h"

namespace cohort::coordinator::commands {

namespace {

v1::Reconfigure* NewReconfigure(const JobId& job, Generation generation, const v1::Mesh& mesh,
                                const v1::RecoveryPlan& plan, const std::string& reason,
                                v1::CoordinatorMessage* message) {
  v1::Reconfigure* reconfigure = message->mutable_reconfigure();
  reconfigure->set_job_id(job.value());
  reconfigure->set_generation(generation.value());
  *reconfigure->mutable_mesh() = mesh;
  *reconfigure->mutable_recovery() = plan;
  reconfigure->set_reason(reason);
  return reconfigure;
}

}  // namespace

v1::CoordinatorMessage Reconfigure(const JobId& job, Generation generation, const v1::Mesh& mesh,
                                   const v1::RecoveryPlan& plan, const v1::JobSpec& spec,
                                   const std::string& reason) {
  v1::CoordinatorMessage message;
  v1::Reconfigure* reconfigure = NewReconfigure(job, generation, mesh, plan, reason, &message);
  reconfigure->set_role(v1::RECONFIGURE_ROLE_MEMBER);
  *reconfigure->mutable_spec() = spec;
  return message;
}

v1::CoordinatorMessage DonorReconfigure(const JobId& job, Generation generation,
                                        const v1::Mesh& mesh, const v1::RecoveryPlan& plan,
                                        const std::string& reason) {
  v1::CoordinatorMessage message;
  NewReconfigure(job, generation, mesh, plan, reason, &message)
      ->set_role(v1::RECONFIGURE_ROLE_DONOR);
  return message;
}

v1::CoordinatorMessage Assign(const JobId& job, Generation generation, const v1::Mesh& mesh,
                              const v1::RecoveryPlan& plan, const v1::JobSpec& spec) {
  v1::CoordinatorMessage message;
  v1::Assign* assign = message.mutable_assign();
  assign->set_job_id(job.value());
  assign->set_generation(generation.value());
  *assign->mutable_spec() = spec;
  *assign->mutable_mesh() = mesh;
  *assign->mutable_recovery() = plan;
  return message;
}

v1::CoordinatorMessage MemberCoordinates(v1::CoordinatorMessage::KindCase kind,
                                         const v1::MeshCoordinates& coordinates) {
  v1::CoordinatorMessage message;
  switch (kind) {
    case v1::CoordinatorMessage::kReconfigure:
      *message.mutable_reconfigure()->mutable_coordinates() = coordinates;
      break;
    case v1::CoordinatorMessage::kAssign:
      *message.mutable_assign()->mutable_coordinates() = coordinates;
      break;
    default:
      LOG(FATAL) << "coordinates go with an Assign or a Reconfigure, not kind " << kind;
  }
  return message;
}

v1::CoordinatorMessage Suspend(const JobId& job, Generation generation,
                               const std::string& reason) {
  v1::CoordinatorMessage message;
  v1::Suspend* suspend = message.mutable_suspend();
  suspend->set_job_id(job.value());
  suspend->set_generation(generation.value());
  suspend->set_reason(reason);
  return message;
}

v1::CoordinatorMessage Stop(const JobId& job, Generation generation, const std::string& reason) {
  v1::CoordinatorMessage message;
  v1::Stop* stop = message.mutable_stop();
  stop->set_job_id(job.value());
  stop->set_generation(generation.value());
  stop->set_reason(reason);
  return message;
}

v1::CoordinatorMessage Drain(const std::string& reason) {
  v1::CoordinatorMessage message;
  message.mutable_drain()->set_reason(reason);
  return message;
}

}  // namespace cohort::coordinator::commands
