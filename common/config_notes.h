// The notes of a loaded config (Config::notes): keys it sets that change
// nothing in the run it describes, said rather than refused, since one file
// runs every mode by a --set (configs/README.md, "noted"); and combinations
// known to train much worse. Split from config.cc, which reads and refuses.
//
// Thread safety: pure functions.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/config.h"

namespace gridsync {

// Keys of whole sections the run's mode does not read (the ps section
// under nccl, distributed.* and ps.* in one process), set in the text
// `root` to other values than their defaults.
std::vector<std::string> InertSectionNotes(const nlohmann::json& root, const DistributedConfig& d);

// Keys whose value the resolved config makes a no-op.
std::vector<std::string> InertValueNotes(const Config& c);

// Runnable combinations that train much worse than their neighbours, with
// the measurement and the way out (ps.optimizer "shard" with a sparsifying
// or sign codec). Said, not refused: a study of exactly that is a valid run.
std::vector<std::string> QualityNotes(const Config& c);

}  // namespace gridsync
