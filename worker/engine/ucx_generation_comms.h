#pragma once
// The generation's communicators over UCX (EngineTrainer's default
// CommsFactory): one UCX context over the generation's participants,
// bootstrapped through a KeyValue scope of (job, generation), then one
// communicator per mesh axis group of more than one rank and, for a peer
// recovery, one over every participant.

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "worker/comm/hierarchical_communicator.h"
#include "worker/comm/kv_client.h"
#include "worker/engine/generation_comms.h"

namespace cohort::worker {

// `kv` reaches the generation's KeyValue scope; the bootstrap waits for every
// participant's address for at most `bootstrap_timeout` and gives up soon
// after request.cancelled is set (Cancelled). `net_devices`: UCX's network
// interfaces across hosts (UcxContextOptions::net_devices; "": UCX's choice);
// `data_algorithm`: how the data group's collectives run across hosts.
absl::StatusOr<std::unique_ptr<GenerationComms>> CreateUcxGenerationComms(
    const CommsRequest& request, std::unique_ptr<comm::KvClient> kv,
    absl::Duration bootstrap_timeout, const std::string& net_devices = "",
    comm::CollectiveAlgorithm data_algorithm = comm::CollectiveAlgorithm::kAuto);

}  // namespace cohort::worker
