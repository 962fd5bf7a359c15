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
};

// At most this many steps a list (the newest ones a node holds).
constexpr size_t kMaxResumeSteps = 32;

// The key-value encoding ({"parts": bool, "steps": [...]}), and its decode
// boundary: the value comes from the coordinator's store, which any
// observer may write, so anything but an object of those two keys (steps
// distinct, above 0, at most kMaxResumeSteps, none for a node of no parts)
// is Corruption naming the node and what is allowed.
std::string EncodeNodeSteps(const NodeSteps& steps);
Result<NodeSteps> DecodeNodeSteps(std::string_view value, const std::string& node);

// The newest step in the list of every node with parts; 0 when there is
// none (or no node has parts).
uint64_t NewestCommonStep(const std::vector<NodeSteps>& nodes);

// "150, 100" (no parts: "any step ..."); over nodes "a: 150, 100; b: 100".
std::string DescribeSteps(const NodeSteps& steps);
std::string DescribeNodeSteps(const std::vector<std::string>& names,
                              const std::vector<NodeSteps>& nodes);

}  // namespace gridsync::launch_detail
