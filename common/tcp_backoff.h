// The retransmission backoff of a control-plane TCP connection.
//
// After a network outage, TCP resends unacknowledged data only when its
// retransmission timer fires, and that timer doubles with every try: from
// 0.2 s it reaches 6.4 s after five tries and 120 s at most. So a
// connection whose link came back after 7 s may stay silent until 12.6 s,
// and a peer that gives it `timeout_s` = 10 (TCP_USER_TIMEOUT, the
// coordinator's dead-peer detection) drops it though the network healed
// well within the time allowed. Linux 6.15 added TCP_RTO_MAX_MS, a per-socket
// cap on that timer: at 1 s, a healed link carries the data again within a
// second, and an outage is judged by its own length.
//
// A second is far above a datacenter's round trips; a link whose round
// trip nears a second would resend needlessly (the timer never goes below
// the measured round trip's estimate either way).
//
// The cap applies where the kernel has the option; an older kernel refuses
// it (ENOPROTOOPT), and the connection keeps the kernel's backoff. Where it
// applies: the coordinator's connections at both ends, the shards'
// accepted ZeroMQ connections and the workers' (each reported by a socket
// monitor with its descriptor), and Gloo's pairs once its mesh is up.
//
// Thread safety: free functions on a socket the caller owns.
#pragma once

#include <chrono>
#include <string>
#include <vector>

namespace gridsync {

// The cap for control-plane sockets: the smallest the kernel takes.
inline constexpr std::chrono::milliseconds kRetransmitBackoffCap{1000};

// Caps `fd`'s retransmission timer at `cap` (at least 1 s). Returns an
// empty string when it applied, else why not (the kernel's refusal), for a
// debug line: a kernel without the option is not an error.
std::string CapRetransmitBackoff(int fd, std::chrono::milliseconds cap = kRetransmitBackoffCap);

// Caps every TCP socket this process holds, for libraries that keep their
// descriptors private (Gloo's pairs): call it once their connections are
// made. Returns how many it capped.
int CapRetransmitBackoffOfOpenSockets(std::chrono::milliseconds cap = kRetransmitBackoffCap);

// The TCP sockets this process holds (their descriptors), from /proc.
std::vector<int> OpenTcpSockets();

// The cap now on `fd` in milliseconds, or -1 where the kernel has no
// such option (tests).
int RetransmitBackoffCapMs(int fd);

}  // namespace gridsync
