#pragma once
// NetnsHosts: a multi-host test network on one machine. Each "host" is a
// Linux network namespace with its own address on a bridge that this object
// makes (a link-local 169.254.K.0/24 of its own: traffic goes only to
// namespaces it made; the test process reaches them through the bridge's
// address, gateway()),
// so processes started in different hosts talk over real network stacks and
// links that can be slowed (tc tbf) or cut (blackhole routes, a link taken
// down) while they run.
//
// Everything it makes carries a name derived from this process's pid
// ("cn<pid>-<host>" namespaces, "cb<pid>" bridge, "cv<pid>h<host>" links), is
// removed by the destructor, also when a test fails, and is swept by a later
// Create if this process died before it could.
//
// Needs root (CAP_NET_ADMIN) and iproute2: Create says Unavailable
// otherwise, so a test can skip with the reason.
//
// Thread-compatible.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace cohort::testing {

class NetnsHosts {
 public:
  // `hosts` namespaces (at most 200) on a fresh bridge. Unavailable when
  // namespaces cannot be made here (not root, no iproute2); Internal when a
  // command fails (its output in the message); what was made is removed.
  static absl::StatusOr<std::unique_ptr<NetnsHosts>> Create(int hosts);
  ~NetnsHosts();
  NetnsHosts(const NetnsHosts&) = delete;
  NetnsHosts& operator=(const NetnsHosts&) = delete;

  int size() const { return hosts_; }
  // Host `host`'s namespace name and IPv4 address.
  std::string ns(int host) const;
  std::string address(int host) const;
  // The bridge's address in the test's own namespace (169.254.K.254).
  std::string gateway() const;
  // `binary args...` run inside host `host`'s namespace: the program and
  // arguments to give Subprocess or RunCommand. (`ip netns exec` execs the
  // binary, so the process id is the program's own.)
  std::pair<std::string, std::vector<std::string>> Command(int host, const std::string& binary,
                                                           std::vector<std::string> args) const;

  // Limits what host `host` sends and receives to `bits_per_second` (a
  // token bucket on both ends of its link); 0 removes the limit.
  absl::Status LimitRate(int host, int64_t bits_per_second);
  // Host `from` can no longer send to host `to` (a blackhole route in
  // `from`: its sends fail at once); traffic from `to` still arrives.
  absl::Status Cut(int from, int to);
  absl::Status Heal(int from, int to);
  // Bytes through host `host`'s link so far, both directions (0 if it
  // cannot be read).
  uint64_t LinkBytes(int host) const;
  // Takes host `host`'s link down (silence both ways) or up again (then
  // every host forgets the neighbours it found unreachable meanwhile).
  absl::Status SetLinkUp(int host, bool up);

  // Removes namespaces, links and bridges left by processes that no longer
  // run (a test killed before its destructor ran).
  static void SweepStale();

 private:
  explicit NetnsHosts(int hosts, int subnet);
  absl::Status Make();
  void Remove();
  std::string link(int host) const;  // the bridge side of host `host`'s link

  const int hosts_;
  const int subnet_;  // K of 169.254.K.0/24
  const int64_t id_;  // this process's pid
};

}  // namespace cohort::testing
