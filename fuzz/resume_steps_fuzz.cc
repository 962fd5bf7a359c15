// libFuzzer target: what a `gridsync launch --resume --node` launcher reads
// from the coordinator's store as another node's steps
// (tools/resume_steps.h), and as its verdict: any value is refused or
// decodes into what encodes back to a value that decodes the same.
// Input: the value, as the store holds it.
#include <cstdint>
#include <string>
#include <vector>

#include "tools/resume_steps.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using gridsync::launch_detail::DecodeNodeSteps;
  using gridsync::launch_detail::EncodeNodeSteps;
  using gridsync::launch_detail::NodeSteps;
  const std::string value(reinterpret_cast<const char*>(data), size);
  // The same value as the second round's verdict: refused, or it round-trips.
  auto verdict = gridsync::launch_detail::DecodeVerdict(value, "b");
  if (verdict.ok()) {
    auto back = gridsync::launch_detail::DecodeVerdict(
        gridsync::launch_detail::EncodeVerdict(*verdict), "b");
    if (!back.ok() || back->step != verdict->step || back->refused != verdict->refused ||
        verdict->refused < 0 || verdict->refused > 255)
      __builtin_trap();
  } else if (verdict.status().message().find("the launcher of node b published") ==
             std::string::npos) {
    __builtin_trap();
  }
  auto steps = DecodeNodeSteps(value, "b");
  if (!steps.ok()) {
    if (steps.status().message().find("the launcher of node b published") == std::string::npos)
      __builtin_trap();
    return 0;
  }
  if (steps->intact.size() > gridsync::launch_detail::kMaxResumeSteps) __builtin_trap();
  auto again = DecodeNodeSteps(EncodeNodeSteps(*steps), "b");
  if (!again.ok() || again->has_parts != steps->has_parts || again->intact != steps->intact ||
      again->damaged != steps->damaged)
    __builtin_trap();
  // The common step of it with itself is its newest.
  const std::vector<NodeSteps> both = {*steps, *steps};
  const uint64_t common = gridsync::launch_detail::NewestCommonStep(both);
  if (steps->has_parts && !steps->intact.empty() && common == 0) __builtin_trap();
  return 0;
}
