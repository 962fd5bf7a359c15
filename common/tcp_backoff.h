// The retransmission backoff of the coordinator's, Gloo's and the data
// plane's TCP connections.
//
// After a network outage, TCP resends unacknowledged data only when its
// retransmission timer fires, and that timer doubles with every try: from
// 0.2 s it reaches 6.4 s after five tries and 120 s at most. The
// coordinator drops a member whose connection leaves data unacknowledged
// for `dead_peer_after` (TCP_USER_TIMEOUT, `distributed.timeout_s`): with
// a reply in flight when a 7 s outage began, the resend after the link's
// return came at 12.6 s, and a coordinator given 10 s dropped a member
// whose network had healed. Linux 6.15 added TCP_RTO_MAX_MS, a per-socket
// cap on that timer: at 1 s, a healed link carries the data again within a
// second, and an outage is judged by its own length.
//
// The cap also shortens when TCP gives up. Without TCP_USER_TIMEOUT the
// kernel gives up after tcp_retries2 resends modelled on the capped timer:
// 14.4 s instead of 924.6 s. So a socket capped here that has no user
// timeout gets one equal to the uncapped model's: when TCP resends
// changes, not when it gives up. One limit stays: a peer whose receive
// window was zero when the outage began is probed tcp_retries2 times on the
// capped timer, so the connection ends after about 13 s of such an outage
// (a member that does not read its replies; the coordinator's members
// always do).
//
// Gloo's pairs (the `nccl` mode's all-reduce between nodes on CPU hosts)
// are capped too, at RetransmitCapFor(timeout_s): a collective's wait ends
// at timeout_s with no second chance, and with the kernel's backoff a 4.4 s
// outage under timeout_s 5 resumed after the wait had ended (the job
// failed). The cap grows with timeout_s (a twelfth of it, at least 1 s) so
// that a zero window's probes still last past timeout_s (13.4 s at 1 s,
// 30.5 s at 2.5 s for timeout_s 30). The data plane's (ZeroMQ's)
// connections get the same cap: a shard caps each connection it accepts
// (wire::ConnectionLimits::retransmit_cap, from its monitor's accept event)
// and a worker each it makes (PsClient, from the connect event, at its
// next wait). With the kernel's backoff, a link that flapped (1.5 s down,
// 1 s up, six times, each outage well under timeout_s 5) left them on a
// 6.5 s timer after the link was back, and the waits ran out even with
// the worker's second wait for a shard the coordinator still lists.
//
// A second is far above a datacenter's round trips; a link whose round
// trip nears a second would resend needlessly.
//
// The cap applies where the kernel has the option; an older kernel refuses
// it (ENOPROTOOPT), and the connection keeps the kernel's backoff.
//
// Thread safety: free functions. Any descriptor may be passed: one that is
// not a TCP socket gets the kernel's refusal, as text.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace gridsync {

// The coordinator's cap: the smallest the kernel takes.
inline constexpr std::chrono::milliseconds kRetransmitBackoffCap{1000};

// The cap for connections whose waits last `timeout`: a twelfth of it, at
// least 1 s, so that tcp_retries2 (15) probes of a zero window outlast it.
std::chrono::milliseconds RetransmitCapFor(std::chrono::milliseconds timeout);

// Caps `fd`'s retransmission timer at `cap` (1 to 120 s) and, when it has
// no TCP_USER_TIMEOUT, sets one to UncappedGiveUp(). Returns an empty
// string when both applied, else why not, for a debug line: a kernel
// without the option is not an error.
std::string CapRetransmitBackoff(int fd, std::chrono::milliseconds cap = kRetransmitBackoffCap);

// This process's TCP sockets: descriptor and socket inode (an inode names
// one socket, where a descriptor number is reused), from /proc.
struct OpenTcpSocket {
  int fd = -1;
  uint64_t inode = 0;
};
std::vector<OpenTcpSocket> OpenTcpSockets();

// When the kernel gives up on a connection with no TCP_USER_TIMEOUT and
// the default timer (0.2 s doubling to 120 s), after `retries` resends
// (tcp_retries2; 15 by default: 924.6 s), as tcp_model_timeout computes it.
std::chrono::milliseconds UncappedGiveUp(int retries);
// The same for this host's tcp_retries2 (15 when it cannot be read), read
// on the first call.
std::chrono::milliseconds UncappedGiveUp();

// The cap now on `fd` in milliseconds, or -1 where the kernel has no such
// option or `fd` is no TCP socket (tests).
int RetransmitBackoffCapMs(int fd);

}  // namespace gridsync
