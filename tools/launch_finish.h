// How `gridsync launch` (tools/launch.h) ends, apart from its children
// failing: the interrupts that stop it and the exit code they give, the
// wait for the other nodes' launchers when a job spans machines, and the
// run's summary from worker 0's last line. Apart from launch.cc, whose one
// long function decides when each of these applies.
//
// Thread safety: the launcher's one thread, but the signal handler
// CatchInterrupts installs, which only stores g_interrupted (a volatile
// sig_atomic_t, as a handler may write), and WaitForOtherNodes' barrier,
// which runs on a thread of its own while the launcher's streams output.
#pragma once

#include <signal.h>

#include <string>
#include <vector>

#include "common/config.h"
#include "tools/launch_children.h"

namespace gridsync::launch_detail {

// The signal that interrupted the launcher (0: none); it exits 128 + it,
// the shell's convention (130 for Ctrl-C, 129 for a closed terminal).
extern volatile sig_atomic_t g_interrupted;

// Installs a handler that records SIGINT, SIGTERM and SIGHUP in
// g_interrupted. A closed terminal stops the cluster the way Ctrl-C does
// (its children start with SIGHUP blocked: launch_children.cc), instead of
// leaving them behind.
void CatchInterrupts();

// The launcher's exit on an interrupt: says so, naming the signal and
// `when`, and returns 128 + the signal (the shell's convention).
int InterruptedExit(const char* when);

// The run's summary, from worker 0's JSON summary line (nothing if it left
// none).
void PrintSummary(const Child& worker0, const Config& config);

// The "launch/done" barrier of every node's launcher, with this node's
// children's output still streamed while it waits. Returns the exit code.
int WaitForOtherNodes(const Config& config, const std::string& node, std::vector<Child>& children);

}  // namespace gridsync::launch_detail
