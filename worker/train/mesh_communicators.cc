#include "worker/train/mesh_communicators.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/layout/mesh_layout.h"
#include "common/layout/mesh_proto.h"
#include "common/status_macros.h"

namespace cohort::train {

void MeshCommunicators::Abort(const absl::Status& reason) {
  for (comm::Communicator* group : {data.get(), static_cast<comm::Communicator*>(tensor.get()),
                                    static_cast<comm::Communicator*>(pipeline.get())}) {
    if (group != nullptr) group->Abort(reason);
  }
}

absl::StatusOr<MeshCommunicators> CreateMeshCommunicators(
    comm::UcxContext* context, const comm::UcxContextOptions& bootstrap,
    const comm::MeshGroups& groups, comm::CollectiveAlgorithm data_algorithm) {
  MeshCommunicators out;
  if (groups.data.size() > 1) {
    const int index = groups.data.communicator_id & (comm::kMaxGroupsPerAxis - 1);
    ASSIGN_OR_RETURN(
        out.data,
        comm::HierarchicalCommunicator::Create(
            context, {.comm_id = groups.data.communicator_id, .group = groups.data.ranks},
            comm::MeshCommunicatorId(comm::MeshAxis::kDataLocal, index),
            comm::MeshCommunicatorId(comm::MeshAxis::kDataLane, index), data_algorithm, bootstrap));
  }
  for (auto [group, slot] : {std::pair{&groups.tensor, &out.tensor},
                             std::pair{&groups.pipeline, &out.pipeline}}) {
    if (group->size() <= 1) continue;
    comm::UcxCommunicatorOptions options;
    options.comm_id = group->communicator_id;
    options.group = group->ranks;
    ASSIGN_OR_RETURN(*slot, comm::UcxCommunicator::Create(context, options));
  }
  return out;
}

model::ModelLayout LayoutOf(const v1::Mesh& mesh, const v1::MeshCoordinates& self) {
  return model::ModelLayout::Of(layout::ShapeOf(mesh), layout::CoordsOf(self));
}

v1::Mesh LocalMesh(int dp, int tp, int pp, int micro_batches) {
  v1::Mesh mesh;
  mesh.set_data_parallel(dp);
  mesh.set_tensor_parallel(tp);
  mesh.set_pipeline_parallel(pp);
  for (const int share : layout::MicroBatchShares(micro_batches, dp)) mesh.add_micro_batches(share);
  const layout::MeshShape shape{dp, tp, pp};
  for (int r = 0; r < shape.world(); ++r) {
    v1::MeshMember* member = mesh.add_members();
    member->set_worker_id(absl::StrCat("rank-", r));
    layout::SetCoordinates(shape, layout::CoordsOf(shape, r), member->mutable_coordinates());
  }
  return mesh;
}

}  // namespace cohort::train
