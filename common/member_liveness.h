// When the coordinator may call a silent member dead.
//
// A member (shard, worker, launcher) speaks to the coordinator at least
// every MemberPingInterval: a shard's ping (gridsync-ps), a worker's peer
// check between steps (RunSpec's peer_check_every, at most 1 s) and its
// checks while it waits. The coordinator drops a member whose connection
// stays silent for dead_peer_after (TCP keepalive and TCP_USER_TIMEOUT,
// server/coordinator.h), and that silence counts from the member's last
// packet, which may come a whole ping interval before an outage begins;
// after the link's return, the member's pending request is resent within
// a second (common/tcp_backoff.h). With dead_peer_after = timeout_s, a
// probe's 4.4 s outage under timeout_s 5 ended the job: the worker had
// been silent since its last check. So dead_peer_after is timeout_s plus
// those two: an outage shorter than timeout_s never ends a membership,
// and a dead host still leaves the map within about 1.25 x timeout_s + 1 s.
//
// Thread safety: pure functions.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>

namespace gridsync {

// The longest gap between a member's requests to the coordinator for a
// cluster whose waits last `timeout`: a quarter of it, 0.25 to 5 s.
inline std::chrono::milliseconds MemberPingInterval(std::chrono::milliseconds timeout) {
  return std::clamp<std::chrono::milliseconds>(timeout / 4, std::chrono::milliseconds(250),
                                               std::chrono::seconds(5));
}

// The coordinator's dead_peer_after for `timeout` (distributed.timeout_s):
// timeout, a ping interval and the second a capped resend takes, rounded
// up to whole seconds (TCP keepalive counts in seconds).
inline std::chrono::seconds DeadPeerAfter(std::chrono::milliseconds timeout) {
  const auto silence = timeout + MemberPingInterval(timeout) + std::chrono::seconds(1);
  return std::chrono::ceil<std::chrono::seconds>(silence);
}

}  // namespace gridsync
