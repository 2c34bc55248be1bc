// Which interface carries an address, and what --ucx_net_devices resolves to.

#include "worker/comm/net_interface.h"

#include "gtest/gtest.h"

namespace cohort::comm {
namespace {

TEST(NetInterfaceTest, LoopbackIsFoundAndForeignOrBadAddressesAreNot) {
  absl::StatusOr<NetInterface> lo = InterfaceOf("127.0.0.1");
  ASSERT_TRUE(lo.ok()) << lo.status();
  EXPECT_TRUE(lo->loopback);
  EXPECT_FALSE(lo->name.empty());
  // TEST-NET-1 (RFC 5737): never on this machine.
  EXPECT_EQ(InterfaceOf("192.0.2.77").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(InterfaceOf("host1").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(NetInterfaceTest, AutoTakesTheAnnouncedAddressesInterfaceUnlessLoopback) {
  EXPECT_EQ(ResolveNetDevices("all", "127.0.0.1"), "");
  EXPECT_EQ(ResolveNetDevices("eth9,mlx5_0:1", "127.0.0.1"), "eth9,mlx5_0:1");
  EXPECT_EQ(ResolveNetDevices("auto", "127.0.0.1"), "") << "loopback: UCX's choice";
  EXPECT_EQ(ResolveNetDevices("auto", "192.0.2.77"), "") << "not local: UCX's choice";
  EXPECT_EQ(ResolveNetDevices("auto", "localhost"), "") << "a name: UCX's choice";
}

}  // namespace
}  // namespace cohort::comm
