// apps/strata/convert.h: `strata convert`: the zero-shot conversion evaluation of
// models/conversion.h (all-MiniLM-L6-v2 with its attention swapped, scored on STS-B and on
// long-passage fidelity against attention FLOPs), printed as a table while it runs, then written
// to <out>/convert.json and plotted to convert.png.
#pragma once
#include <string>

#include "models/conversion.h"

namespace strata::app {

// Runs models::run_conversion, printing the table row by row and the targets, then writes
// <out_dir>/convert.json (atomically) and, when `plot`, convert.png. The output folder is checked
// before any work (strata::Error naming '--out'); model and data errors say how to get them.
models::ConversionReport convert_and_report(const models::ConversionConfig& cfg, const std::string& out_dir,
                                            bool plot);

}  // namespace strata::app
