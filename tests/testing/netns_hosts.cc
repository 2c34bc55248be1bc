#include "tests/testing/netns_hosts.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <fstream>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"
#include "tests/testing/subprocess.h"

namespace cohort::testing {
namespace {

constexpr absl::Duration kCommandTimeout = absl::Seconds(20);
constexpr int kMaxHosts = 200;

// Runs `ip`/`tc` with `args`; Internal with the output when it fails.
absl::Status Run(const std::string& tool, const std::vector<std::string>& args) {
  absl::StatusOr<CommandResult> result = RunCommand(tool, args, kCommandTimeout);
  if (!result.ok()) return result.status();
  if (result->exit_code != 0) {
    return absl::InternalError(absl::StrCat(tool, " ", absl::StrJoin(args, " "), ": exit ",
                                            result->exit_code, ": ", result->output));
  }
  return absl::OkStatus();
}

// The same, ignoring failure (removing what may already be gone).
void RunQuietly(const std::string& tool, const std::vector<std::string>& args) {
  (void)RunCommand(tool, args, kCommandTimeout);
}

std::string NamespaceName(int64_t id, int host) { return absl::StrCat("cn", id, "-", host); }
std::string BridgeName(int64_t id) { return absl::StrCat("cb", id); }
std::string LinkName(int64_t id, int host) { return absl::StrCat("cv", id, "h", host); }

bool ProcessAlive(int64_t pid) {
  return pid > 0 && (::kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM);
}

// The pid in a name made by NetnsHosts ("cn<pid>-", "cb<pid>", "cv<pid>h"),
// or -1.
int64_t OwnerOf(absl::string_view name) {
  if (name.size() < 3 || name[0] != 'c' || (name[1] != 'n' && name[1] != 'b' && name[1] != 'v')) {
    return -1;
  }
  const absl::string_view rest = name.substr(2);
  const size_t end = std::min(rest.find_first_not_of("0123456789"), rest.size());
  int64_t pid = -1;
  if (end == 0 || !absl::SimpleAtoi(rest.substr(0, end), &pid)) return -1;
  const absl::string_view after = rest.substr(end);
  const bool shape = (name[1] == 'n' && absl::StartsWith(after, "-")) ||
                     (name[1] == 'b' && after.empty()) ||
                     (name[1] == 'v' && absl::StartsWith(after, "h"));
  return shape ? pid : -1;
}

}  // namespace

absl::StatusOr<std::unique_ptr<NetnsHosts>> NetnsHosts::Create(int hosts) {
  if (hosts < 1 || hosts > kMaxHosts) {
    return absl::InvalidArgumentError(absl::StrCat("NetnsHosts: hosts must be within [1, ",
                                                   kMaxHosts, "], got ", hosts));
  }
  if (::geteuid() != 0) {
    return absl::UnavailableError("network namespaces need root (CAP_NET_ADMIN)");
  }
  absl::StatusOr<CommandResult> ip = RunCommand("ip", {"-V"}, kCommandTimeout);
  if (!ip.ok() || ip->exit_code != 0) {
    return absl::UnavailableError("network namespaces need iproute2 (`ip`), which is missing");
  }
  // The subnet is chosen and the bridge given its address under a lock, so
  // concurrent tests never pick the same one.
  const int lock = ::open("/tmp/cohort-netns-hosts.lock", O_CREAT | O_RDWR | O_CLOEXEC, 0600);
  if (lock < 0 || ::flock(lock, LOCK_EX) != 0) {
    if (lock >= 0) ::close(lock);
    return absl::InternalError("NetnsHosts: cannot lock /tmp/cohort-netns-hosts.lock");
  }
  absl::Cleanup unlock = [lock] { ::close(lock); };
  SweepStale();
  absl::StatusOr<CommandResult> used = RunCommand("ip", {"-o", "-4", "addr", "show"}, kCommandTimeout);
  if (!used.ok()) return used.status();
  int subnet = -1;
  for (int i = 0; i < 254 && subnet < 0; ++i) {
    const int k = 1 + static_cast<int>((::getpid() + i) % 254);
    if (!absl::StrContains(used->output, absl::StrCat(" 169.254.", k, "."))) subnet = k;
  }
  if (subnet < 0) return absl::ResourceExhaustedError("NetnsHosts: every 169.254.K.0/24 is in use");
  std::unique_ptr<NetnsHosts> made(new NetnsHosts(hosts, subnet));
  if (absl::Status s = made->Make(); !s.ok()) {
    // A kernel without namespaces or veth says so on the first command.
    if (absl::StrContains(s.message(), "Operation not permitted") ||
        absl::StrContains(s.message(), "not supported")) {
      return absl::UnavailableError(absl::StrCat("network namespaces cannot be made here: ",
                                                 s.message()));
    }
    return s;  // the destructor removes what was made
  }
  return made;
}

NetnsHosts::NetnsHosts(int hosts, int subnet) : hosts_(hosts), subnet_(subnet), id_(::getpid()) {}

NetnsHosts::~NetnsHosts() { Remove(); }

std::string NetnsHosts::ns(int host) const { return NamespaceName(id_, host); }
std::string NetnsHosts::address(int host) const {
  return absl::StrCat("169.254.", subnet_, ".", host + 1);
}
std::string NetnsHosts::gateway() const { return absl::StrCat("169.254.", subnet_, ".254"); }
std::string NetnsHosts::link(int host) const { return LinkName(id_, host); }

std::pair<std::string, std::vector<std::string>> NetnsHosts::Command(
    int host, const std::string& binary, std::vector<std::string> args) const {
  std::vector<std::string> wrapped = {"netns", "exec", ns(host), binary};
  wrapped.insert(wrapped.end(), args.begin(), args.end());
  return {"ip", std::move(wrapped)};
}

absl::Status NetnsHosts::Make() {
  const std::string bridge = BridgeName(id_);
  if (absl::Status s = Run("ip", {"link", "add", bridge, "type", "bridge"}); !s.ok()) return s;
  if (absl::Status s = Run("ip", {"addr", "add", absl::StrCat(gateway(), "/24"), "dev", bridge});
      !s.ok()) {
    return s;
  }
  if (absl::Status s = Run("ip", {"link", "set", bridge, "up"}); !s.ok()) return s;
  for (int h = 0; h < hosts_; ++h) {
    const std::string name = ns(h);
    for (const std::vector<std::string>& step : std::vector<std::vector<std::string>>{
             {"netns", "add", name},
             {"link", "add", link(h), "type", "veth", "peer", "name", "eth0", "netns", name},
             {"link", "set", link(h), "master", bridge, "up"},
             {"-n", name, "addr", "add", absl::StrCat(address(h), "/24"), "dev", "eth0"},
             {"-n", name, "link", "set", "eth0", "up"},
             {"-n", name, "link", "set", "lo", "up"}}) {
      if (absl::Status s = Run("ip", step); !s.ok()) return s;
    }
  }
  return absl::OkStatus();
}

void NetnsHosts::Remove() {
  // Deleting one end of a veth pair deletes both, at once; a namespace's
  // own teardown is asynchronous.
  for (int h = 0; h < hosts_; ++h) {
    RunQuietly("ip", {"link", "del", link(h)});
    RunQuietly("ip", {"netns", "del", ns(h)});
  }
  RunQuietly("ip", {"link", "del", BridgeName(id_)});
}

void NetnsHosts::SweepStale() {
  absl::StatusOr<CommandResult> namespaces = RunCommand("ip", {"netns", "list"}, kCommandTimeout);
  if (namespaces.ok()) {
    for (absl::string_view line : absl::StrSplit(namespaces->output, '\n', absl::SkipEmpty())) {
      const std::string name(line.substr(0, line.find(' ')));
      const int64_t owner = OwnerOf(name);
      if (owner > 0 && !ProcessAlive(owner)) RunQuietly("ip", {"netns", "del", name});
    }
  }
  absl::StatusOr<CommandResult> links = RunCommand("ip", {"-o", "link", "show"}, kCommandTimeout);
  if (links.ok()) {
    // "7: cv123h0@if2: <...": the name is the second field, before any '@'.
    for (absl::string_view line : absl::StrSplit(links->output, '\n', absl::SkipEmpty())) {
      std::vector<absl::string_view> fields = absl::StrSplit(line, ' ', absl::SkipEmpty());
      if (fields.size() < 2) continue;
      absl::string_view name = fields[1];
      name = name.substr(0, std::min(name.find('@'), name.find(':')));
      const int64_t owner = OwnerOf(name);
      if (owner > 0 && name[1] != 'n' && !ProcessAlive(owner)) {
        RunQuietly("ip", {"link", "del", std::string(name)});
      }
    }
  }
}

absl::Status NetnsHosts::LimitRate(int host, int64_t bits_per_second) {
  if (host < 0 || host >= hosts_ || bits_per_second < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("LimitRate: host ", host, " of ", hosts_, ", rate ", bits_per_second));
  }
  // Both directions: the bridge side shapes what reaches the host, the
  // namespace side what it sends.
  const std::vector<std::vector<std::string>> devices = {{link(host)},
                                                         {"-n", ns(host), "eth0"}};
  for (const std::vector<std::string>& device : devices) {
    std::vector<std::string> args;
    if (device.size() == 3) args = {"-n", device[1]};
    const std::string& dev = device.back();
    if (bits_per_second == 0) {
      std::vector<std::string> del = args;
      del.insert(del.end(), {"qdisc", "del", "dev", dev, "root"});
      RunQuietly("tc", del);
      continue;
    }
    // A burst of at least 10 ms at the rate (the kernel's timer
    // granularity), and never below a few full-size frames.
    const int64_t burst = std::max<int64_t>(bits_per_second / 8 / 100, 64 << 10);
    args.insert(args.end(), {"qdisc", "replace", "dev", dev, "root", "tbf", "rate",
                             absl::StrCat(bits_per_second, "bit"), "burst",
                             absl::StrCat(burst), "latency", "100ms"});
    if (absl::Status s = Run("tc", args); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status NetnsHosts::Cut(int from, int to) {
  if (from < 0 || from >= hosts_ || to < 0 || to >= hosts_ || from == to) {
    return absl::InvalidArgumentError(absl::StrCat("Cut: hosts ", from, " -> ", to));
  }
  return Run("ip", {"-n", ns(from), "route", "add", "blackhole", absl::StrCat(address(to), "/32")});
}

absl::Status NetnsHosts::Heal(int from, int to) {
  if (from < 0 || from >= hosts_ || to < 0 || to >= hosts_ || from == to) {
    return absl::InvalidArgumentError(absl::StrCat("Heal: hosts ", from, " -> ", to));
  }
  return Run("ip", {"-n", ns(from), "route", "del", "blackhole", absl::StrCat(address(to), "/32")});
}

uint64_t NetnsHosts::LinkBytes(int host) const {
  uint64_t total = 0;
  for (const char* counter : {"rx_bytes", "tx_bytes"}) {
    std::ifstream in(absl::StrCat("/sys/class/net/", link(host), "/statistics/", counter));
    uint64_t value = 0;
    if (in >> value) total += value;
  }
  return total;
}

absl::Status NetnsHosts::SetLinkUp(int host, bool up) {
  if (host < 0 || host >= hosts_) {
    return absl::InvalidArgumentError(absl::StrCat("SetLinkUp: host ", host, " of ", hosts_));
  }
  RETURN_IF_ERROR(Run("ip", {"link", "set", link(host), up ? "up" : "down"}));
  if (up) {
    // Neighbours that failed to answer while the link was down are cached
    // as unreachable for a while ("No route to host"); a healed link should
    // carry traffic at once, as a real one does once those entries expire.
    for (int h = 0; h < hosts_; ++h) RunQuietly("ip", {"-n", ns(h), "neigh", "flush", "all"});
  }
  return absl::OkStatus();
}

}  // namespace cohort::testing
