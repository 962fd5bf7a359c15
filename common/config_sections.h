// The readers of the config's sections, for Config::Parse (config.cc):
// one per top-level JSON object (encoding, network, distributed, training,
// task, ps, compression, checkpoint, metrics, security). Each reads its
// keys with their bounds into the Config, records every problem (never
// stopping at the first), and refuses a key that does nothing given the
// other keys: checks relating two keys run only when both read well, so
// one typo does not cascade.
//
// Thread safety: functions of their arguments only.
#pragma once

#include "common/config.h"
#include "common/config_reader.h"

namespace gridsync::config_sections {

// Reads every section of `top` (the document's top-level object) into
// *config, in an order where each reader finds the sections it depends on
// already read (checkpoint: task.output; metrics: distributed and ps).
// Keys of `top` that no section claims are left for the caller to report.
void ReadSections(config_reader::SectionReader* top, config_reader::Problems* problems,
                  Config* config);

}  // namespace gridsync::config_sections
