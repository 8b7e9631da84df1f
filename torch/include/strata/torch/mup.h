// strata/torch/mup.h: muP-style training support for LibTorch models, as the structured-attention
// paper trains (Kuang et al., ICML 2025, section 3.5; the reference code's src/muP.py):
//
//   - every trainable parameter has a ROLE (MupRole): a hidden matrix, a residual branch's output
//     projection, the model's readout, a structured core, an input matrix (a read-in from data
//     features), a gain (LayerNorm weight), a bias, a token embedding or a position table;
//   - the role gives its init (hidden matrix, output projection and structured core N(0, 1/fan_in)
//     unless a std is given, readout N(0, 1/fan_in^2) (muP's readout rule), input and embedding
//     N(0, 0.02^2), position table 0, gain 1, bias 0) and its Adam learning rate: base_lr *
//     base_width / fan_in for the four width-fed matrix roles, base_lr for the others (the input
//     matrix's fan_in is the data's width, which does not grow with the model: the reference's
//     read-in, "fan_in 1");
//   - MupInit::zero_outputs: the reference's zero output projections and readout instead. At the
//     widths a CPU trains (64) they stalled in-context regression: with every residual branch
//     closed, the d = 8 case stayed at the zero predictor's error for 1,500 steps (issue 45);
//   - base_width: the width at which muP's learning rates equal one lr for every matrix (where SP
//     and muP coincide). The reference's 768 (GPT-2 small) gave every matrix of a 64-wide model 12x
//     the base lr, and such models did not learn (issue 45); strata's default is 128, the middle of
//     the widths a CPU trains (32-256);
//   - the standard parameterisation beside it (sp_init_: PyTorch's own init of each role, one lr);
//   - AdamW with betas (0.9, 0.95), eps 1e-20 (sic, the reference's) and weight decay 0;
//   - the forward-time RMS cap of the structured cores (rms_cap below), applied by the modules
//     that own the cores (strata/torch/bilinear_attention.h).
//
// Roles are DECLARED, not guessed from names: a module implementing MupDeclaring lists roles for
// parameters of its subtree (relative dotted names, e.g. "out_proj.weight" or "lm_head.weight");
// a declaration by an ancestor overrides one by a descendant. Undeclared parameters of
// torch::nn::Linear (weight: hidden matrix with fan_in = in_features, bias: bias),
// torch::nn::Embedding (embedding) and torch::nn::LayerNorm (gain, bias) get those defaults;
// any other undeclared trainable parameter is an error naming it.
#pragma once
#include <ATen/ATen.h>
#include <torch/nn/module.h>
#include <torch/optim/adamw.h>

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace strata::torch {

enum class MupKind { Hidden, Output, Readout, StructuredCore, Gain, Bias, Embedding, Position, Input };

// The muP base width strata uses unless told (MupOptions::base_width, train.base_width).
constexpr double kDefaultBaseWidth = 128;

// "hidden", "output", "readout", "structured_core", "gain", "bias", "embedding", "position", "input".
const char* mup_kind_name(MupKind k);

struct MupRole {
  MupKind kind = MupKind::Hidden;
  int64_t fan_in = 1;   // the matrix roles' fan-in (1 for the others)
  double init_std = 0;  // hidden / structured core / embedding: the init std (0 = the rule's)

  // A hidden matrix (q/k/v, MLP-in): init N(0, 1/fan_in), lr base_lr * base_width / fan_in.
  static MupRole hidden(int64_t fan_in) { return {MupKind::Hidden, fan_in, 0}; }
  // A residual branch's output projection (attention / MLP out-proj): init N(0, 1/fan_in) (0 with
  // MupInit::zero_outputs); lr as hidden.
  static MupRole output(int64_t fan_in) { return {MupKind::Output, fan_in, 0}; }
  // The model's readout (LM head, ICR read-out, forecast head): init N(0, 1/fan_in^2) (0 with
  // MupInit::zero_outputs); lr as hidden.
  static MupRole readout(int64_t fan_in) { return {MupKind::Readout, fan_in, 0}; }
  // A structured core (BTT, bilinear-MLR blocks): init N(0, std^2) (std 0 = 1/sqrt(fan_in)), lr
  // as hidden. Its owner applies rms_cap in the forward.
  static MupRole structured_core(int64_t fan_in, double std = 0) { return {MupKind::StructuredCore, fan_in, std}; }
  static MupRole gain() { return {MupKind::Gain, 1, 0}; }  // LayerNorm weight: init 1, lr base_lr
  static MupRole bias() { return {MupKind::Bias, 1, 0}; }  // init 0, lr base_lr
  // A lookup table (token / position embedding): init N(0, std^2), std 0.02 by default; lr base_lr.
  static MupRole embedding(double std = 0.02) { return {MupKind::Embedding, 1, std}; }
  // A learned position table: init 0 in both parameterisations, lr base_lr. Random rows (torch's
  // N(0, 1), or 0.02 beside a 0.02 read-in) add noise as large as the tokens' signal; zero rows
  // learn positions from the gradient (issue 45: ICR d = 8 reached 0.27 of the zero predictor's
  // error at zero, 0.33 at N(0, 0.02^2), 1.00 at N(0, 1)).
  static MupRole position() { return {MupKind::Position, 1, 0}; }
  // An input matrix from fan_in data features (the ICR read-in): init N(0, std^2), std 0.02 by
  // default (the reference's); lr base_lr (its fan_in does not scale with the model's width). The
  // fan_in is kept for the standard parameterisation's init.
  static MupRole input(int64_t fan_in, double std = 0.02) { return {MupKind::Input, fan_in, std}; }

  bool is_matrix() const {
    return kind == MupKind::Hidden || kind == MupKind::Output || kind == MupKind::Readout ||
           kind == MupKind::StructuredCore;
  }
  // The std mup_init_ draws with (0 for the constant inits).
  double resolved_std() const;
  // lr = base_lr * base_width / fan_in for the matrix roles, base_lr otherwise.
  double lr(double base_lr, double base_width) const;
};

// The two parameterisations a trainer offers (train.param).
enum class Parameterization { sp, mup };

// The interface by which a module declares roles (see the file comment). Names are relative to
// the module, dotted through submodules; each must name a parameter of the module's subtree.
class MupDeclaring {
 public:
  virtual ~MupDeclaring() = default;
  virtual std::vector<std::pair<std::string, MupRole>> mup_roles() const = 0;
};

// A trainable parameter with its resolved role; name as model.named_parameters() spells it.
struct MupParam {
  std::string name;
  at::Tensor param;
  MupRole role;
};

// Every trainable (requires_grad) parameter of model, once each (tied tensors: the first name),
// in named_parameters() order, with its role. Throws strata::Error naming a parameter with no
// role, a declaration naming no parameter, or a role with fan_in < 1.
std::vector<MupParam> mup_params(const ::torch::nn::Module& model);

// The choices of mup_init_ beyond the roles.
struct MupInit {
  bool zero_outputs = false;  // output projections and readout 0 (the reference's), not random
};

// Initialises every trainable parameter by its role (under NoGradGuard); `gen`: the generator of
// the normal draws (default: torch's).
void mup_init_(::torch::nn::Module& model, std::optional<at::Generator> gen = std::nullopt, MupInit opt = {});

// The standard parameterisation's init, by role: what PyTorch's own modules draw (every matrix
// role but the structured core, as torch.nn.Linear: U(-1/sqrt(fan_in), 1/sqrt(fan_in)); embeddings
// as torch.nn.Embedding: N(0, 1); gains 1; biases 0), structured cores as mup_init_ (they have no
// PyTorch default: the paper's rule), position tables 0 (MupRole::position). With one learning rate for every parameter this is what a
// plain PyTorch model of the same modules trains as.
void sp_init_(::torch::nn::Module& model, std::optional<at::Generator> gen = std::nullopt);

// mup_init_ (with `opt`) or sp_init_.
void init_(::torch::nn::Module& model, Parameterization p, std::optional<at::Generator> gen = std::nullopt,
           MupInit opt = {});

struct MupOptions {
  double base_width = kDefaultBaseWidth;  // lr = base_lr * base_width / fan_in for matrices
  double weight_decay = 0;  // applied to parameters of 2 or more dims (as the reference), 0 to the rest
  double beta1 = 0.9, beta2 = 0.95, eps = 1e-20;
};

// One optimizer group: the parameters sharing a learning rate and weight decay.
struct MupParamGroup {
  std::vector<std::string> names;
  std::vector<at::Tensor> params;
  double lr = 0, weight_decay = 0;
};

// The parameter groups of model for base learning rate base_lr (eta), one per distinct (lr,
// weight decay), in order of first appearance.
std::vector<MupParamGroup> mup_param_groups(const ::torch::nn::Module& model, double base_lr,
                                            const MupOptions& opt = {});

// AdamW over mup_param_groups(model, base_lr, opt): each group with its lr and weight decay,
// betas (beta1, beta2), eps.
std::unique_ptr<::torch::optim::AdamW> mup_adamw(const ::torch::nn::Module& model, double base_lr,
                                                 const MupOptions& opt = {});

// The forward-time RMS cap of a structured core w (any shape) whose matrix maps d_in to d_out:
//   w / max(1, RMS(w) / sigma*),  RMS(w) = sqrt(mean(w^2) + 1e-8),  sigma* = sqrt(min(d_in, d_out)) / d_in,
// differentiable (through RMS(w) when capped, as the reference's). Throws naming d_in / d_out < 1.
at::Tensor rms_cap(const at::Tensor& w, int64_t d_in, int64_t d_out);
// sigma* above.
double rms_cap_sigma(int64_t d_in, int64_t d_out);

}  // namespace strata::torch
