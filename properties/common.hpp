// What the property files share (internal to properties/), beside what every check shares
// (verdict/verdict.hpp): the scenario space a target draws from, scratch directories,
// and the shared part of the checks (step_check_body); implemented in common.cpp.
// The case bodies themselves are declared in properties/bodies.hpp.
#pragma once

#include <filesystem>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "properties/bodies.hpp"
#include "properties/properties.hpp"
#include "verdict/verdict.hpp"

namespace dpcheck {

// The ranks whose part this call of a rank function plays: its own, or every rank of a simulated world
// (src/comm/simulated_comm.hpp), where one replica stands for them all.
std::vector<int> ranks_played(Communicator& comm);

// The scenarios a target's cases draw from: its fixed world size, if any, and its communicator's
// algorithm thresholds.
ScenarioSpace space_for(const Target& target, const CaseDraw& draw);

CaseRecord::Size size_of(const Scenario& s);

// The scale class (ScenarioSpace::scale_worlds, scale_one_in in properties.hpp) for a property whose
// promise holds on simulated ranks.
void add_scale_class(ScenarioSpace& space, const Target& target);
// The target a case runs on: the target itself, or for a case of the scale class the same target on
// simulated ranks, which give the local backend's bits at any N.
Target target_for_case(const Target& target, bool simulated);

// A fresh scratch directory that every rank can see: rank 0 creates it and, for processes, tells the
// others its name. In memory (/dev/shm) where allowed; not for an audited run, since /dev/shm is one
// of the paths any rank may write.
std::filesystem::path make_scratch(const Target& target, const std::string& what, bool in_memory = true);
void remove_scratch(const Target& target, const std::filesystem::path& dir);

// The body of a property whose check gives a StepOutcome: draws a scenario, runs the check, records its
// ratio and note, classifies the case, and fails it (agreed across processes) with the check's message,
// or `elsewhere` when only another rank saw the failure. With `scale`, its scenarios draw the scale class.
void step_check_body(const Target& target, const CaseDraw& draw, CaseRecord& record,
                     StepOutcome (*check)(const Scenario& scenario, const Target& target), const char* elsewhere,
                     void (*classify)(const Scenario& scenario) = nullptr, bool scale = false);

}  // namespace dpcheck
