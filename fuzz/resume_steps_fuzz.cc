// libFuzzer target: what a `gridsync launch --resume --node` launcher reads
// from the coordinator's store as another node's steps
// (tools/resume_steps.h): any value is refused or decodes into a list that
// encodes back to a value that decodes to the same list.
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
  auto steps = DecodeNodeSteps(value, "b");
  if (!steps.ok()) {
    if (steps.status().message().find("the launcher of node b published") == std::string::npos)
      __builtin_trap();
    return 0;
  }
  if (steps->intact.size() > gridsync::launch_detail::kMaxResumeSteps) __builtin_trap();
  auto again = DecodeNodeSteps(EncodeNodeSteps(*steps), "b");
  if (!again.ok() || again->has_parts != steps->has_parts || again->intact != steps->intact)
    __builtin_trap();
  // The common step of it with itself is its newest.
  const std::vector<NodeSteps> both = {*steps, *steps};
  const uint64_t common = gridsync::launch_detail::NewestCommonStep(both);
  if (steps->has_parts && !steps->intact.empty() && common == 0) __builtin_trap();
  return 0;
}
