#pragma once
// cocodiff: multi-node Diffusion Transformer inference, emulated on one machine. The public
// API of an installed cocodiff: include this header, link cocodiff::api.
//
//   #include <cocodiff/cocodiff.hpp>
//
//   cocodiff::RunSpec spec;
//   spec.model = "flux1-tiny";
//   spec.cluster = "aurora";
//   spec.resolution = 256;
//   spec.steps = 2;
//   spec.strategy = "cocodiff";
//   const cocodiff::Plan plan = cocodiff::make_plan(spec);
//   const cocodiff::RunResult r = cocodiff::run(plan);
//   // r.virtual_time_s, r.bytes_by_tier, r.output_sha256, r.latent [C, F*H*W]
//
// The headers:
//   cocodiff/run.hpp     RunSpec -> Plan -> RunResult: a run described, resolved, emulated.
//   cocodiff/extend.hpp  Extensions (attention strategies), register_all_to_all,
//                        register_model_family: a program's own parts, named like built-ins.
// The internal headers installed beside them (core/, dit/, emulator/collectives/) are those
// extend.hpp needs: the types a strategy, a schedule or a model implements.

#include "cocodiff/extend.hpp"
#include "cocodiff/run.hpp"
