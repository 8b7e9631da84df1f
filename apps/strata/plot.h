// apps/strata/plot.h: runs bench/plot.py (matplotlib, in strata's Python venv) on a result JSON.
#pragma once
#include <string>
#include <vector>

namespace strata::app {

// The Python to use: $STRATA_PYTHON, else $STRATA_HOME/venv/bin/python (STRATA_HOME defaults to
// ~/.cache/strata).
std::string plot_python();

// The plot script: $STRATA_PLOT_SCRIPT, else <source dir>/bench/plot.py.
std::string plot_script();

// <source dir>/bench/<name> (e.g. "plot_convert.py"); $STRATA_PLOT_SCRIPT does not apply.
std::string plot_script_path(const std::string& name);

// Runs `python script args...` (no shell). Returns true on exit status 0; otherwise false and a
// one-line reason in *why (no Python, no script, matplotlib missing (status 3), script failed).
bool run_python_script(const std::string& script, const std::vector<std::string>& args, std::string* why);

// Runs `python plot.py json_path png_path --quiet`. Returns true when the PNG was written; otherwise false
// and a one-line reason in *why (no Python, no script, matplotlib missing, script failed).
bool run_plot(const std::string& json_path, const std::string& png_path, std::string* why);

}  // namespace strata::app
