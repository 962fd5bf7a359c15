// The lists of checkpoint steps that `gridsync launch --resume --node`
// launchers exchange through the coordinator (tools/launch_resume.h): what
// one node's parts can resume from, its encoding in the key-value store,
// the one decode boundary for what another launcher (or anyone who may
// write the store) published, and the newest step common to every node.
// Kept apart from the launcher so that a fuzz target links it alone.
//
// Thread safety: pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace gridsync::launch_detail {

// The steps one node's parts can resume from.
struct NodeSteps {
  // False: the node runs no part that checkpoints (workers holding no state,
  // no shard), so any step serves it.
  bool has_parts = false;
  std::vector<uint64_t> intact;  // newest first, distinct
  // Some step its parts hold was passed over as damaged.
  bool damaged = false;
};

// What a launcher decided once it saw every list: the step it would resume
// from (0: none) and its refusal's exit code (0: none). The second round
// of the exchange, so that every machine starts, or none does, with the
// same exit code.
struct ResumeVerdict {
  uint64_t step = 0;
  int refused = 0;
};

// At most this many steps a list (the newest ones a node holds).
constexpr size_t kMaxResumeSteps = 32;

// The key-value encodings ({"parts": bool, "steps": [...], "damaged":
// bool}; {"step": n, "refused": code}), and their decode boundaries: the
// values come from the coordinator's store, which any observer may write,
// so anything but an object of exactly those keys (steps distinct, above
// 0, at most kMaxResumeSteps, none and no damage for a node of no parts;
// an exit code 0..255) is Corruption naming the node and what is allowed.
std::string EncodeNodeSteps(const NodeSteps& steps);
Result<NodeSteps> DecodeNodeSteps(std::string_view value, const std::string& node);
std::string EncodeVerdict(const ResumeVerdict& verdict);
Result<ResumeVerdict> DecodeVerdict(std::string_view value, const std::string& node);

// The newest step in the list of every node with parts; 0 when there is
// none (or no node has parts).
uint64_t NewestCommonStep(const std::vector<NodeSteps>& nodes);

// "150, 100" (no parts: "any step ..."); over nodes "a: 150, 100; b: 100".
std::string DescribeSteps(const NodeSteps& steps);
std::string DescribeNodeSteps(const std::vector<std::string>& names,
                              const std::vector<NodeSteps>& nodes);

}  // namespace gridsync::launch_detail
