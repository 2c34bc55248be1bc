#pragma once
// Which network interface carries an address: for telling UCX which
// interface to use (UcxContextOptions::net_devices), derived from the
// address a worker announces (its --metrics_address), so that traffic
// between hosts takes the network the operator named rather than every
// interface UCX finds.

#include <string>

#include "absl/status/statusor.h"

namespace cohort::comm {

struct NetInterface {
  std::string name;       // e.g. "eth0"
  bool loopback = false;  // IFF_LOOPBACK
};

// The interface holding IPv4 or IPv6 address `ip` (numeric). NotFound when
// no interface of this network namespace has it; InvalidArgument when `ip`
// is not a numeric address.
absl::StatusOr<NetInterface> InterfaceOf(const std::string& ip);

// The UCX_NET_DEVICES value for `setting` (a worker's --ucx_net_devices):
// "auto" -> the interface of `announced_host` (the host part of the
// announced address) unless it is loopback or not local ("": UCX's
// choice); "all" -> ""; anything else is taken as UCX's own list.
std::string ResolveNetDevices(const std::string& setting, const std::string& announced_host);

}  // namespace cohort::comm
