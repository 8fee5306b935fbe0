// Each property's case body, one file per property (or family of properties), for the table in
// properties/properties.cpp. Declarations only: the table needs no more of the properties' code, and the
// files that define the bodies include this through properties/common.hpp.
#pragma once

#include <string>

namespace dpcheck {

struct Target;
struct CaseRecord;
struct CaseDraw;

void gradient_average_body(const Target& target, const CaseDraw& draw, CaseRecord& record);
void accumulation_body(const Target& target, const CaseDraw& draw, CaseRecord& record);
void uneven_body(const Target& target, const CaseDraw& draw, CaseRecord& record);
void replicas_body(const Target& target, const CaseDraw& draw, CaseRecord& record);
void overflow_body(const Target& target, const CaseDraw& draw, CaseRecord& record);
void sampler_body(const Target& target, const CaseDraw& draw, CaseRecord& record);
void rank0_writes_body(const Target& target, const CaseDraw& draw, CaseRecord& record);
std::string rank0_writes_unavailable(const Target& target);
void audit_writes_body(const Target& target, const CaseDraw& draw, CaseRecord& record);
void resume_body(const Target& target, const CaseDraw& draw, CaseRecord& record);
void optimizer_update_body(const Target& target, const CaseDraw& draw, CaseRecord& record);
void loss_body(const Target& target, const CaseDraw& draw, CaseRecord& record);
void any_order_body(const Target& target, const CaseDraw& draw, CaseRecord& record);
void bucketing_body(const Target& target, const CaseDraw& draw, CaseRecord& record);
void loss_scaler_body(const Target& target, const CaseDraw& draw, CaseRecord& record);
void lr_schedule_body(const Target& target, const CaseDraw& draw, CaseRecord& record);
void shuffle_body(const Target& target, const CaseDraw& draw, CaseRecord& record);
void tools_body(const Target& target, const CaseDraw& draw, CaseRecord& record);
void schedule_bound_body(const Target& target, const CaseDraw& draw, CaseRecord& record);
void conform_rows_body(const Target& target, const CaseDraw& draw, CaseRecord& record);
void plugin_abi_body(const Target& target, const CaseDraw& draw, CaseRecord& record);
void share_weights_body(const Target& target, const CaseDraw& draw, CaseRecord& record);

}  // namespace dpcheck
