// gridsync launch --resume when the job spans machines (--node on each):
// the step every machine's parts can resume from.
//
// Each machine's checkpoint.dir holds only the parts it runs (its shards,
// its workers holding state), so no launcher can find a step "every part
// holds" in its own folder: every resume across machines was refused with
// "no complete checkpoint". Here each launcher lists the steps its own
// parts hold complete and intact (CheckCheckpointPartIntact: manifest,
// size, checksum), publishes the list in the coordinator's key-value store
// (launch/resume/steps/<node>, as an observer), meets the other launchers
// at a barrier and reads their lists, and all of them take the newest step
// in every list. A step whose files are damaged on one machine is passed
// over by all, as a single launcher passes over it (that machine sets its
// damaged files aside, naming them), and the job resumes from the older
// step every machine holds intact. A second round (launch/resume/verdict)
// shares each launcher's own checks of that step, so that every machine
// starts or none does, with one exit code.
//
// Thread safety: the functions keep no state of their own; the exchanges
// block (up to distributed.timeout_s a round) and ResumeAcrossNodes runs
// them on a thread of its own while the launcher streams its children's
// output.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "common/checkpoint_files.h"
#include "common/config.h"
#include "common/status.h"
#include "tools/launch_children.h"
#include "tools/resume_steps.h"

namespace gridsync::launch_detail {

// What this machine's `parts` hold in `dir`: the newest kMaxResumeSteps
// steps whose folder has a manifest of every one of them, less those with
// a damaged file (Corruption), which go to `damaged` with the first damaged
// part and why. A file it may not read (not damage) leaves the step in: the
// part reports it at start, naming it.
// `keys`: as NewestIntactCompleteStep's (LaunchMacKeys: forged files are
// damage too).
// `memo`: as NewestIntactCompleteStep's.
NodeSteps FindLocalSteps(const std::string& dir, const std::vector<std::string>& parts,
                         std::vector<DamagedPart>* damaged, const PartMacKeys& keys = nullptr,
                         IntactMemo* memo = nullptr);

// The two rounds of the exchange through the coordinator (up to
// distributed.timeout_s each; the coordinator must be up, started by its
// node's launcher): every node's steps, then every node's verdict, in
// layout order. Each value is written, then every node's launcher meets at
// a barrier, then all are read: a value an earlier attempt left is never
// taken for this one's. A timeout quotes the coordinator's barrier (who
// came). `stop` (optional) is asked at least once a second; true ends the
// wait (IOError "stopped").
Status ExchangeResumeSteps(const Config& config, const std::string& node, const NodeSteps& mine,
                           std::vector<NodeSteps>* all,
                           const std::function<bool()>& stop = nullptr);
Status ExchangeVerdicts(const Config& config, const std::string& node, const ResumeVerdict& mine,
                        std::vector<ResumeVerdict>* all,
                        const std::function<bool()>& stop = nullptr);

// The whole of it for `gridsync launch --resume --node NODE`, once the
// coordinator runs (its node's launcher started it; `children` are this
// launcher's, whose output is streamed meanwhile): this machine's parts'
// steps, the first round, the agreed step's local checks (its parts' files
// of one run; steps left to train), the second round. Passes over, naming
// them, the steps some machine holds damaged or not at all, and once every
// node agreed sets this machine's damaged files of the steps passed over
// aside (<part>.bin.damaged). Returns 0 with *step set, or the exit code
// of a refusal printed on stderr, the same on every machine: 2 (no node
// holds a complete step), 3 (none every node holds intact, or parts of two
// runs), 1 (a launcher did not come, or disagreed), 128 + a signal.
int ResumeAcrossNodes(const Config& config, const std::string& node,
                      const std::vector<std::string>& local_parts, std::vector<Child>& children,
                      uint64_t* step);

}  // namespace gridsync::launch_detail
